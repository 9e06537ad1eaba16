"""AMQP channel transactions: tx.select, tx.commit, tx.rollback, and the rule that a channel is
in confirm mode or transactional, never both (406, as RabbitMQ answers).

On a transactional channel, publishes and acks/nacks/rejects are held here as they are read,
not carried out; an ack of a delivery tag that is not outstanding (or already acked in the
transaction) is refused at once (406). tx.commit stores the held publishes together (one core
send, durable before commit-ok under ``sync`` flush; returns of unroutable mandatory ones go
out then) and then settles the held tags in order; tx.rollback drops both, so the deliveries
acked in the transaction stay unacked. A transaction holds at most `MAX_HELD_BYTES` of message bodies per
connection. Runs on the event loop.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from pamqp.base import Frame
from pamqp.commands import Basic, Confirm, Tx

from core.errors import PreconditionFailed

from .events import MethodReceived, PublishReceived
from .messages import Messages

MAX_HELD_BYTES: Final = 64 << 20
"""Message bytes the open transactions of one connection may hold before commit."""
_ACKS: Final = (Basic.Ack, Basic.Nack, Basic.Reject)


@dataclass(eq=False)
class _Held:
    """What one transactional channel has read since its last commit or rollback."""

    publishes: list[PublishReceived] = field(default_factory=list)
    acks: list[Frame] = field(default_factory=list)
    """One single-tag ack, nack or reject per delivery settled in the transaction."""
    tags: set[int] = field(default_factory=set)
    size: int = 0


class Transactions:
    """The transactional and confirming channels of one connection."""

    def __init__(self, messages: Messages) -> None:
        self.messages = messages
        self._held: dict[int, _Held] = {}
        self._confirming: set[int] = set()
        self._bytes = 0

    def transactional(self, channel: int) -> bool:
        return channel in self._held

    def hold(self, event: object) -> bool:
        """Keep ``event`` for the commit when it is a publish or an ack on a transactional
        channel; False for anything else. PreconditionFailed when the transaction is full."""
        if isinstance(event, PublishReceived):
            held = self._held.get(event.channel)
            if held is None:
                return False
            if self._bytes + len(event.body) > MAX_HELD_BYTES:
                raise PreconditionFailed(f"a transaction may hold at most {MAX_HELD_BYTES} "
                                         "bytes of messages per connection; commit sooner")
            held.publishes.append(event)
            held.size += len(event.body)
            self._bytes += len(event.body)
            return True
        if isinstance(event, MethodReceived) and isinstance(event.method, _ACKS):
            held = self._held.get(event.channel)
            if held is None:
                return False
            self._hold_ack(event.channel, event.method, held)
            return True
        return False

    def _hold_ack(self, channel: int, method: Basic.Ack | Basic.Nack | Basic.Reject,
                  held: _Held) -> None:
        """The tags ``method`` settles, each kept as its own ack (nack, reject), as RabbitMQ
        collects them at once: a later delivery is not covered by an earlier ``multiple``."""
        tag, multiple = method.delivery_tag, getattr(method, "multiple", False)
        outstanding = self.messages.unacked_tags(channel)
        if multiple:
            tags = sorted(t for t in outstanding if (t <= tag or tag == 0) and t not in held.tags)
        else:
            tags = [tag] if tag in outstanding and tag not in held.tags else []
        if not tags and (tag or not multiple):
            raise PreconditionFailed(f"unknown delivery tag {tag}")
        held.tags.update(tags)
        if isinstance(method, Basic.Ack):
            held.acks += [Basic.Ack(t) for t in tags]
        elif isinstance(method, Basic.Nack):
            held.acks += [Basic.Nack(t, False, method.requeue) for t in tags]
        else:
            held.acks += [Basic.Reject(t, method.requeue) for t in tags]

    def handles(self, method: Frame) -> bool:
        return isinstance(method, (Tx.Select, Tx.Commit, Tx.Rollback, Confirm.Select))

    async def answer(self, channel: int, method: Frame) -> Frame | None:
        """Carry out a tx method or confirm.select; its answer (None: sent already, or
        nowait)."""
        if isinstance(method, Confirm.Select):
            if channel in self._held:
                raise PreconditionFailed("cannot switch from tx to confirm mode")
            self._confirming.add(channel)
            return await self.messages.answer(channel, method)
        if isinstance(method, Tx.Select):
            if channel in self._confirming:
                raise PreconditionFailed("cannot switch from confirm to tx mode")
            self._held.setdefault(channel, _Held())
            return Tx.SelectOk()
        held = self._held.get(channel)
        if held is None:
            raise PreconditionFailed("channel is not transactional")
        self._held[channel] = _Held()
        self._bytes -= held.size
        if isinstance(method, Tx.Commit):
            await self._commit(channel, held)
            return Tx.CommitOk()
        return Tx.RollbackOk()

    async def _commit(self, channel: int, held: _Held) -> None:
        if held.publishes:
            await self.messages.publish(held.publishes)
        for ack in held.acks:
            if not self.messages.conn.accepts(channel):
                return  # the publishes failed and closed the channel: its deliveries go back
            await self.messages.answer(channel, ack)

    def closed(self) -> None:
        """The connection is gone: every open transaction is rolled back, its bodies freed at
        once rather than whenever the garbage collector gets to the closed connection."""
        self._held.clear()
        self._confirming.clear()
        self._bytes = 0

    def channel_closed(self, channel: int) -> None:
        """A closed channel's transaction is rolled back; a reopened one starts plain."""
        held = self._held.pop(channel, None)
        if held is not None:
            self._bytes -= held.size
        self._confirming.discard(channel)
