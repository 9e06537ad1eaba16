"""What one AMQP channel holds for its messages: confirm tags, delivery tags, unacked
deliveries, prefetch limits, flow and its consumers. Plain state; no I/O."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pamqp.base import Frame
from pamqp.commands import Basic

from .consumer import Consumer


@dataclass(eq=False)
class Unacked:
    """A delivery not acked yet: the entry it is and the consumer it went to (none: a
    basic.get)."""

    queue: str
    """The named queue popped (the level, in a priority queue)."""
    offset: int
    consumer: Consumer | None
    stream: bool = False
    """Read from a stream: an ack only makes room, nothing is settled or requeued."""


@dataclass(eq=False)
class ChannelState:
    """What one channel holds: confirm tags, delivery tags and its consumers."""

    confirming: bool = False
    publish_tags: itertools.count = field(default_factory=lambda: itertools.count(1))
    outstanding: set[int] = field(default_factory=set)
    """Publish tags neither acked nor nacked yet."""
    delivery_tags: itertools.count = field(default_factory=lambda: itertools.count(1))
    unacked: dict[int, Unacked] = field(default_factory=dict)
    prefetch: int = 0
    """basic.qos (global false): the limit of each consumer of the channel."""
    global_prefetch: int = 0
    consumers: dict[str, Consumer] = field(default_factory=dict)
    flowing: bool = True
    """channel.flow: False holds back deliveries to the channel's consumers."""
    reply_address: str = ""
    """Where replies to this channel's direct reply-to consumer go (none: empty)."""
    reply_tag: str = ""
    """The consumer tag of that reply consumer."""

    def confirmed(self, tags: list[int], ok: bool) -> list[Frame]:
        """The acks (nacks) for ``tags``: one ``multiple`` when they are every outstanding tag
        up to the highest."""
        self.outstanding.difference_update(tags)
        if len(tags) > 1 and (not self.outstanding or min(self.outstanding) > max(tags)):
            top = max(tags)
            return [Basic.Ack(top, True) if ok else Basic.Nack(top, True, False)]
        return [Basic.Ack(tag) if ok else Basic.Nack(tag, False, False) for tag in tags]




class Channels(dict[int, ChannelState]):
    """The channels of one connection that have message state, by number."""

    def of(self, channel: int) -> ChannelState:
        """The state of ``channel``, made on first use."""
        state = self.get(channel)
        if state is None:
            state = self[channel] = ChannelState()
        return state
