"""Shared subscriptions (``$share/<group>/<filter>``): message-level load balancing over core pop.

A group binds its filter to its own named queue, so its messages are stored once and kept while
every member is offline. Whenever the queue gets messages or a member gets room in its window,
``dispatch`` pops as many messages as the members can take and hands them out round-robin.
A popped message stays reserved for its member until acknowledged; when the member disconnects
it is released at once for the others, and after ``shared_invisible_ms`` without an ack it is
popped again. QoS 0 deliveries are settled when written. Members are sessions, known here
only as `Member`.

Runs on the event loop; not thread-safe.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Protocol

from core.model import Delivery
from core.named_queues import NamedQueues

from .mapping import now_ms
from .session_store import SubscriptionOptions
from .topics import shared_queue

MAX_POP = 256


class Member(Protocol):
    """What a group needs from a member session."""

    def shared_capacity(self) -> int:
        """How many QoS 1/2 messages the member can take now."""

    def send_shared(self, group: SharedGroup, delivery: Delivery,
                    options: SubscriptionOptions) -> None:
        """Deliver a message the group popped for this member (it settles or releases it)."""


class SharedGroup:
    """One shared subscription group: its queue and its member sessions."""

    def __init__(self, queues: NamedQueues, share: str, topic_filter: str,
                 invisible_ms: int) -> None:
        self.queues = queues
        self.share = share
        self.topic_filter = topic_filter
        self.queue = shared_queue(share, topic_filter)
        self.invisible_ms = invisible_ms
        self.members: dict[Member, SubscriptionOptions] = {}
        self._rotation = itertools.count()
        self._armed = False
        self._timer: asyncio.TimerHandle | None = None
        self._dispatching = False

    def add_member(self, session: Member, options: SubscriptionOptions) -> None:
        if not self.members:
            self.queues.bind(self.topic_filter, self.queue)
        self.members[session] = options
        self.dispatch()

    def remove_member(self, session: Member) -> None:
        """Drop a member; the last one leaving ends the group and its queue."""
        self.members.pop(session, None)
        if not self.members:
            self.queues.unbind(self.topic_filter, self.queue)
            self.queues.forget(self.queue)
            if self._timer is not None:
                self._timer.cancel()

    def settle(self, offset: int) -> None:
        self.queues.settle(self.queue, offset)

    def release(self, offset: int) -> None:
        self.queues.release(self.queue, offset)

    def dispatch(self) -> None:
        """Hand out as many messages as the online members have room for."""
        if self._dispatching or not self.members:
            return
        self._dispatching = True
        try:
            self._dispatch()
        finally:
            self._dispatching = False

    def _dispatch(self) -> None:
        while True:
            members = list(self.members.items())
            if not members:
                return
            start = next(self._rotation) % len(members)
            members = members[start:] + members[:start]
            room = {session: session.shared_capacity() for session, _ in members}
            total = sum(room.values())
            if total <= 0:
                return
            popped = self.queues.pop(self.queue, min(total, MAX_POP), self.invisible_ms)
            if not popped:
                self._arm()
                return
            turn = itertools.cycle([(s, o) for s, o in members if room[s] > 0])
            for delivery in popped:
                session, options = next(turn)
                while room[session] <= 0:
                    session, options = next(turn)
                room[session] -= 1
                session.send_shared(self, delivery, options)

    def _arm(self) -> None:
        if not self._armed:
            self._armed = True
            self.queues.signal(self.queue).add_done_callback(self._signalled)
        due = self.queues.next_redelivery_ms(self.queue)
        if due is not None and self._timer is None:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(max(0.0, (due - now_ms()) / 1000), self._redeliver)

    def _signalled(self, _: asyncio.Future[None]) -> None:
        self._armed = False
        self.dispatch()

    def _redeliver(self) -> None:
        self._timer = None
        self.dispatch()
