"""FileStore: the production store, on files under one data directory.

    <data>/LOCK                        held (flock) while a store has the directory open
    <data>/store.json                  fixed geometry (layout.py)
    <data>/checkpoint                  see checkpoint.py
    <data>/commitlog/<20 digits>       commit-log segments (commit_log.py, record.py)
    <data>/consumequeue/<topic>/<id>/  consume queues (consume_queue.py)
    <data>/index/<20 digits>           key index (key_index.py)
    <data>/compacted/<topic>/          compacted copies of compacted topics (compaction.py)

Appends may come from any thread; they are encoded under one lock and handed to the flusher
thread (flusher.py), which writes, fsyncs by the flush policy and dispatches. When the disk
fails (full, out of descriptors, I/O errors) the store is degraded: ``degraded`` says why,
appends raise StoreDegradedError and it resumes by itself once writes succeed again. That holds
from the start: a store opened on a full disk recovers and serves reads, and is degraded until
the flusher has written what opening could not (``_finish_open``).
"""
from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence

from . import checkpoint, fileops, layout, record
from .api import (AppendResult, HealthListener, Message, ProgressListener, RecoveryReport, RetentionReport,
                  StoreConfig)
from .commit_log import CommitLog
from .compaction import CompactedTopics
from .consume_queue import ConsumeQueues
from .record_builder import RecordBuilder
from .dispatcher import Dispatcher, request_for
from .errors import (CorruptRecordError, InvalidRecordError, ReplicaGapError, StoreClosedError, StoreDegradedError, StoreError,
                     StoreLockedError, describe_write_failure)
from .flusher import AppendBuffer, Checkpointer, Flusher, Progress
from .key_index import KeyIndex
from .view import StoreView
from .recovery import recover
from .retention import apply_retention

log = logging.getLogger(__name__)

SYNC_FILES_ONE_BY_ONE = 64
"""A checkpoint with more dirty consume-queue files makes them durable with one ``syncfs``
instead of an fsync each: with thousands of queues (one per MQTT persistent session) a file
at a time would take minutes."""


class FileStore(StoreView):
    """A durable store in ``directory``; opening it recovers from any crash."""

    def __init__(self, directory: str, config: StoreConfig = StoreConfig()) -> None:
        """Open (or create) the store; if that fails, nothing stays open or locked."""
        self.directory = directory
        self.config = config
        fileops.makedirs(directory, site="store")
        with contextlib.ExitStack() as undo:
            self._lock_fd = _lock_directory(directory)
            undo.callback(os.close, self._lock_fd)
            self._checkpoint_path = os.path.join(directory, "checkpoint")
            commit_log = CommitLog(os.path.join(directory, "commitlog"), config.segment_size,
                                   preallocate=config.preallocate)
            undo.callback(commit_log.close)
            queues = ConsumeQueues(os.path.join(directory, "consumequeue"),
                                   layout.queue_entries_per_file(directory, config.queue_entries_per_file),
                                   max_open_queue_files=config.max_open_queue_files)
            undo.callback(queues.close)
            key_index = KeyIndex(os.path.join(directory, "index"), config.index_slot_count,
                                 config.index_max_entries)
            undo.callback(key_index.close)
            super().__init__(commit_log, queues, key_index)
            self.dispatcher = Dispatcher(queues, key_index)
            self.compaction = CompactedTopics(os.path.join(directory, "compacted"), self)
            found = checkpoint.load(self._checkpoint_path)
            if key_index.needs_rebuild_from is not None and found is not None:
                self._disclaim_index(found, key_index.needs_rebuild_from)
            self.recovery: RecoveryReport = recover(commit_log, queues, self.dispatcher, found,
                                                    key_index.needs_rebuild_from)
            queues.advance_min(commit_log.min_offset)
            self._cycle_lock = threading.Lock()
            self._checkpoint_lock = threading.Lock()
            self._progress = Progress(commit_log.end_offset)
            failure = self._mark_unclean() or self.dispatcher.deferred_error
            undo.pop_all()
        if failure is not None:
            self._open_degraded(failure)
        self._builder = RecordBuilder({(queue.topic, queue.queue_id): queue.max_offset for queue in queues},
                                      self.compaction.topics)
        self._buffer = AppendBuffer(config.segment_size, commit_log.end_offset, commit_log.segments()[-1].base)
        self._closed = False
        self._flusher = Flusher(self._buffer, commit_log, self.dispatcher, self._progress,
                                config.flush == "sync", config.flush_interval_ms, self._cycle_lock,
                                queues.files.release_idle,
                                finish_open=None if failure is None else self._finish_open)
        self._checkpointer = Checkpointer(self._periodic_checkpoint, config.checkpoint_interval_ms)
        self.tier_floor: Callable[[], int] | None = None
        """Set once by whoever tiers this store: the commit-log offset below which every record
        is in the tier. Retention then never deletes a segment whose end is above it."""
        self._flusher.start()
        self._checkpointer.start()

    # -- appending (any thread) ----------------------------------------------------------------

    @property
    def durable_offset(self) -> int:
        """Commit-log offset up to which every record is fsynced."""
        return self._progress.durable

    @property
    def confirm_limit(self) -> int | None:
        """A replicated store: the highest offset confirmed on every in-sync replica (``confirm``);
        None for a store of its own."""
        return self._progress.limit

    @property
    def visible_offset(self) -> int:
        """Commit-log offset up to which every record is readable from its queues."""
        return self._progress.visible

    def append(self, topic: str, body: bytes, *, queue_id: int = 0, tag: str = "",
               keys: Sequence[str] = (), properties: Mapping[str, str] | None = None,
               msg_id: str = "", born_ts: int = 0,
               extra_queues: Sequence[tuple[str, int]] = ()) -> AppendResult:
        """Append one record; it is durable once ``durable_offset`` reaches ``result.end_offset``."""
        return self.append_batch((Message(topic, body, queue_id, tag, keys, properties, msg_id, born_ts,
                                          extra_queues),))[0]

    def append_batch(self, messages: Sequence[Message]) -> list[AppendResult]:
        """Append several records under one lock acquisition; they land contiguously.

        Not atomic: if a message is refused, the error's ``appended`` lists the results of
        the messages before it, which were appended (as RocketMQ reports per-entry status).
        """
        now = int(time.time() * 1000)
        requests: list = []
        results: list[AppendResult] = []
        with self._buffer.lock:
            self._check_writable()
            refused = self._progress.refused
            if refused is not None:
                raise StoreDegradedError(str(refused))
            try:
                self._builder.build_batch(self._buffer.place, messages, now, requests, results)
            except StoreError as error:
                error.appended = results
                raise
            finally:
                if requests:
                    self._buffer.added_many(requests)
        return results

    @property
    def log_start(self) -> int:
        """Offset of the oldest record still in the log (retention deletes whole segments)."""
        return self.log.min_offset

    @property
    def appended_end(self) -> int:
        """Offset just past the last record accepted (written to the files or not yet)."""
        return self._buffer.next_offset

    def append_replicated(self, offset: int, data: bytes) -> int:
        """Append records copied verbatim from the leader's log, at the offsets they have there
        (a follower): each must be whole and valid for its offset, and the first must start
        where this log ends. Nothing is appended unless all are. Returns the new end; the
        bytes are durable once ``durable_offset`` reaches it. The queues' next offsets move
        past the copied records, so this store's own appends (once it leads) follow them."""
        requests = []
        pos = 0
        while pos < len(data):
            try:
                message = record.decode(data, pos, offset + pos)  # validates, CRC included
            except (CorruptRecordError, UnicodeDecodeError):
                raise InvalidRecordError(f"replicated bytes at offset {offset + pos} are not a whole, "
                                         "valid record for that offset") from None
            requests.append(request_for(message))
            pos += message.size
        view = memoryview(data)
        with self._buffer.lock:
            self._check_writable()
            if offset != self._buffer.next_offset:
                raise ReplicaGapError(offset, self._buffer.next_offset)
            for request in requests:
                placed, array, at = self._buffer.place(request[1])
                start = placed - offset
                array[at:at + request[1]] = view[start:start + request[1]]
            if requests:
                self._buffer.added_many(requests)
            next_offsets = self._builder.next_queue_offsets
            for request in requests:
                for topic, queue_id, queue_offset in request[4]:
                    next_offsets[(topic, queue_id)] = queue_offset + 1
            return self._buffer.next_offset

    def confirm(self, offset: int) -> None:
        """A replicated store: records below ``offset`` are on every in-sync replica. From the
        first call on, records are dispatched to queues and reported durable to listeners only
        up to the highest offset confirmed, so no reader or acknowledgement gets ahead of it."""
        with self._buffer.lock:
            limit = self._progress.limit
            if limit is not None and offset <= limit:
                return
            self._progress.limit = offset
            self._flusher.limit_moved = True
            if self._buffer.flusher_waiting:
                self._buffer.flusher_waiting = False
                self._buffer.ready.notify()

    def refuse_appends(self, reason: str | None) -> None:
        """A replicated store: refuse new appends (not replicated ones) for ``reason``, failing
        every wait for durability, as a full disk does; None takes them again."""
        self._progress.refuse(reason)

    def read_log(self, offset: int, max_bytes: int, end: int) -> bytes:
        """Whole records of the log from ``offset``, before ``end`` and the durable end, from one
        segment, at most ``max_bytes`` of them unless the first record alone is larger: what a
        leader ships to a follower. Empty once ``offset`` reaches the end."""
        end = min(end, self._progress.durable)
        if offset >= end:
            return b""
        data = self.log.read(offset, min(end - offset, max_bytes))[0]
        pos = 0
        while pos + record.HEADER_SIZE <= len(data):
            size = record.HEADER.unpack_from(data, pos)[0]
            if pos + size > len(data):
                break
            pos += size
        if pos:
            return data[:pos]
        size = record.HEADER.unpack_from(self.log.read(offset, record.HEADER_SIZE)[0])[0]
        return self.log.read(offset, size)[0]

    def _check_writable(self) -> None:
        if self._closed:
            raise StoreClosedError("the store is closed")
        degraded = self._progress.degraded
        if degraded is not None:
            raise StoreDegradedError(str(degraded), degraded.errno)

    @property
    def degraded(self) -> str | None:
        """Why the store cannot write right now and what to do about it; None while it can."""
        degraded = self._progress.degraded or self._progress.refused
        return None if degraded is None else str(degraded)

    def add_health_listener(self, listener: HealthListener) -> None:
        """Call ``listener(reason)`` on the flusher thread when the store becomes degraded and
        ``listener(None)`` when it writes again."""
        self._progress.health_listeners.append(listener)

    def wait_durable(self, end_offset: int, timeout: float | None = None) -> bool:
        """Block until everything before ``end_offset`` is fsynced; False on timeout. Raises
        StoreDegradedError if the store cannot write (then or meanwhile): the caller must not
        acknowledge, although the record may still be stored once writes succeed again."""
        return self._progress.wait("durable", end_offset, timeout)

    def wait_confirmed(self, end_offset: int, timeout: float | None = None) -> bool:
        """A replicated store: block until everything before ``end_offset`` is confirmed (on
        every in-sync replica's disk); False on timeout. Raises StoreDegradedError while
        appends are refused. A store of its own: the same as ``wait_durable``."""
        return self._progress.wait("confirmed", end_offset, timeout)

    def wait_visible(self, end_offset: int, timeout: float | None = None) -> bool:
        """Block until everything before ``end_offset`` is readable from its queues."""
        return self._progress.wait("visible", end_offset, timeout)

    def add_listener(self, listener: ProgressListener) -> None:
        """Call ``listener(visible_end, durable_end)`` on the flusher thread after each batch."""
        self._progress.listeners.append(listener)

    def remove_listener(self, listener: ProgressListener) -> None:
        """Stop calling ``listener`` (it may still run once if a batch is being reported)."""
        with contextlib.suppress(ValueError):
            self._progress.listeners.remove(listener)

    # -- compaction and retention ------------------------------------------------------------

    def enable_compaction(self, topic: str) -> None:
        """Make ``topic`` compacted: keyed messages, newest per key kept by ``compact``."""
        self.compaction.enable(topic)

    def compact(self, topic: str) -> int:
        """Refresh the compacted copy of ``topic``; return how many live keys it holds."""
        with self._cycle_lock:
            return self.compaction.compact(topic)

    def compacted(self, topic: str) -> list[record.StoredMessage]:
        """The newest message per key of a compacted topic (tombstones removed), oldest first."""
        return self.compaction.view(topic)

    def queue_starts(self) -> tuple[int, list[tuple[str, int, int]]]:
        """The log start, and each queue's earliest queue offset at or after it, taken together
        (``snapshot.take``)."""
        with self._cycle_lock:
            return self.log.min_offset, [(queue.topic, queue.queue_id, queue.min_offset)
                                         for queue in self.consume_queues]

    def apply_retention(self, now_ms: int | None = None) -> RetentionReport:
        """Delete whole oldest segments past the age or size limits of the config."""
        with self._cycle_lock:
            return apply_retention(self, self.config, now_ms)

    # -- checkpoints and shutdown --------------------------------------------------------------

    def checkpoint(self) -> None:
        """Write out and fsync consume queues and key index now, and record a checkpoint.

        Happens on its own every ``checkpoint_interval_ms``; afterwards a ``StoreReader`` in
        another process sees everything appended before the call.
        """
        self._write_checkpoint(clean=False)

    def _periodic_checkpoint(self) -> None:
        """Runs on the checkpointer thread; does nothing while the store is idle."""
        if self._checkpointed != (self._progress.durable, self.dispatcher.derived_end):
            self._write_checkpoint(clean=False)

    def _write_checkpoint(self, clean: bool) -> None:
        """Make derived data durable, then record how far it and the log reach.

        Only taking stock holds the cycle lock; the fsyncs run beside the flusher. One
        checkpoint is written at a time (the checkpointer's, ``checkpoint()``'s, close's). If a
        write or fsync fails, no checkpoint is recorded and files not fsynced stay due for the
        next one: a checkpoint never claims derived data that is not on disk.
        """
        with self._checkpoint_lock:
            with self._cycle_lock:
                self.consume_queues.write_pending(force=True)
                reached = (self._progress.durable, self.dispatcher.derived_end)
                dirty = self.consume_queues.take_dirty()
            try:
                if sum(len(bases) for _, bases in dirty) > SYNC_FILES_ONE_BY_ONE:
                    fileops.syncfs(self.consume_queues.directory, site="consumequeue")
                    dirty.clear()
                while dirty:
                    queue, bases = dirty[-1]
                    queue.sync_files(bases)
                    dirty.pop()
            finally:
                for queue, bases in dirty:
                    queue.mark_dirty(bases)
            self.key_index.flush()
            checkpoint.save(self._checkpoint_path, checkpoint.Checkpoint(*reached, clean))
            self._checkpointed = reached

    def _disclaim_index(self, found: checkpoint.Checkpoint, rebuild_from: int) -> None:
        """At open, before recovery: index files from ``rebuild_from`` on were discarded (damaged,
        or of an older format), so ``found`` claims derived data that is gone. Record that it
        reaches no further, so an open that dies while recovery rebuilds them rebuilds them again
        rather than trust the old checkpoint; if even that cannot be written, remove it."""
        try:
            checkpoint.save(self._checkpoint_path, checkpoint.Checkpoint(
                found.log_end, min(found.derived_end, rebuild_from), clean=False))
        except OSError as error:
            try:
                fileops.unlink(self._checkpoint_path, site="checkpoint")
            except OSError:
                log.error("could not record that key index files were discarded, nor remove the "
                          "checkpoint (%s): if the broker stops before its next checkpoint, "
                          "delete %s before starting it again", describe_write_failure(error),
                          self._checkpoint_path)
                return
            log.warning("could not record that key index files were discarded (%s); removed the "
                        "checkpoint, so a crash before the next one rescans the whole log",
                        describe_write_failure(error))

    def _mark_unclean(self) -> OSError | None:
        """At open: record that the store is in use, so a crash is never taken for a clean
        shutdown; return the error if the disk refused. Then the old checkpoint is removed if it
        can be, which says the same (recovery then rescans the whole log); if it cannot, it
        still holds, since the store appends nothing before it writes a new one."""
        try:
            self._write_checkpoint(clean=False)
        except OSError as error:
            fileops.remove_quietly(self._checkpoint_path, site="checkpoint")
            self._checkpointed = (-1, -1)
            return error
        return None

    def _open_degraded(self, failure: OSError) -> None:
        """Opening could not write everything (a full disk): serve reads, refuse appends, and
        let the flusher finish the job once the disk takes writes."""
        reason = describe_write_failure(failure)
        log.error("%s; the store opened all the same: reads are served, appends are refused "
                  "until then", reason)
        self._progress.degrade(StoreDegradedError(reason, failure.errno))

    def _finish_open(self) -> None:
        """Write what opening could not: the keys recovery put off, the queue entries it kept
        in memory, a checkpoint. Runs on the flusher thread, retried until it succeeds, before
        any new record is written (appends are refused until then)."""
        with self._cycle_lock:
            self.dispatcher.index_deferred()
        self._write_checkpoint(clean=False)

    def close(self) -> None:
        """Drain and fsync everything, write a clean checkpoint, release the directory."""
        with self._buffer.lock:
            if self._closed:
                return
            self._closed = True
        self._checkpointer.stop()
        self._flusher.stop()
        self._progress.close()
        if self._progress.degraded is None:
            try:
                self._write_checkpoint(clean=True)
            except OSError as error:
                log.error("could not write the shutdown checkpoint (%s); the next start replays "
                          "the log from the last checkpoint", describe_write_failure(error))
        else:
            log.error("closing a store that cannot write (%s); the next start recovers from the "
                      "log", self._progress.degraded)
        self.consume_queues.close()
        self.key_index.close()
        self.log.close()
        os.close(self._lock_fd)

    def __enter__(self) -> FileStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _lock_directory(directory: str) -> int:
    fd = fileops.open_file(os.path.join(directory, "LOCK"), os.O_RDWR | os.O_CREAT, site="store")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StoreLockedError(f"{directory} is in use by another store process; stop it first "
                               "or read it with store.reader.StoreReader") from None
    return fd
