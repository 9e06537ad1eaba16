"""The SDK's message types: what a producer sends and what a consumer receives. Plain data."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple


@dataclass(frozen=True)
class Message:
    """A message to send.

    ``message_group`` makes it a FIFO message (one group goes to one queue, in order);
    ``delivery_timestamp`` (ms since the epoch) makes it a delayed message; ``priority`` (0 or
    more, for a topic of message type PRIORITY) a priority message, higher delivered first;
    ``lite_topic`` (for a topic of message type LITE) names the ordered channel it belongs to.
    """

    topic: str
    body: bytes
    tag: str = ""
    keys: Sequence[str] = ()
    properties: Mapping[str, str] = field(default_factory=dict)
    message_group: str = ""
    delivery_timestamp: int = 0
    priority: int | None = None
    lite_topic: str = ""


@dataclass(frozen=True)
class SendReceipt:
    """Where the broker stored a sent message. A delayed message is held by the broker's
    timer until due: ``recall_handle`` cancels it until then (``Producer.recall``)."""

    message_id: str
    queue_id: int
    offset: int
    recall_handle: str = ""
    transaction_id: str = ""
    """A transactional send's (``Producer.send_in_transaction``)."""


@dataclass(slots=True)
class ReceivedMessage:
    """A message as a consumer receives it. Timestamps are ms since the epoch.

    ``receipt_handle`` is set for pop consumers (simple, push) and changes when the invisible
    duration is changed. Bodies unpacked from one packed batch share the record's ``offset``,
    ``message_id`` and ``properties`` (one dict) and differ by ``batch_index``.
    """

    topic: str
    queue_id: int
    offset: int
    message_id: str
    body: bytes
    tag: str = ""
    keys: tuple[str, ...] = ()
    properties: Mapping[str, str] = field(default_factory=dict)
    message_group: str = ""
    born_timestamp: int = 0
    store_timestamp: int = 0
    delivery_attempt: int = 1
    receipt_handle: str = ""
    batch_index: int = 0
    priority: int | None = None
    """A priority topic's messages carry their priority."""
    lite_topic: str = ""
    """Messages received through a lite subscription carry their lite topic."""


class TopicQueue(NamedTuple):
    """One queue of a topic."""

    topic: str
    queue_id: int


class Sql92(str):
    """A subscription filter in SQL92 over message properties (``TAGS`` is the tag), evaluated
    by the broker: ``{"orders": Sql92("region = 'eu' AND amount > 100")}``. A plain string in
    a subscription is a tag filter (``"*"`` or ``"TagA || TagB"``)."""

    __slots__ = ()

