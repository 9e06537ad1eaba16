"""Serving consumers: recent messages kept in memory, and long polls woken by appends.

Runs on the event loop; not thread-safe.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterable

from .model import Delivery

QueueKey = tuple[str, int]
ENTRY_OVERHEAD = 300
"""Bytes a cached message costs beyond its body (the Delivery, the body's header, its slots in
the queue's and the eviction order's deques): counted in the budget, so small messages cannot
fill it with hundreds of thousands of objects that every full garbage collection must scan."""


class RecentMessages:
    """The newest messages of every queue, as built at append time, within a byte budget
    (bodies plus `ENTRY_OVERHEAD` each).

    A consumer that keeps up reads from here and never touches the store.
    """

    def __init__(self, budget_bytes: int) -> None:
        self.budget = budget_bytes
        self.size = 0
        self._queues: dict[QueueKey, deque[Delivery]] = {}
        self._order: deque[QueueKey] = deque()
        self.hits = 0
        self.misses = 0

    def add(self, delivery: Delivery) -> None:
        """Remember a just-appended message (its queue offset must follow the cached ones)."""
        key = (delivery.topic, delivery.queue_id)
        cached = self._queues.get(key)
        if cached is None:
            cached = self._queues[key] = deque()
        elif cached and cached[-1].queue_offset + 1 != delivery.queue_offset:
            self.size -= sum(len(d.body) for d in cached) + ENTRY_OVERHEAD * len(cached)
            cached.clear()
        cached.append(delivery)
        self._order.append(key)
        self.size += len(delivery.body) + ENTRY_OVERHEAD
        while self.size > self.budget and self._order:
            oldest = self._queues[self._order.popleft()]
            if oldest:
                self.size -= len(oldest.popleft().body) + ENTRY_OVERHEAD

    def get(self, topic: str, queue_id: int, offset: int, limit: int) -> list[Delivery]:
        """Up to ``limit`` cached messages from ``offset`` on; empty if ``offset`` is not cached."""
        cached = self._queues.get((topic, queue_id))
        if not cached or not cached[0].queue_offset <= offset <= cached[-1].queue_offset:
            self.misses += 1
            return []
        self.hits += 1
        start = offset - cached[0].queue_offset
        return [cached[i] for i in range(start, min(len(cached), start + limit))]

    def forget_topic(self, topic: str) -> None:
        """Drop a deleted topic's messages."""
        for key in [key for key in self._queues if key[0] == topic]:
            cached = self._queues.pop(key)
            self.size -= sum(len(d.body) for d in cached) + ENTRY_OVERHEAD * len(cached)
        self._order = deque(key for key in self._order if key[0] != topic)


class TopicSignals:
    """Futures that long polls wait on, resolved when a topic gets new deliverable messages."""

    def __init__(self) -> None:
        self._waiters: dict[str, set[asyncio.Future[None]]] = {}

    def notify(self, topic: str) -> None:
        """Wake every long poll waiting on ``topic``."""
        for future in self._waiters.pop(topic, ()):
            if not future.done():
                future.set_result(None)

    def notify_all(self) -> None:
        """Wake every long poll (shutdown, offset resets)."""
        for topic in list(self._waiters):
            self.notify(topic)

    def future(self, topic: str) -> asyncio.Future[None]:
        """A future resolved at the next ``notify`` of ``topic`` (for callback-driven consumers)."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(topic, set()).add(future)
        return future

    def future_any(self, topics: Iterable[str]) -> asyncio.Future[None]:
        """A future resolved at the next ``notify`` of any of ``topics``; once resolved it
        leaves the others' waiters."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        topics = list(topics)
        for topic in topics:
            self._waiters.setdefault(topic, set()).add(future)

        def leave(_: asyncio.Future[None]) -> None:
            for topic in topics:
                waiting = self._waiters.get(topic)
                if waiting is not None:
                    waiting.discard(future)
                    if not waiting:
                        del self._waiters[topic]
        future.add_done_callback(leave)
        return future

    async def wait(self, topics: Iterable[str], timeout_s: float) -> None:
        """Return when one of ``topics`` is notified or ``timeout_s`` passes."""
        if timeout_s <= 0:
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        topics = list(topics)
        for topic in topics:
            self._waiters.setdefault(topic, set()).add(future)
        try:  # not wait_for: Python 3.11's swallows a cancellation that comes as the future
            # resolves, and the cancelled long poll would go on polling
            await asyncio.wait((future,), timeout=timeout_s)
        finally:
            for topic in topics:
                waiting = self._waiters.get(topic)
                if waiting is not None:
                    waiting.discard(future)
                    if not waiting:
                        del self._waiters[topic]
