"""Transactional sends: a half message stays invisible until the producer commits it.

    transaction = await producer.send_in_transaction(Message("payments", b"..."))
    ... the local transaction (a database write, say) ...
    await transaction.commit()          # or: await transaction.rollback()

A producer that may stop between the send and the decision passes a ``checker``: when a
transaction stays open, the broker asks a producer of the topic, and the checker answers from
the application's own records (True: commit, False: roll back, None: not known yet; the
broker asks again later).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from .model import ReceivedMessage, SendReceipt

TransactionChecker = Callable[[ReceivedMessage], bool | None | Awaitable[bool | None]]
"""Decides an open transaction the broker asks about: True commits, False rolls back, None
leaves it open."""


class TransactionEnder(Protocol):
    """What ends a transaction: the producer that sent its half message."""

    async def end_transaction(self, topic: str, message_id: str, transaction_id: str,
                              commit: bool) -> None: ...


@dataclass(frozen=True)
class Transaction:
    """A half message sent and not decided yet; ``receipt`` says where it is held."""

    producer: TransactionEnder
    topic: str
    receipt: SendReceipt

    async def commit(self) -> None:
        """Deliver the message to consumers. NotFoundError when decided already."""
        await self.producer.end_transaction(self.topic, self.receipt.message_id,
                                            self.receipt.transaction_id, True)

    async def rollback(self) -> None:
        """Drop the message. NotFoundError when decided already."""
        await self.producer.end_transaction(self.topic, self.receipt.message_id,
                                            self.receipt.transaction_id, False)
