"""Waiting for the store on an asyncio event loop, and coalescing appends per loop iteration.

One store progress listener (called on the store's flusher thread) hands the visible and
durable offsets to the loop with ``call_soon_threadsafe``; on the loop, heaps of
(end_offset, callback) waiters are drained up to those offsets. Many producer tasks can then
await durability without a thread each.

A store health listener does the same for failures: while the store cannot write, producers
waiting for durability fail with ``QuotaExceeded`` (carrying the store's reason), and so does
every wait that starts meanwhile; callbacks (publishing a message once durable) stay pending
and run if the records are written later.
"""
from __future__ import annotations

import asyncio
import functools
import heapq
import itertools
import logging
from collections.abc import Callable

from store.api import AppendResult, Message, Store
from store.errors import StoreDegradedError, StoreError

from .errors import QuotaExceeded

log = logging.getLogger(__name__)

Failure = Callable[[Exception], None]


class _OffsetHeap:
    """Callbacks keyed by commit-log end offset, run once an offset reaches them. Loop only.

    A callback registered with ``on_failure`` is a wait that can fail: ``fail`` calls
    ``on_failure`` instead and forgets it. One raising callback never keeps the others from
    running: it is logged and the rest go on.
    """

    def __init__(self, offset: int) -> None:
        self.offset = offset
        self._heap: list[tuple[int, int, Callable[[], None], Failure | None]] = []
        self._sequence = itertools.count()

    def advance(self, offset: int) -> None:
        if offset <= self.offset:
            return
        self.offset = offset
        heap = self._heap
        while heap and heap[0][0] <= offset:
            end, _, callback, _ = heapq.heappop(heap)
            _run(callback, end)

    def call_when(self, end_offset: int, callback: Callable[[], None],
                  on_failure: Failure | None = None) -> None:
        if end_offset <= self.offset:
            _run(callback, end_offset)
        else:
            heapq.heappush(self._heap, (end_offset, next(self._sequence), callback, on_failure))

    def fail(self, make_error: Callable[[], Exception]) -> None:
        """Fail every wait that can fail (each with its own ``make_error()``); keep callbacks."""
        failing = [entry for entry in self._heap if entry[3] is not None]
        if not failing:
            return
        self._heap = [entry for entry in self._heap if entry[3] is None]
        heapq.heapify(self._heap)
        for end, _, _, on_failure in failing:
            _run(on_failure, end, make_error())


def _run(callback: Callable[..., None], end_offset: int, *args: object) -> None:
    try:
        callback(*args)
    except Exception:  # noqa: BLE001 - the waiters after it must still be answered
        log.exception("a callback waiting for commit-log offset %d failed; the other waiters go on",
                      end_offset)


class DurableWaiters:
    """Futures and callbacks resolved as the store's visible and durable offsets move."""

    def __init__(self, loop: asyncio.AbstractEventLoop, durable: int, visible: int | None = None) -> None:
        self.loop = self._loop = loop
        self._durable = _OffsetHeap(durable)
        self._visible = _OffsetHeap(durable if visible is None else visible)
        self._scheduled = (self._visible.offset, durable)  # only touched on the flusher thread
        self._store_failure: str | None = None
        """Why the store cannot write, as last heard on the loop; None while it can."""
        self.health_watchers: list[Callable[[str | None], None]] = []
        """Told on the loop whenever the store's health changes (see `store_health`)."""
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

    def health_listener(self, reason: str | None) -> None:
        """Store health listener; runs on the flusher thread and must never raise."""
        try:
            self._loop.call_soon_threadsafe(self.store_health, reason)
        except RuntimeError:
            pass  # the loop is closed: nobody is waiting any more

    def store_health(self, reason: str | None) -> None:
        """On the loop: the store cannot write (``reason``) or can again (None). Producers
        waiting for durability are failed; publish callbacks stay pending."""
        changed = reason != self._store_failure
        self._store_failure = reason
        if reason is not None:
            self._durable.fail(self._failure)
        if changed:
            for watcher in list(self.health_watchers):
                try:
                    watcher(reason)
                except Exception:  # noqa: BLE001 - one watcher's bug must not silence the rest
                    log.exception("a store health watcher failed; the others go on")

    @property
    def store_failure(self) -> str | None:
        """Why the store cannot write, as last heard on the loop; None while it can."""
        return self._store_failure

    def _failure(self) -> QuotaExceeded:
        return QuotaExceeded(f"{self._store_failure}; the message may not be stored: send it again "
                             "once the broker accepts messages")

    async def wait(self, end_offset: int) -> None:
        """Return once everything before ``end_offset`` is durable."""
        if end_offset <= self._durable.offset:
            return
        future: asyncio.Future[None] = self._loop.create_future()
        self.resolve_when_durable(end_offset, future, None)
        await future

    def resolve_when_durable(self, end_offset: int, future: asyncio.Future, value: object) -> None:
        """On the loop: set ``future``'s result to ``value`` once ``end_offset`` is durable, or
        fail it with QuotaExceeded if the store cannot write (now or before then)."""
        if end_offset > self._durable.offset and self._store_failure is not None:
            future.set_exception(self._failure())
            return
        self._durable.call_when(end_offset, lambda: future.done() or future.set_result(value),
                                lambda error: future.done() or future.set_exception(error))

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
        failure: Callable[[], BaseException] = _refused
        try:
            results = self._store.append_batch(messages)
        except StoreDegradedError as refused:  # each producer gets an error of its own
            results = list(refused.appended)
            failure = functools.partial(QuotaExceeded, f"{refused}; nothing was stored: send "
                                        "again once the broker accepts messages")
        except StoreError as refused:
            results, failure = list(refused.appended), functools.partial(_same, refused)
        except Exception as failed:  # noqa: BLE001 - every waiting producer must hear of it
            results, failure = [], functools.partial(_same, failed)
        if self._on_batch is not None and results:
            self._on_batch(messages[:len(results)], results)
        start = 0
        for future, count in calls:
            mine = results[start:start + count]
            start += count
            if len(mine) < count:
                future.set_exception(failure())
            elif self._durable:
                self._waiters.resolve_when_durable(mine[-1].end_offset, future, mine)
            else:
                future.set_result(mine)


def _refused() -> StoreError:
    return StoreError("append refused")


def _same(error: BaseException) -> BaseException:
    return error
