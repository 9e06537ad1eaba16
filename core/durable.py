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

from store.api import AppendResult, Message
from store.file_store import FileStore


class DurableWaiters:
    """Futures keyed by commit-log end offset, resolved as the store's durable offset moves."""

    def __init__(self, loop: asyncio.AbstractEventLoop, durable: int) -> None:
        self.loop = self._loop = loop
        self.durable = durable  # only touched on the loop
        self._scheduled = durable  # only touched on the flusher thread
        self.steps = 0
        """How often the durable offset moved (flusher thread): the number of group commits."""
        self._heap: list[tuple[int, int, asyncio.Future, object]] = []
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
            _, _, future, value = heapq.heappop(heap)
            if not future.done():
                future.set_result(value)

    async def wait(self, end_offset: int) -> None:
        """Return once everything before ``end_offset`` is durable."""
        if end_offset <= self.durable:
            return
        future: asyncio.Future[None] = self._loop.create_future()
        self.resolve_when_durable(end_offset, future, None)
        await future

    def resolve_when_durable(self, end_offset: int, future: asyncio.Future, value: object) -> None:
        """On the loop: set ``future``'s result to ``value`` once ``end_offset`` is durable."""
        if end_offset <= self.durable:
            future.set_result(value)
        else:
            heapq.heappush(self._heap, (end_offset, next(self._sequence), future, value))


class BatchingAppender:
    """Appends from many tasks, coalesced into one ``append_batch`` per loop iteration.

    This is how the broker's core drives the store: producers on one event loop hand over
    messages; one batch per iteration takes the store lock once, and each producer's future
    resolves with its ``AppendResult`` once the record is durable.
    """

    def __init__(self, store: FileStore, waiters: DurableWaiters) -> None:
        self._store = store
        self._waiters = waiters
        self._loop = waiters.loop
        self._messages: list[Message] = []
        self._futures: list[asyncio.Future[AppendResult]] = []

    def append(self, message: Message) -> asyncio.Future[AppendResult]:
        """On the loop: a future resolving once ``message`` is stored and durable."""
        future: asyncio.Future[AppendResult] = self._loop.create_future()
        if not self._messages:
            self._loop.call_soon(self._flush)
        self._messages.append(message)
        self._futures.append(future)
        return future

    def _flush(self) -> None:
        messages, futures = self._messages, self._futures
        self._messages, self._futures = [], []
        resolve = self._waiters.resolve_when_durable
        for future, result in zip(futures, self._store.append_batch(messages)):
            resolve(result.end_offset, future, result)
