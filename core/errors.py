"""Protocol-neutral errors raised by core. Each adapter maps them to its wire codes in one table.

Every message says what went wrong and what the caller can do next.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

Code = TypeVar("Code")


class SluiceError(Exception):
    """Base of every error core raises on purpose."""


class InvalidArgument(SluiceError):
    """A request field is missing, empty, out of range or malformed."""


class BadFilter(InvalidArgument):
    """A filter expression does not parse."""


class MessageTooLarge(InvalidArgument):
    """A message body (or batch) exceeds the configured maximum size."""


class NotFound(SluiceError):
    """A named resource does not exist."""


class TopicNotFound(NotFound):
    """The topic does not exist."""

    def __init__(self, topic: str) -> None:
        super().__init__(f"topic {topic!r} does not exist; create it first "
                         f"(`sluice topic create {topic}`) or check the name")
        self.topic = topic


class GroupNotFound(NotFound):
    """The consumer group does not exist."""

    def __init__(self, group: str) -> None:
        super().__init__(f"consumer group {group!r} does not exist; create it "
                         f"(`sluice group create {group}`) or let a consumer's heartbeat create it")
        self.group = group


class UserNotFound(NotFound):
    """The user does not exist."""


class ClientNotFound(NotFound):
    """No client of that protocol and id is connected or has a kept session."""


class MessageNotFound(NotFound):
    """No message has the given id or key."""


class NotRecallable(NotFound):
    """No pending delayed message has the recall handle: it was delivered or recalled
    already, or the handle names none."""


class TransactionNotFound(NotFound):
    """No open transaction has the given id: it was committed, rolled back or discarded
    already, or the id names none."""


class AlreadyExists(SluiceError):
    """A resource with that name exists already."""


class PreconditionFailed(SluiceError):
    """A resource exists but differs from what the request assumes (AMQP 406: a queue or
    exchange redeclared with other settings, an if-unused delete of one in use)."""


class ResourceLocked(SluiceError):
    """Another connection holds the resource exclusively (AMQP 405: an exclusive queue)."""


class InvalidReceiptHandle(InvalidArgument):
    """A receipt handle is malformed, was issued for another group/topic, or was superseded."""


class ReceiptExpired(SluiceError):
    """The message's invisible duration ended before the ack; it was or will be redelivered."""


class OffsetOutOfRange(InvalidArgument):
    """A pull asked for an offset outside the queue's current range."""


class CorruptMessage(SluiceError):
    """A stored message failed its checks when read (CRC, framing): it is not delivered."""

    def __init__(self, topic: str, queue_id: int, offset: int, reason: str) -> None:
        super().__init__(f"the message at offset {offset} of queue {queue_id} of topic {topic!r} "
                         f"is corrupt on disk ({reason}) and is not delivered; the broker's log "
                         f"names the file: restore it from a replica or backup, or consume past "
                         f"it from offset {offset + 1}")
        self.topic = topic
        self.queue_id = queue_id
        self.offset = offset


class Unauthenticated(SluiceError):
    """Credentials are missing or wrong."""


class LoginThrottled(Unauthenticated):
    """A login refused without checking its credentials: its peer address, or that address
    with that user name, failed too often lately (``core.login_throttle``)."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
        """Seconds until the refusal ends, at least 1."""


class LoginBusy(Unauthenticated):
    """A login refused without checking its credentials because too many checks are waiting
    already (broker-wide, or from its peer address); retry shortly."""


class AccessDenied(SluiceError):
    """The authenticated user lacks the permission the request needs."""


class NotSupported(SluiceError):
    """The request asks for a feature this version of Sluice does not implement."""


class QuotaExceeded(SluiceError):
    """The broker cannot take this now: its disk is full or failing, or a limit on what one
    client may hold was reached. Nothing was stored; retry later or with less."""


class Unavailable(SluiceError):
    """The broker is shutting down or cannot serve the request right now; retry later."""


def nearest(table: Mapping[type[BaseException], Code], error: BaseException) -> Code | None:
    """The entry of an adapter's error table for ``error``: its class, else the nearest base along
    its MRO (so a new subclass of ``NotFound`` maps like ``NotFound``); None when none is listed.

    Every adapter keeps one such table, class to wire code, in its own ``errors.py``.
    """
    for cls in type(error).__mro__:
        if (found := table.get(cls)) is not None:
            return found
    return None
