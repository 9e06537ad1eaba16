"""Waiting for durability on an asyncio event loop, the way the broker core will.

One store progress listener (called on the store's flusher thread) hands the durable offset
to the loop with ``call_soon_threadsafe``; on the loop a heap of (end_offset, future) waiters
is drained up to that offset. Many producer tasks can then ``await waiters.wait(end)`` without
a thread each.
"""
from __future__ import annotations

import asyncio
import heapq
import itertools


class DurableWaiters:
    """Futures keyed by commit-log end offset, resolved as the store's durable offset moves."""

    def __init__(self, loop: asyncio.AbstractEventLoop, durable: int) -> None:
        self._loop = loop
        self.durable = durable  # only touched on the loop
        self._scheduled = durable  # only touched on the flusher thread
        self.steps = 0
        """How often the durable offset moved (flusher thread): the number of group commits."""
        self._heap: list[tuple[int, int, asyncio.Future[None]]] = []
        self._sequence = itertools.count()

    def listener(self, visible: int, durable: int) -> None:
        """Store progress listener; runs on the flusher thread and must never raise."""
        if durable <= self._scheduled:
            return
        self._scheduled = durable
        self.steps += 1
        try:
            self._loop.call_soon_threadsafe(self.advance, durable)
        except RuntimeError:
            pass  # the loop is closed: nobody is waiting any more

    def advance(self, durable: int) -> None:
        """On the loop: resolve every waiter whose end offset is now durable."""
        if durable <= self.durable:
            return
        self.durable = durable
        heap = self._heap
        while heap and heap[0][0] <= durable:
            future = heapq.heappop(heap)[2]
            if not future.done():
                future.set_result(None)

    async def wait(self, end_offset: int) -> None:
        """Return once everything before ``end_offset`` is durable."""
        if end_offset <= self.durable:
            return
        future: asyncio.Future[None] = self._loop.create_future()
        heapq.heappush(self._heap, (end_offset, next(self._sequence), future))
        await future
