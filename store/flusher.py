"""Group commit: one thread moves appended records to disk, makes them durable and indexes them.

Appenders encode records into an ``AppendBuffer`` under its lock and return at once. The
flusher thread swaps the buffer out, writes it with one ``write`` per segment, and then

- ``sync`` policy: fsyncs before anything else, so one fsync covers every record that arrived
  while the previous fsync ran (group commit), and only then reports them durable;
- ``async`` policy: reports them visible at once and fsyncs every ``flush_interval_ms``.

Either way it dispatches the batch to consume queues and the key index and tells listeners how
far the log is visible and durable. A second thread writes checkpoints.
"""
from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable

from .commit_log import CommitLog, Segment
from .dispatcher import DispatchRequest, Dispatcher
from .errors import RecordTooLargeError

log = logging.getLogger(__name__)


_ARRAY_SIZE = 1 << 20
_SPARES = 16  # arrays kept for reuse: more than the flusher ever holds at once
_HAND_OFF_BYTES = 256 << 10


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
    """How far the log is visible (written and indexed) and durable (fsynced), and who waits.

    Each blocked waiter sleeps on a lock of its own in a heap ordered by the offset it awaits,
    so a publish wakes exactly the waiters it satisfies instead of all of them.
    """

    def __init__(self, end: int) -> None:
        self.cond = threading.Condition()
        self.visible = end
        self.durable = end
        self.error: BaseException | None = None
        self.closed = False
        self.listeners: list[Callable[[int, int], None]] = []
        self._waiters: dict[str, list[tuple[int, int, threading.Lock]]] = {"visible": [], "durable": []}
        self._sequence = itertools.count()

    def publish(self, visible: int, durable: int) -> None:
        """Runs on the flusher thread; listener failures are logged, never fatal."""
        with self.cond:
            self.visible, self.durable = visible, durable
            for attribute, reached in (("visible", visible), ("durable", durable)):
                heap = self._waiters[attribute]
                while heap and heap[0][0] <= reached:
                    heapq.heappop(heap)[2].release()
        for listener in self.listeners:
            try:
                listener(visible, durable)
            except Exception:
                log.exception("store progress listener %r failed", listener)

    def fail(self, error: BaseException) -> None:
        with self.cond:
            self.error = error
            self._wake_all()

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self._wake_all()

    def _wake_all(self) -> None:
        for heap in self._waiters.values():
            while heap:
                heapq.heappop(heap)[2].release()

    def wait(self, attribute: str, end: int, timeout: float | None) -> bool:
        """Block until ``visible``/``durable`` reaches ``end``; False on timeout or close."""
        with self.cond:
            if getattr(self, attribute) < end and self.error is None and not self.closed:
                gate = threading.Lock()
                gate.acquire()
                heapq.heappush(self._waiters[attribute], (end, next(self._sequence), gate))
            else:
                gate = None
        if gate is not None:
            gate.acquire(timeout=-1 if timeout is None else timeout)
        if self.error is not None:
            raise OSError(f"the store can no longer write: {self.error}") from self.error
        return getattr(self, attribute) >= end


class Flusher(threading.Thread):
    """The group-commit thread of one store."""

    def __init__(self, buffer: AppendBuffer, commit_log: CommitLog, dispatcher: Dispatcher,
                 progress: Progress, sync: bool, flush_interval_ms: int, cycle_lock: threading.Lock) -> None:
        super().__init__(name="sluice-store-flusher", daemon=True)
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

    def stop(self) -> None:
        """Ask the thread to drain, fsync and exit; then join it."""
        with self.buffer.lock:
            self.stopping = True
            self.buffer.ready.notify()
        self.join()

    def run(self) -> None:
        try:
            while self._cycle():
                pass
            self._fsync()
        except BaseException as error:  # disk full, I/O error: waiters must hear of it
            log.exception("store flusher failed; appends can no longer become durable")
            self.progress.fail(error)

    def _cycle(self) -> bool:
        """Handle what was handed off (or a timeout); False once stopping and drained."""
        buffer = self.buffer
        if not buffer.handed_off:
            with buffer.lock:
                # handed_off again, under the lock: an appender may have handed a large batch
                # off (leaving chunks empty) since the check above, and would not wake us.
                if not buffer.chunks and not buffer.handed_off and not self.stopping:
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
            with self.cycle_lock:
                self._write(chunks, requests)
            buffer.recycle(retired)
        if not self.sync_each_batch and time.monotonic() >= self._next_fsync:
            self._fsync()
        return bool(chunks) or not stopping

    def _timeout(self) -> float | None:
        return None if self.sync_each_batch else max(0.0, self._next_fsync - time.monotonic())

    def _write(self, chunks: list[list], requests: list[DispatchRequest]) -> None:
        per_segment: dict[int, list[memoryview]] = {}
        for base, array, start, end in chunks:
            per_segment.setdefault(base, []).append(memoryview(array)[start:end])
        segments = {self.log.write(base, views) for base, views in per_segment.items()}
        end = self.log.end_offset
        if self.sync_each_batch:
            self.log.sync(sorted(segments, key=lambda segment: segment.base))
            durable = end
        else:
            self._unsynced |= segments
            durable = self.progress.durable
        self.dispatcher.dispatch(requests)
        self.progress.publish(end, durable)

    def _fsync(self) -> None:
        """Async policy: make everything written so far durable."""
        self._next_fsync = time.monotonic() + self.flush_interval
        unsynced, self._unsynced = self._unsynced, set()
        if unsynced or self.progress.durable < self.progress.visible:
            with self.cycle_lock:
                self.log.sync(sorted(unsynced, key=lambda segment: segment.base))
            self.progress.publish(self.progress.visible, self.progress.visible)


class Checkpointer(threading.Thread):
    """Calls ``checkpoint`` every ``interval_ms`` on its own thread, so that fsyncing consume
    queues and the key index never holds up the flusher."""

    def __init__(self, checkpoint: Callable[[], None], interval_ms: int) -> None:
        super().__init__(name="sluice-store-checkpointer", daemon=True)
        self.checkpoint = checkpoint
        self.interval = interval_ms / 1000
        self._stop_requested = threading.Event()

    def stop(self) -> None:
        self._stop_requested.set()
        self.join()

    def run(self) -> None:
        while not self._stop_requested.wait(self.interval):
            try:
                self.checkpoint()
            except Exception:
                log.exception("store checkpoint failed; recovery will replay more of the log")
