"""Reads of tiered history kept off the event loop.

Core reads the store on the event loop: local reads take microseconds. A read of tiered history
whose objects are not cached would wait for object storage, so core reads inside
``Store.cached_only()``: such a read raises TierFetchNeeded at once, and runs again in one of
a few threads of its own (``HistoryFetches``), never the loop's. Code that cannot wait (a sync
read inside a pop or a pull) gets ``HistoryPending``, an ``Unavailable`` ("retry later") that
carries the fetch's future; async entry points wait for it and run again (``with_history``),
and the second run takes the fetched result. A stalled or failing object store therefore holds
up only the readers of tiered history, each for at most the object store's short timeouts.
"""
from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable, Hashable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from store.api import Store
from store.errors import TierFetchNeeded

from .errors import Unavailable

_T = TypeVar("_T")
FETCH_THREADS = 4
"""Threads reading tiered history: a stalled object store holds these, never the loop's own
thread or the default executor that metadata writes use."""
KEEP_RESULTS = 256
"""Fetched results waiting for their reader to come back for them (the oldest go first)."""
RUNS = 4
"""How often ``with_history`` runs its code: a result evicted before its reader took it is
fetched again, a few times."""


class HistoryPending(Unavailable):
    """A read needs tiered history from object storage: it is being fetched off the loop;
    ``ready`` is done when it is (then the same read takes the result, or the fetch's error)."""

    def __init__(self, what: str, ready: asyncio.Future[Any]) -> None:
        super().__init__(f"{what} is being read from tiered storage; retry later")
        self.ready = ready


class HistoryFetches:
    """Store reads that need object storage, each run once at a time in this pool's threads;
    their results (or errors) are kept, by key, until the read that started them comes back."""

    def __init__(self, store: Store, threads: int = FETCH_THREADS) -> None:
        self._store = store
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="sluice-tier-read")
        self._running: dict[Hashable, asyncio.Future[Any]] = {}
        self._done: OrderedDict[Hashable, tuple[Any, BaseException | None]] = OrderedDict()

    def read(self, key: Hashable, what: str, call: Callable[[], _T]) -> _T:
        """``call()`` (a store read) on this thread if it needs nothing from object storage, or
        the result of its earlier fetch; else HistoryPending, its fetch started."""
        if self._done:
            found = self._done.pop(key, None)
            if found is not None:
                if found[1] is not None:
                    raise found[1]
                return found[0]
        try:
            with self._store.cached_only():
                return call()
        except TierFetchNeeded:
            raise HistoryPending(what, self._start(key, call)) from None

    def _start(self, key: Hashable, call: Callable[[], Any]) -> asyncio.Future[Any]:
        running = self._running.get(key)
        if running is None:
            running = asyncio.get_running_loop().run_in_executor(self._pool, call)
            self._running[key] = running
            running.add_done_callback(lambda future: self._finished(key, future))
        return running

    def _finished(self, key: Hashable, future: asyncio.Future[Any]) -> None:
        self._running.pop(key, None)
        if future.cancelled():
            return
        error = future.exception()
        self._done[key] = (None if error is not None else future.result(), error)
        while len(self._done) > KEEP_RESULTS:
            self._done.popitem(last=False)

    async def run(self, call: Callable[[], _T]) -> _T:
        """``call()`` on the loop if it needs nothing from object storage, else in a thread."""
        try:
            with self._store.cached_only():
                return call()
        except TierFetchNeeded:
            return await asyncio.get_running_loop().run_in_executor(self._pool, call)

    def close(self) -> None:
        """Stop the threads (a fetch under way ends on its own; nobody waits for it)."""
        self._pool.shutdown(wait=False, cancel_futures=True)


async def with_history(run: Callable[[], _T]) -> _T:
    """``run()``: sync code reading the store on the loop; each time it stops at
    HistoryPending, wait for that fetch (off the loop) and run it again."""
    for _ in range(RUNS - 1):
        try:
            return run()
        except HistoryPending as pending:
            await asyncio.wait([pending.ready])  # neither cancels nor raises the shared fetch
    return run()
