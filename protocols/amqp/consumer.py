"""One basic.consume of an AMQP connection: pops (or, on a stream, reads) as many messages as
its prefetch window has room for, driven by callbacks (the queue's signal, an ack making room),
never a task per message. Its connection (``messages.Messages``) sends the deliveries; the
``consumers.Consumers`` registry says when it may take messages. A message whose subject an
access rule denies the connection's user is never delivered: dropped from a queue, skipped in
a stream. Runs on the event loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sized
from typing import Protocol

from pamqp.commands import Basic

from core.acl import Withheld
from core.errors import Unavailable
from core.history import HistoryPending
from core.model import Delivery
from core.queue_features import features, levels
from core.service import MAX_INVISIBLE_MS
from core.vhosts import QueueSettings

from .connection import ServerConnection
from .consumers import Consumers, consumer_priority
from .flow_control import WriteGate
from .queue_limits import QueueLimits

log = logging.getLogger(__name__)

MAX_POP = 256
"""Most messages one consumer takes from its queue per dispatch."""
RETRY_S = 1.0
"""How long a consumer whose queue the store cannot read now waits before it tries again."""


class Window(Protocol):
    """The channel's limits a consumer obeys (``channel_state.ChannelState``)."""

    prefetch: int
    global_prefetch: int
    unacked: Sized
    flowing: bool


class Owner(Protocol):
    """The connection a consumer delivers through (``messages.Messages``)."""

    conn: ServerConnection
    gate: WriteGate
    queues: QueueLimits
    consumers: Consumers

    def deliver(self, consumer: Consumer, delivery: Delivery) -> None: ...

    def withheld(self) -> Withheld | None:
        """What the access rules withhold from the connection's user now (``core.acl``)."""

    def write_out(self) -> None: ...

    def cancel_from_server(self, consumer: Consumer) -> None: ...


class Consumer:
    """One basic.consume: pops as many messages as its prefetch window has room for."""

    def __init__(self, owner: Owner, channel: int, state: Window, tag: str, vhost: str,
                 queue: QueueSettings, named: str, m: Basic.Consume) -> None:
        self.owner = owner
        self.channel = channel
        self.state = state
        self.tag = tag
        self.vhost = vhost
        self.queue_name = queue.name
        self.queue = named
        """The core named queue of the AMQP queue (its level 0, in a priority queue)."""
        kind = features(queue.arguments)
        self.levels = levels(self.queue, kind.max_priority)
        self.single_active = kind.single_active
        self.priority = consumer_priority(m.arguments)
        self.no_ack = m.no_ack
        self.exclusive = m.exclusive
        self.stream_offset: int | None = None
        """The next offset to read, for a consumer of a stream queue."""
        self.prefetch = state.prefetch
        self.unacked = 0
        self.active = True
        self._armed = False
        self._dispatching = False
        self._woken = False

    def room(self) -> int:
        """How many more messages this consumer may be handed now."""
        room = MAX_POP
        if self.no_ack:
            return room
        if self.prefetch:
            room = min(room, self.prefetch - self.unacked)
        if self.state.global_prefetch:
            room = min(room, self.state.global_prefetch - len(self.state.unacked))
        return room

    def has_room(self) -> bool:
        """Whether a message could go out to this consumer now."""
        return (self.active and self.room() > 0 and self.state.flowing and self.owner.gate.open
                and self.owner.conn.can_send(self.channel))

    def cancel_from_server(self) -> None:
        self.owner.cancel_from_server(self)

    def dispatch(self) -> None:
        """Deliver what the window has room for; wait for the queue's signal when it is empty."""
        if self._dispatching or not self.active:
            return
        self._dispatching = True
        try:
            self._dispatch()
        finally:
            self._dispatching = False

    def wake(self) -> None:
        """Dispatch once this event-loop iteration's work is done: the acks read together make
        room together, and one pop fills it."""
        if not self._woken:
            self._woken = True
            asyncio.get_running_loop().call_soon(self._wake)

    def _wake(self) -> None:
        self._woken = False
        self.dispatch()

    def _dispatch(self) -> None:
        owner = self.owner
        room = self.room()
        if room <= 0 or not self.state.flowing or not owner.conn.can_send(self.channel):
            return
        if not owner.gate.open:  # the client reads slowly: wait until the wire drains
            owner.gate.wait(self.dispatch)
            return
        withheld = owner.withheld()
        try:
            if self.stream_offset is not None:  # a stream: read on from this consumer's offset
                popped, self.stream_offset = owner.queues.read(self.queue, self.stream_offset, room)
                taken = len(popped)
                if withheld is not None:  # skipped for this reader; the stream keeps them
                    popped = [delivery for delivery in popped if not withheld(delivery)]
            elif not owner.consumers.may_take(self):  # single active, or higher priorities first
                if not self.single_active:
                    self._arm()
                return
            else:
                popped = owner.queues.pop_first(self.levels, room, MAX_INVISIBLE_MS,
                                                mark=not self.no_ack, withheld=withheld)
                taken = len(popped)
        except HistoryPending as pending:  # tiered history, fetched off the loop: go on when it is
            pending.ready.add_done_callback(lambda _: self.wake())
            return
        except Unavailable as error:  # the object store failed: try again in a while
            log.warning("consumer %s of queue %r waits for the store: %s", self.tag, self.queue, error)
            asyncio.get_running_loop().call_later(RETRY_S, self.wake)
            return
        for delivery in popped:
            owner.deliver(self, delivery)
        owner.write_out()
        if taken < room:
            self._arm()
        elif self.room() > 0:  # more may wait: taken after others had a turn
            asyncio.get_running_loop().call_soon(self.dispatch)
        else:
            owner.consumers.filled(self)

    def _arm(self) -> None:
        if not self._armed:
            self._armed = True
            self.owner.queues.signal_any(self.levels).add_done_callback(self._signalled)

    def _signalled(self, _: asyncio.Future[None]) -> None:
        self._armed = False
        self.dispatch()
