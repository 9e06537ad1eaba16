"""Durable appends on one event loop, over the store's public API: what the store benchmark's
uvloop writers use.

The store's progress listener (called on its flusher thread) hands the durable offset to the
loop; futures waiting for an end offset resolve once it is reached. ``TickBatcher`` coalesces
the appends that many tasks make in one loop iteration into one ``append_batch``, the way the
broker's core does (core/durable.py), without core's failure handling: a benchmark's store is
never degraded.
"""
from __future__ import annotations

import asyncio
import heapq
import itertools

from store.api import AppendResult, Message, Store


class DurableFutures:
    """Futures resolved as the store's durable offset passes their end offsets. ``steps``
    counts how often the durable offset moved: the number of group commits."""

    def __init__(self, loop: asyncio.AbstractEventLoop, durable: int) -> None:
        self.loop = loop
        self.durable = durable
        self.steps = 0
        self._seen = durable  # only touched on the flusher thread
        self._heap: list[tuple[int, int, asyncio.Future, object]] = []
        self._sequence = itertools.count()

    def listener(self, visible: int, durable: int) -> None:
        """Store progress listener; runs on the flusher thread."""
        if durable <= self._seen:
            return
        self._seen = durable
        self.steps += 1
        try:
            self.loop.call_soon_threadsafe(self._advance, durable)
        except RuntimeError:
            pass  # the loop is closed: nobody is waiting any more

    def _advance(self, durable: int) -> None:
        self.durable = durable
        heap = self._heap
        while heap and heap[0][0] <= durable:
            _, _, future, value = heapq.heappop(heap)
            if not future.done():
                future.set_result(value)

    def resolve_when_durable(self, end_offset: int, future: asyncio.Future, value: object) -> None:
        """On the loop: set ``future``'s result to ``value`` once ``end_offset`` is durable."""
        if end_offset <= self.durable:
            future.set_result(value)
        else:
            heapq.heappush(self._heap, (end_offset, next(self._sequence), future, value))

    async def wait(self, end_offset: int) -> None:
        """Return once everything before ``end_offset`` is durable."""
        if end_offset > self.durable:
            future = self.loop.create_future()
            self.resolve_when_durable(end_offset, future, None)
            await future


class TickBatcher:
    """Appends from many tasks on one loop, one ``append_batch`` per loop iteration; each
    resolves with its ``AppendResult`` once durable."""

    def __init__(self, store: Store, durable: DurableFutures) -> None:
        self._store = store
        self._durable = durable
        self._pending: list[tuple[Message, asyncio.Future[AppendResult]]] = []

    def append(self, message: Message) -> asyncio.Future[AppendResult]:
        """On the loop: a future of ``message``'s result, resolved once it is durable."""
        future: asyncio.Future[AppendResult] = self._durable.loop.create_future()
        if not self._pending:
            self._durable.loop.call_soon(self._flush)
        self._pending.append((message, future))
        return future

    def _flush(self) -> None:
        pending, self._pending = self._pending, []
        results = self._store.append_batch([message for message, _ in pending])
        for (_, future), result in zip(pending, results):
            self._durable.resolve_when_durable(result.end_offset, future, result)
