"""Waiting for the store on an asyncio event loop, and coalescing appends per loop iteration.

One store progress listener (called on the store's flusher thread) hands the visible and
durable offsets to the loop with ``call_soon_threadsafe``; on the loop, heaps of
(end_offset, callback) waiters are drained up to those offsets. Many producer tasks can then
await durability without a thread each.
"""
from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable

from store.api import AppendResult, Message, Store
from store.errors import StoreError


class _OffsetHeap:
    """Callbacks keyed by commit-log end offset, run once an offset reaches them. Loop only."""

    def __init__(self, offset: int) -> None:
        self.offset = offset
        self._heap: list[tuple[int, int, Callable[[], None]]] = []
        self._sequence = itertools.count()

    def advance(self, offset: int) -> None:
        if offset <= self.offset:
            return
        self.offset = offset
        heap = self._heap
        while heap and heap[0][0] <= offset:
            heapq.heappop(heap)[2]()

    def call_when(self, end_offset: int, callback: Callable[[], None]) -> None:
        if end_offset <= self.offset:
            callback()
        else:
            heapq.heappush(self._heap, (end_offset, next(self._sequence), callback))


class DurableWaiters:
    """Futures and callbacks resolved as the store's visible and durable offsets move."""

    def __init__(self, loop: asyncio.AbstractEventLoop, durable: int, visible: int | None = None) -> None:
        self.loop = self._loop = loop
        self._durable = _OffsetHeap(durable)
        self._visible = _OffsetHeap(durable if visible is None else visible)
        self._scheduled = (self._visible.offset, durable)  # only touched on the flusher thread
        self.steps = 0
        """How often the durable offset moved (flusher thread): the number of group commits."""

    @property
    def durable(self) -> int:
        """The durable commit-log offset as last seen on the loop."""
        return self._durable.offset

    def listener(self, visible: int, durable: int) -> None:
        """Store progress listener; runs on the flusher thread and must never raise."""
        seen_visible, seen_durable = self._scheduled
        if visible <= seen_visible and durable <= seen_durable:
            return
        if durable > seen_durable:
            self.steps += 1
        self._scheduled = (max(visible, seen_visible), max(durable, seen_durable))
        try:
            self._loop.call_soon_threadsafe(self.advance, visible, durable)
        except RuntimeError:
            pass  # the loop is closed: nobody is waiting any more

    def advance(self, visible: int, durable: int) -> None:
        """On the loop: run every waiter whose end offset is now visible or durable."""
        self._visible.advance(visible)
        self._durable.advance(durable)

    async def wait(self, end_offset: int) -> None:
        """Return once everything before ``end_offset`` is durable."""
        if end_offset <= self._durable.offset:
            return
        future: asyncio.Future[None] = self._loop.create_future()
        self.resolve_when_durable(end_offset, future, None)
        await future

    def resolve_when_durable(self, end_offset: int, future: asyncio.Future, value: object) -> None:
        """On the loop: set ``future``'s result to ``value`` once ``end_offset`` is durable."""
        self._durable.call_when(end_offset, lambda: future.done() or future.set_result(value))

    def call_when_durable(self, end_offset: int, callback: Callable[[], None]) -> None:
        """On the loop: run ``callback`` once ``end_offset`` is durable."""
        self._durable.call_when(end_offset, callback)

    def call_when_visible(self, end_offset: int, callback: Callable[[], None]) -> None:
        """On the loop: run ``callback`` once ``end_offset`` is readable from the store."""
        self._visible.call_when(end_offset, callback)


class BatchingAppender:
    """Appends from many tasks, coalesced into one ``append_batch`` per loop iteration.

    Producers on one event loop hand over messages; one batch per iteration takes the store
    lock once. Each call's future resolves with its ``AppendResult``s once its records are
    accepted (``durable=False``) or durable (``durable=True``): one future and one durability
    wait per call, however many messages it carries. ``on_batch`` sees every batch's results
    on the loop, right after the append.
    """

    def __init__(self, store: Store, waiters: DurableWaiters, *, durable: bool = True,
                 on_batch: Callable[[list[Message], list[AppendResult]], None] | None = None) -> None:
        self._store = store
        self._waiters = waiters
        self._loop = waiters.loop
        self._durable = durable
        self._on_batch = on_batch
        self._messages: list[Message] = []
        self._calls: list[tuple[asyncio.Future[list[AppendResult]], int]] = []

    async def append(self, message: Message) -> AppendResult:
        """Store one message; see ``append_many``."""
        return (await self.append_many([message]))[0]

    def append_many(self, messages: list[Message]) -> asyncio.Future[list[AppendResult]]:
        """On the loop: a future resolving once all ``messages`` are stored (and durable, if
        asked), with their results in order."""
        future: asyncio.Future[list[AppendResult]] = self._loop.create_future()
        if not self._messages:
            self._loop.call_soon(self._flush)
        self._messages += messages
        self._calls.append((future, len(messages)))
        return future

    def _flush(self) -> None:
        messages, calls = self._messages, self._calls
        self._messages, self._calls = [], []
        try:
            results = self._store.append_batch(messages)
            error: BaseException | None = None
        except StoreError as refused:
            results, error = list(refused.appended), refused
        except Exception as failed:  # noqa: BLE001 - every waiting producer must hear of it
            results, error = [], failed
        if self._on_batch is not None and results:
            self._on_batch(messages[:len(results)], results)
        start = 0
        for future, count in calls:
            mine = results[start:start + count]
            start += count
            if len(mine) < count:
                future.set_exception(error if error is not None else StoreError("append refused"))
            elif self._durable:
                self._waiters.resolve_when_durable(mine[-1].end_offset, future, mine)
            else:
                future.set_result(mine)
