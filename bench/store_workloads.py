"""Timed workloads against a ``FileStore``: async appends, durable writers, catch-up reads.

Every workload runs until its record count or its time bound, whichever comes first, and
returns a ``Sample``: records and bytes that made it through, and the seconds it took.
"""
from __future__ import annotations

import asyncio
import itertools
import shutil
import threading
import time
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import uvloop

from store import FileStore
from store.api import FlushPolicy, Message, StoreConfig

from .loop_durability import DurableFutures, TickBatcher
from .report import Sample

TOPIC = "bench"
READ_MAX_COUNT = 1024
READ_MAX_BYTES = 4 << 20
_CLOCK_EVERY = 64  # single-writer loops look at the clock once per this many appends


def run_on_uvloop(coroutine: Coroutine[None, None, Sample]) -> Sample:
    """Run ``coroutine`` on uvloop, the event loop the broker runs on."""
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coroutine)


def make_body(size: int) -> bytes:
    """A body of ``size`` bytes (not all zeros)."""
    return bytes(i % 251 for i in range(size))


@contextmanager
def fresh_store(directory: Path, flush: FlushPolicy) -> Iterator[FileStore]:
    """A store in a new directory, closed and deleted afterwards."""
    store = FileStore(str(directory), StoreConfig(flush=flush, preallocate="eager"))
    try:
        yield store
    finally:
        store.close()
        shutil.rmtree(directory, ignore_errors=True)


# -- async flush, one writer thread ---------------------------------------------------------


def async_appends(store: FileStore, body: bytes, seconds: float, max_count: int) -> Sample:
    """``store.append`` in a loop, then wait until the last record is visible."""
    append, count, log_bytes, end = store.append, 0, 0, 0
    start = time.perf_counter()
    deadline = start + seconds
    while count < max_count and time.perf_counter() < deadline:
        for _ in range(_CLOCK_EVERY):
            result = append(TOPIC, body, queue_id=0)
            log_bytes += result.size
        count += _CLOCK_EVERY
        end = result.end_offset
    store.wait_visible(end)
    return Sample(count, log_bytes, count * len(body), time.perf_counter() - start)


def async_batches(store: FileStore, body: bytes, batch: int, seconds: float, max_count: int) -> Sample:
    """``store.append_batch`` of ``batch`` messages in a loop, then wait for visibility."""
    messages = [Message(TOPIC, body, queue_id=0)] * batch
    count, log_bytes, end = 0, 0, 0
    start = time.perf_counter()
    deadline = start + seconds
    while count < max_count and time.perf_counter() < deadline:
        results = store.append_batch(messages)
        log_bytes += sum(result.size for result in results)
        count += batch
        end = results[-1].end_offset
    store.wait_visible(end)
    return Sample(count, log_bytes, count * len(body), time.perf_counter() - start)


# -- sync flush, concurrent writers waiting for durability ------------------------------------


@dataclass
class _Tally:
    """Durable appends one writer completed."""

    records: int = 0
    log_bytes: int = 0


def sync_tasks(store: FileStore, body: bytes, writers: int, seconds: float, max_count: int,
               batched: bool = False) -> Sample:
    """``writers`` tasks on one uvloop: append, await durability, repeat.

    ``batched``: appends made in one loop iteration are coalesced into one ``append_batch``
    (``TickBatcher``), as the broker core does; otherwise each task calls ``append``.
    """
    return run_on_uvloop(_sync_tasks(store, body, writers, seconds, max_count, batched))


async def _sync_tasks(store: FileStore, body: bytes, writers: int, seconds: float, max_count: int,
                      batched: bool) -> Sample:
    waiters = DurableFutures(asyncio.get_running_loop(), store.durable_offset)
    store.add_listener(waiters.listener)
    appender = TickBatcher(store, waiters) if batched else None
    tickets = itertools.count()
    start = time.perf_counter()
    deadline = start + seconds

    async def writer(queue_id: int) -> _Tally:
        tally, message = _Tally(), Message(TOPIC, body, queue_id)
        while next(tickets) < max_count and time.perf_counter() < deadline:
            if appender is not None:
                result = await appender.append(message)
            else:
                result = store.append(TOPIC, body, queue_id=queue_id)
                await waiters.wait(result.end_offset)
            tally.records += 1
            tally.log_bytes += result.size
        return tally

    tallies = await asyncio.gather(*(writer(queue_id) for queue_id in range(writers)))
    return _sample(tallies, len(body), time.perf_counter() - start, waiters.steps)


def sync_threads(store: FileStore, body: bytes, writers: int, seconds: float, max_count: int) -> Sample:
    """``writers`` OS threads: append, ``store.wait_durable``, repeat."""
    tickets = itertools.count()
    commits = _CommitCounter(store.durable_offset)
    store.add_listener(commits.listener)
    tallies = [_Tally() for _ in range(writers)]
    clock: list[float] = []
    barrier = threading.Barrier(writers, action=lambda: clock.append(time.perf_counter()))

    def writer(queue_id: int) -> None:
        barrier.wait()
        deadline, tally = clock[0] + seconds, tallies[queue_id]
        while next(tickets) < max_count and time.perf_counter() < deadline:
            result = store.append(TOPIC, body, queue_id=queue_id)
            store.wait_durable(result.end_offset)
            tally.records += 1
            tally.log_bytes += result.size

    threads = [threading.Thread(target=writer, args=(queue_id,)) for queue_id in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return _sample(tallies, len(body), time.perf_counter() - clock[0], commits.steps)


class _CommitCounter:
    """A progress listener counting how often the durable offset moves."""

    def __init__(self, durable: int) -> None:
        self.durable = durable
        self.steps = 0

    def listener(self, visible: int, durable: int) -> None:
        if durable > self.durable:
            self.durable = durable
            self.steps += 1


def _sample(tallies: list[_Tally], body_size: int, seconds: float, group_commits: int) -> Sample:
    records = sum(tally.records for tally in tallies)
    return Sample(records, sum(tally.log_bytes for tally in tallies), records * body_size, seconds,
                  group_commits)


# -- catch-up read ------------------------------------------------------------------------------


def fill_queue(store: FileStore, body: bytes, count: int, batch: int = 64) -> Sample:
    """Append ``count`` records to queue 0 with ``append_batch``; wait until all are visible."""
    full = [Message(TOPIC, body, queue_id=0)] * batch
    done, log_bytes, end = 0, 0, 0
    start = time.perf_counter()
    while done < count:
        results = store.append_batch(full[:min(batch, count - done)])
        log_bytes += sum(result.size for result in results)
        done += len(results)
        end = results[-1].end_offset
    store.wait_visible(end)
    return Sample(done, log_bytes, done * len(body), time.perf_counter() - start)


def catch_up_read(store: FileStore, expected: int) -> Sample:
    """Read queue 0 from offset 0 to its end, touching every body; check the count."""
    read, offset, log_bytes, body_bytes = store.read, 0, 0, 0
    start = time.perf_counter()
    while True:
        messages = read(TOPIC, 0, offset, max_count=READ_MAX_COUNT, max_bytes=READ_MAX_BYTES)
        if not messages:
            break
        for message in messages:
            body_bytes += len(message.body)
            log_bytes += message.size
        offset += len(messages)
    elapsed = time.perf_counter() - start
    if offset != expected:
        raise RuntimeError(f"catch-up read returned {offset} records, expected {expected}")
    return Sample(offset, log_bytes, body_bytes, elapsed)


def open_store(directory: Path) -> tuple[FileStore, float]:
    """Reopen an existing store directory; return it and how long opening took."""
    start = time.perf_counter()
    store = FileStore(str(directory), StoreConfig(flush="async", preallocate="eager"))
    return store, time.perf_counter() - start
