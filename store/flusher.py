"""Group commit: one thread moves appended records to disk, makes them durable and indexes them.

Appenders encode records into an ``AppendBuffer`` under its lock and return at once. The
flusher thread swaps the buffer out, writes it with one ``write`` per segment, and then

- ``sync`` policy: fsyncs before anything else, so one fsync covers every record that arrived
  while the previous fsync ran (group commit), and only then reports them durable;
- ``async`` policy: reports them visible at once and fsyncs every ``flush_interval_ms``.

Either way it dispatches the batch to consume queues and the key index and tells listeners how
far the log is visible and durable. A second thread writes checkpoints.

A failing disk never stops the flusher. When writing, fsyncing or dispatching a batch raises an
``OSError`` (ENOSPC, EMFILE, EIO, ...), the store turns *degraded*: waiters for offsets not yet
durable are failed at once, new appends are refused, health listeners hear why. The flusher
retries the same batch (the same bytes at the same offsets, then the same idempotent dispatch)
with a short backoff until it goes through, then clears the degraded state and reports the batch
as usual: the store resumes by itself once the disk has room again. Records of the stuck batch
are then delivered although their producers were told of the failure (at least once). A store
opened on a failing disk starts degraded, and the flusher's first job, retried the same way, is
to write what opening could not (``finish_open``).
"""
from __future__ import annotations

import errno
import heapq
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TypeVar

from .commit_log import CommitLog, Segment
from .dispatcher import DispatchRequest, Dispatcher
from .errors import RecordTooLargeError, StoreDegradedError, describe_write_failure

log = logging.getLogger(__name__)


_ARRAY_SIZE = 1 << 20
_SPARES = 16  # arrays kept for reuse: more than the flusher ever holds at once
_HAND_OFF_BYTES = 256 << 10
_FIRST_RETRY_S = 0.005
_LAST_RETRY_S = 0.5  # backoff cap: how long a freed disk may wait before writes resume
_OUT_OF_DESCRIPTORS = (errno.EMFILE, errno.ENFILE)

T = TypeVar("T")

HealthListener = Callable[[str | None], None]
"""Called with why the store cannot write when it becomes degraded, and with None once it can."""


class AppendBuffer:
    """Records accepted but not yet written, encoded in place into preallocated arrays.

    Appenders ``place`` records (offset, segment roll, buffer space) and encode them under ``lock``. Filled chunks are handed to
    the flusher through a deque, at once when it is idle, else every ``_HAND_OFF_BYTES``: the
    flusher pops them without the append lock, so a busy appender never starves it. A full
    array is retired into the next hand-off and reused once the flusher has written it: the
    hot path neither allocates nor copies a record twice.
    """

    def __init__(self, segment_size: int, end: int, segment_base: int) -> None:
        self.lock = threading.Lock()
        self.ready = threading.Condition(self.lock)
        self.handed_off: deque[tuple[list[list], list[DispatchRequest], list[bytearray]]] = deque()
        self.chunks: list[list] = []  # [segment base, array, start, end], not yet handed off
        self.requests: list[DispatchRequest] = []
        self.flusher_waiting = False
        self.segment_size = segment_size
        self.next_offset = end
        self._segment_base = segment_base
        self._array = bytearray(_ARRAY_SIZE)
        self._used = 0
        self._gathered = 0
        self._retired: list[bytearray] = []  # full arrays, reusable once what precedes them is written
        self._spare: deque[bytearray] = deque()  # appended by the flusher, popped under ``lock``

    def place(self, size: int) -> tuple[int, bytearray, int]:
        """Give a record its commit-log offset, rolling to a new segment when it does not fit,
        and the (array, position) to encode it at. The caller holds ``lock``."""
        offset, base = self.next_offset, self._segment_base
        if offset + size > base + self.segment_size:
            if size > self.segment_size:
                raise RecordTooLargeError(
                    f"record of {size} bytes exceeds the segment size of {self.segment_size} bytes; "
                    "raise segment_size or send a smaller message")
            base = self._segment_base = offset
        self.next_offset = offset + size
        array, used = self._array, self._used
        if used + size > len(array):
            array, used = self._next_array(size), 0
        chunks = self.chunks
        if chunks and chunks[-1][1] is array and chunks[-1][0] == base:
            chunks[-1][3] = used + size
        else:
            chunks.append([base, array, used, used + size])
        self._used = used + size
        self._gathered += size
        return offset, array, used

    def _next_array(self, size: int) -> bytearray:
        if len(self._array) == _ARRAY_SIZE:
            self._retired.append(self._array)
        if size <= _ARRAY_SIZE and self._spare:
            self._array = self._spare.pop()
        else:
            self._array = bytearray(max(_ARRAY_SIZE, size))
        self._used = 0
        return self._array

    def added_many(self, requests: list[DispatchRequest]) -> None:
        """Record the dispatch requests of the records just encoded; caller holds ``lock``."""
        self.requests += requests
        if self.flusher_waiting or self._gathered >= _HAND_OFF_BYTES:
            self.hand_off()

    def hand_off(self) -> None:
        """Pass what gathered to the flusher, which then owns its arrays; caller holds ``lock``."""
        if self.chunks:
            self.handed_off.append((self.chunks, self.requests, self._retired))
            self.chunks, self.requests, self._retired, self._gathered = [], [], [], 0
        if self.flusher_waiting:
            self.flusher_waiting = False
            self.ready.notify()

    def recycle(self, retired: list[bytearray]) -> None:
        """Reuse arrays retired before a hand-off the flusher has written (flusher thread; no
        lock: deque appends are atomic)."""
        for array in retired:
            if len(self._spare) < _SPARES:
                self._spare.append(array)


class Progress:
    """How far the log is visible (written and indexed) and durable (fsynced), whether it can
    be written at all, and who waits.

    Each blocked waiter sleeps on a lock of its own in a heap ordered by the offset it awaits,
    so a publish wakes exactly the waiters it satisfies instead of all of them.
    """

    def __init__(self, end: int) -> None:
        self.cond = threading.Condition()
        self.visible = end
        self.durable = end
        self.degraded: StoreDegradedError | None = None
        """Why writes fail right now; None while they succeed."""
        self.refused: StoreDegradedError | None = None
        """Why a replicated store refuses new appends although its disk takes them (too few
        in-sync replicas, or this node no longer leads); None while it takes them."""
        self.limit: int | None = None
        """A replicated store's confirm offset: records past it are neither dispatched nor
        reported durable to listeners (None: a store of its own, everything durable counts)."""
        self.closed = False
        self.listeners: list[Callable[[int, int], None]] = []
        self.health_listeners: list[HealthListener] = []
        self.confirmed = end
        """The durable end capped at ``limit``: what listeners hear as durable."""
        self._waiters: dict[str, list[tuple[int, int, threading.Lock]]] = {"visible": [], "durable": [],
                                                                           "confirmed": []}
        self._sequence = itertools.count()

    def publish(self, visible: int, durable: int) -> None:
        """Runs on the flusher thread; listener failures are logged, never fatal. Listeners hear
        the durable end capped at the confirm limit, if one is set."""
        confirmed = durable if self.limit is None else min(durable, self.limit)
        with self.cond:
            self.visible, self.durable, self.confirmed = visible, durable, confirmed
            for attribute, reached in (("visible", visible), ("durable", durable), ("confirmed", confirmed)):
                heap = self._waiters[attribute]
                while heap and heap[0][0] <= reached:
                    heapq.heappop(heap)[2].release()
        for listener in self.listeners:
            try:
                listener(visible, confirmed)
            except Exception:
                log.exception("store progress listener %r failed", listener)

    def degrade(self, error: StoreDegradedError) -> None:
        """Writes fail: wake every waiter (they raise), and tell health listeners if this starts
        an episode. Runs on the flusher thread."""
        with self.cond:
            starts = self.degraded is None
            self.degraded = error
            if starts:
                self._wake_all()
        if starts:
            self._tell_health(str(error))

    def recover(self) -> None:
        """Writes succeed again. Runs on the flusher thread, before the batch is published."""
        with self.cond:
            ended, self.degraded = self.degraded is not None, None
            refused = self.refused
        if ended:
            self._tell_health(None if refused is None else str(refused))

    def refuse(self, reason: str | None) -> None:
        """Refuse new appends for ``reason`` (None: take them again). Waiters for durability
        fail at once, as on a full disk: what they wait for may never be confirmed."""
        with self.cond:
            before = self.refused
            self.refused = None if reason is None else StoreDegradedError(reason)
            if reason is not None:
                self._wake_all()
            degraded = self.degraded
        if (before is None) != (reason is None) or (reason is not None and str(before) != reason):
            self._tell_health(reason if reason is not None else
                              None if degraded is None else str(degraded))

    def fail(self, error: BaseException) -> None:
        """The flusher stopped for good after an unexpected error (a bug, not the disk)."""
        self.degrade(StoreDegradedError(
            f"the store's writer stopped after an unexpected error ({error!r}); appends are refused "
            "until the broker is restarted; report the error with the log"))

    def _tell_health(self, reason: str | None) -> None:
        for listener in self.health_listeners:
            try:
                listener(reason)
            except Exception:
                log.exception("store health listener %r failed", listener)

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self._wake_all()

    def _wake_all(self) -> None:
        for heap in self._waiters.values():
            while heap:
                heapq.heappop(heap)[2].release()

    def wait(self, attribute: str, end: int, timeout: float | None) -> bool:
        """Block until ``visible``/``durable`` reaches ``end``; False on timeout or close.

        Raises StoreDegradedError at once while the store cannot write, and when it turns
        degraded during the wait: the offset may never be reached.
        """
        with self.cond:
            if getattr(self, attribute) >= end:
                return True
            failing = self.degraded or self.refused
            if failing is not None:
                raise _fresh(failing)
            if self.closed:
                return False
            gate = threading.Lock()
            gate.acquire()
            heapq.heappush(self._waiters[attribute], (end, next(self._sequence), gate))
        gate.acquire(timeout=-1 if timeout is None else timeout)
        if getattr(self, attribute) >= end:
            return True
        failing = self.degraded or self.refused
        if failing is not None:
            raise _fresh(failing)
        return False


def _fresh(error: StoreDegradedError) -> StoreDegradedError:
    """A new exception like ``error``: one instance raised on many threads would tangle."""
    return StoreDegradedError(str(error), error.errno)


class _Batch:
    """Records handed off together, written at their own offsets: retrying writes the same bytes
    to the same places, so a batch that failed part way is simply tried again."""

    __slots__ = ("parts", "requests", "retired", "end", "written", "segments", "queued")

    def __init__(self, chunks: list[list], requests: list[DispatchRequest], retired: list[bytearray]) -> None:
        per_segment: dict[int, list[memoryview]] = {}
        for base, array, start, end in chunks:
            per_segment.setdefault(base, []).append(memoryview(array)[start:end])
        at = requests[0][0]  # the first record starts the first chunk
        self.parts: list[tuple[int, int, list[memoryview]]] = []
        """(segment base, commit-log offset, bytes) per segment, in log order."""
        for base, views in per_segment.items():
            self.parts.append((base, at, views))
            at += sum(map(len, views))
        self.requests = requests
        self.retired = retired
        self.end = at
        self.written = 0
        """Parts known to be in their files."""
        self.segments: set[Segment] = set()
        self.queued = False
        """A replicated store: its requests wait in ``Flusher.pending`` for the confirm limit."""


class Flusher(threading.Thread):
    """The group-commit thread of one store."""

    def __init__(self, buffer: AppendBuffer, commit_log: CommitLog, dispatcher: Dispatcher,
                 progress: Progress, sync: bool, flush_interval_ms: int, cycle_lock: threading.Lock,
                 release_descriptors: Callable[[], None],
                 finish_open: Callable[[], None] | None = None) -> None:
        super().__init__(name="sluice-store-flusher", daemon=True)
        self.finish_open = finish_open
        """Writes the store could not make at open (a full disk): done first, until it succeeds."""
        self.release_descriptors = release_descriptors
        """Closes idle queue files: called when a write finds the process out of descriptors."""
        self.buffer = buffer
        self.log = commit_log
        self.dispatcher = dispatcher
        self.progress = progress
        self.sync_each_batch = sync
        self.flush_interval = flush_interval_ms / 1000
        self.cycle_lock = cycle_lock  # held for each write-and-dispatch cycle; retention takes it too
        self.stopping = False
        self._unsynced: set[Segment] = set()
        self._next_fsync = time.monotonic()
        self._fsync_failing = False
        self._degraded_at = time.monotonic()  # when the failures began (a store may open degraded)
        self.pending: deque[DispatchRequest] = deque()
        """Written records past the confirm limit, dispatched once it reaches them."""
        self.dispatched_end = progress.visible
        self.limit_moved = False
        """Set under the buffer lock by ``FileStore.confirm``: dispatch what the limit now covers."""

    def stop(self) -> None:
        """Ask the thread to drain, fsync and exit; then join it. While the store is degraded it
        tries once more and then gives up on what it could not write."""
        with self.buffer.lock:
            self.stopping = True
            self.buffer.ready.notify()
        self.join()

    def run(self) -> None:
        try:
            if self.finish_open is not None and self._retry(self._opened) is None:
                self._give_up()
                return
            while self._cycle():
                pass
            if not self.sync_each_batch:
                self._fsync()
        except Exception as error:  # a bug: waiters and health must hear of it
            log.exception("store flusher failed; appends can no longer become durable")
            self.progress.fail(error)

    def _cycle(self) -> bool:
        """Handle what was handed off (or a timeout); False once stopping and drained."""
        buffer = self.buffer
        if not buffer.handed_off:
            with buffer.lock:
                # handed_off again, under the lock: an appender may have handed a large batch
                # off (leaving chunks empty) since the check above, and would not wake us.
                if not buffer.chunks and not buffer.handed_off and not self.stopping \
                        and not self.limit_moved:
                    buffer.flusher_waiting = True
                    buffer.ready.wait(self._timeout())
                    buffer.flusher_waiting = False
                buffer.hand_off()
        stopping = self.stopping
        chunks: list[list] = []
        requests: list[DispatchRequest] = []
        retired: list[bytearray] = []
        while buffer.handed_off:
            more_chunks, more_requests, more_retired = buffer.handed_off.popleft()
            chunks += more_chunks
            requests += more_requests
            retired += more_retired
        if chunks:
            if not self._store(_Batch(chunks, requests, retired)):
                self._give_up()
                return False
            buffer.recycle(retired)
        if self.limit_moved:
            self.limit_moved = False
            visible = self._retry(self._dispatch_pending)
            if visible is None:
                self._give_up()
                return False
            self.progress.publish(visible, self.progress.durable)
        if not self.sync_each_batch and time.monotonic() >= self._next_fsync:
            self._fsync()
        return bool(chunks) or not stopping

    def _timeout(self) -> float | None:
        return None if self.sync_each_batch else max(0.0, self._next_fsync - time.monotonic())

    def _store(self, batch: _Batch) -> bool:
        """Write, make durable (``sync`` policy) and dispatch ``batch``, then publish it; retry
        through disk errors until that succeeds. False if the store closed first."""
        written = self._retry(lambda: self._write(batch))
        if written is None:
            return False
        self.progress.publish(*written)
        return True

    def _opened(self) -> bool:
        self.finish_open()
        return True

    def _retry(self, attempt: Callable[[], T]) -> T | None:
        """``attempt()`` (which never returns None), again after a short backoff while it raises
        OSError, the store degraded meanwhile; None if the store closed first."""
        delay = _FIRST_RETRY_S
        released = False
        while True:
            last_chance = self.stopping
            try:
                result = attempt()
            except OSError as error:
                if error.errno in _OUT_OF_DESCRIPTORS:
                    self.release_descriptors()  # then try once more before anyone hears of it
                    if not released:
                        released = True
                        continue
                self._degrade(error)
                if last_chance:
                    return None
                self._pause(delay)
                delay = min(2 * delay, _LAST_RETRY_S)
                continue
            if not self._fsync_failing:
                self._recover()
            return result

    def _write(self, batch: _Batch) -> tuple[int, int]:
        """Write, sync and dispatch ``batch`` under the cycle lock; (visible, durable) ends."""
        with self.cycle_lock:
            for base, at, views in batch.parts[batch.written:]:
                batch.segments.add(self.log.write(base, views, at))
                batch.written += 1
            if self.sync_each_batch:
                try:
                    self.log.sync(sorted(batch.segments, key=lambda segment: segment.base))
                except OSError:
                    batch.written = 0  # after a failed fsync the pages may be lost: write them again
                    raise
                durable = batch.end
            else:
                self._unsynced |= batch.segments
                durable = self.progress.durable
            if self.progress.limit is None:
                self.dispatcher.dispatch(batch.requests)
                self.dispatched_end = batch.end
            elif not batch.queued:
                self.pending.extend(batch.requests)
                batch.queued = True
            return self._dispatch_confirmed(), durable

    def _dispatch_pending(self) -> int:
        with self.cycle_lock:
            return self._dispatch_confirmed()

    def _dispatch_confirmed(self) -> int:
        """Dispatch the pending records the confirm limit covers; the end of what is dispatched.
        Caller holds the cycle lock."""
        limit, pending = self.progress.limit, self.pending
        if limit is None or not pending:
            return self.dispatched_end
        count = 0
        for offset, size, *_ in pending:
            if offset + size > limit:
                break
            count += 1
        if count:
            ready = [pending[index] for index in range(count)]
            self.dispatcher.dispatch(ready)  # may raise: then they stay pending, retried whole
            for _ in range(count):
                pending.popleft()
            self.dispatched_end = ready[-1][0] + ready[-1][1]
        return self.dispatched_end

    def _fsync(self) -> None:
        """Async policy: make everything written so far durable; on failure, degrade and retry
        after a short pause."""
        self._next_fsync = time.monotonic() + self.flush_interval
        unsynced, self._unsynced = self._unsynced, set()
        if unsynced or self.progress.durable < self.progress.visible:
            try:
                with self.cycle_lock:
                    self.log.sync(sorted(unsynced, key=lambda segment: segment.base))
            except OSError as error:
                self._unsynced |= unsynced
                self._fsync_failing = True
                self._degrade(error)
                self._next_fsync = time.monotonic() + _LAST_RETRY_S
                return
            self._fsync_failing = False
            self._recover()
            self.progress.publish(self.progress.visible, self.progress.visible)

    def _degrade(self, error: OSError) -> None:
        """Report a failed write: logged once per episode, waiters failed, appends refused."""
        reason = describe_write_failure(error)
        if self.progress.degraded is None:
            self._degraded_at = time.monotonic()
            log.error("%s; appends are refused until then", reason)
        self.progress.degrade(StoreDegradedError(reason, error.errno))

    def _recover(self) -> None:
        if self.progress.degraded is not None:
            log.warning("the store writes again after %.2f s of failures; appends are accepted",
                        time.monotonic() - self._degraded_at)
            self.progress.recover()

    def _pause(self, seconds: float) -> None:
        """Wait before a retry; ``stop`` cuts it short."""
        with self.buffer.lock:
            if not self.stopping:
                self.buffer.ready.wait(seconds)

    def _give_up(self) -> None:
        """Closing while the disk still fails: what could not be written is dropped (its
        producers were told it failed); recovery cuts any torn tail at the next open."""
        with self.buffer.lock:
            self.buffer.hand_off()
            dropped = sum(len(requests) for _, requests, _ in self.buffer.handed_off)
            self.buffer.handed_off.clear()
        log.error("the store closes while it cannot write (%s); records not written are dropped "
                  "(%d more were waiting); their producers were told they failed",
                  self.progress.degraded, dropped)


class Checkpointer(threading.Thread):
    """Calls ``checkpoint`` every ``interval_ms`` on its own thread, so that fsyncing consume
    queues and the key index never holds up the flusher. A failure is logged once per episode
    and retried every interval."""

    def __init__(self, checkpoint: Callable[[], None], interval_ms: int) -> None:
        super().__init__(name="sluice-store-checkpointer", daemon=True)
        self.checkpoint = checkpoint
        self.interval = interval_ms / 1000
        self._stop_requested = threading.Event()

    def stop(self) -> None:
        self._stop_requested.set()
        self.join()

    def run(self) -> None:
        failing = False
        while not self._stop_requested.wait(self.interval):
            try:
                self.checkpoint()
            except OSError as error:
                if not failing:
                    log.warning("store checkpoint failed (%s); retrying every %.1f s, and a restart "
                                "meanwhile replays more of the log", describe_write_failure(error),
                                self.interval)
                failing = True
            except Exception:
                log.exception("store checkpoint failed; recovery will replay more of the log")
            else:
                if failing:
                    log.info("store checkpoints succeed again")
                failing = False
