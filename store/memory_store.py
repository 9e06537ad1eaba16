"""MemoryStore: the store contract held in memory, for fast core tests. Nothing survives close.

Records are encoded exactly as FileStore encodes them (same builder, same offsets), kept in a
dict by commit-log offset, and grouped into virtual segments of ``segment_size`` bytes so that
retention removes whole segments just as it does on disk. Everything is durable at once.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext

from .api import (AppendResult, HealthListener, KeyCursor, KeyPage, Message, ProgressListener,
                  RetentionReport, StoreConfig)
from .record_builder import RecordBuilder, generated_id_offset
from .dispatcher import business_key, id_key
from .errors import (CorruptRecordError, InvalidCursorError, OffsetOutOfRangeError, RecordTooLargeError,
                     StoreClosedError, StoreError)
from .record import StoredMessage, decode
from .retention import expired_segments


class _Queue:
    __slots__ = ("min_offset", "entries")

    def __init__(self) -> None:
        self.min_offset = 0
        self.entries: list[int] = []  # commit-log offsets, index = queue offset - min_offset


class MemoryStore:
    """An in-memory implementation of ``store.api.Store``."""

    def __init__(self, config: StoreConfig = StoreConfig()) -> None:
        self.config = config
        self._lock = threading.Lock()
        self._records: dict[int, bytes] = {}
        self._segments: list[list[float]] = []  # [base, size, last write ms]
        self._end = 0
        self._queues: dict[tuple[str, int], _Queue] = {}
        self._keys: dict[bytes, list[int]] = {}
        self._compacted: set[str] = set()
        self._latest: dict[str, dict[str, int]] = {}  # compacted topic -> key -> commit-log offset
        self._builder = RecordBuilder({}, self._compacted)
        self._listeners: list[ProgressListener] = []
        self._encoded = bytearray()  # the record ``_place`` handed out last
        self._closed = False

    @property
    def durable_offset(self) -> int:
        return self._end

    @property
    def degraded(self) -> str | None:
        """Memory never fails a write: always None."""
        return None

    def add_health_listener(self, listener: HealthListener) -> None:
        """Never called: a memory store never turns degraded."""

    def _place(self, size: int) -> tuple[int, bytearray, int]:
        if size > self.config.segment_size:
            raise RecordTooLargeError(f"record of {size} bytes exceeds the segment size of "
                                      f"{self.config.segment_size} bytes")
        if not self._segments or self._segments[-1][1] + size > self.config.segment_size:
            self._segments.append([self._end, 0, 0.0])
        segment = self._segments[-1]
        segment[1] += size
        segment[2] = time.time() * 1000
        offset, self._end = self._end, self._end + size
        self._encoded = bytearray(size)
        return offset, self._encoded, 0

    def append(self, topic: str, body: bytes, *, queue_id: int = 0, tag: str = "",
               keys: Sequence[str] = (), properties: Mapping[str, str] | None = None,
               msg_id: str = "", born_ts: int = 0,
               extra_queues: Sequence[tuple[str, int]] = ()) -> AppendResult:
        return self.append_batch([Message(topic, body, queue_id, tag, keys, properties, msg_id,
                                          born_ts, extra_queues)])[0]

    def append_batch(self, messages: Sequence[Message]) -> list[AppendResult]:
        now = int(time.time() * 1000)
        with self._lock:
            if self._closed:
                raise StoreClosedError("the store is closed")
            results: list[AppendResult] = []
            try:
                for message in messages:
                    results.append(self._append_locked(message, now))
            except StoreError as error:
                error.appended = results
                raise
            end = self._end
        for listener in self._listeners:
            listener(end, end)
        return results

    def _append_locked(self, m: Message, now: int) -> AppendResult:
        request, result = self._builder.build(
            self._place, m.topic, m.body, m.queue_id, m.tag, m.keys, m.properties, m.msg_id,
            m.born_ts, m.extra_queues, now)
        phys, _, _, _, targets, index_keys = request
        self._records[phys] = bytes(self._encoded)
        for topic, queue_id, _ in targets:
            self._queues.setdefault((topic, queue_id), _Queue()).entries.append(phys)
        for key in index_keys:
            self._keys.setdefault(key, []).append(phys)
        for topic in {target[0] for target in targets}:  # the home topic and fan-out queues
            latest = self._latest.get(topic)
            if latest is not None:
                key = m.keys[0] if m.keys else ""
                latest.pop(key, None)
                if m.body:
                    latest[key] = phys
        return result

    def wait_durable(self, end_offset: int, timeout: float | None = None) -> bool:
        return end_offset <= self._end

    def wait_visible(self, end_offset: int, timeout: float | None = None) -> bool:
        return end_offset <= self._end

    def add_listener(self, listener: ProgressListener) -> None:
        self._listeners.append(listener)

    # -- reading -------------------------------------------------------------------------------

    def read(self, topic: str, queue_id: int, queue_offset: int, max_count: int = 32,
             max_bytes: int = 4 << 20) -> list[StoredMessage]:
        with self._lock:
            queue = self._queues.get((topic, queue_id))
            if queue is None:
                return []
            end = queue.min_offset + len(queue.entries)
            if not queue.min_offset <= queue_offset <= end:
                raise OffsetOutOfRangeError(topic, queue_id, queue_offset, queue.min_offset, end)
            first = queue_offset - queue.min_offset
            out: list[StoredMessage] = []
            for phys in queue.entries[first:first + max_count]:
                data = self._records[phys]
                if out and len(data) > max_bytes:
                    break
                max_bytes -= len(data)
                out.append(decode(data, 0, phys))
            return out

    def cached_only(self) -> AbstractContextManager[None]:
        """Nothing of this store is in object storage: every read is as usual."""
        return nullcontext()

    def queue_range(self, topic: str, queue_id: int) -> tuple[int, int]:
        queue = self._queues.get((topic, queue_id))
        return (queue.min_offset, queue.min_offset + len(queue.entries)) if queue else (0, 0)

    def queues(self) -> list[tuple[str, int]]:
        return sorted(self._queues)

    def offset_for_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        low, high = self.queue_range(topic, queue_id)
        for offset in range(low, high):
            if self.read(topic, queue_id, offset, 1)[0].store_ts >= timestamp_ms:
                return offset
        return high

    def read_at(self, phys_offset: int) -> StoredMessage:
        data = self._records.get(phys_offset)
        if data is None:
            raise CorruptRecordError(phys_offset, "no record there (deleted by retention or never written)")
        return decode(data, 0, phys_offset)

    def lookup_id(self, msg_id: str, topics: Iterable[str], limit: int = 16) -> list[StoredMessage]:
        wanted = set(topics)
        found = {m.phys_offset: m for topic in wanted
                 for m in self._find(id_key(topic, msg_id), limit, None, None).messages}
        offset = generated_id_offset(msg_id)
        if offset in self._records:
            generated = self.read_at(offset)
            if generated.msg_id == msg_id and generated.topic in wanted:
                found.setdefault(offset, generated)
        return sorted(found.values(), key=lambda message: message.phys_offset, reverse=True)

    def lookup_key(self, topic: str, key: str, limit: int = 32,
                   since_ms: int | None = None) -> list[StoredMessage]:
        return self._find(business_key(topic, key), limit, since_ms, None).messages

    def lookup_key_page(self, topic: str, key: str, limit: int,
                        after: KeyCursor | None = None) -> KeyPage:
        return self._find(business_key(topic, key), limit, None, after)

    def _find(self, key: bytes, limit: int, since_ms: int | None, after: KeyCursor | None) -> KeyPage:
        """Up to ``limit`` messages indexed under ``key``, newest first, older than ``after``.
        A cursor's entry is the 1-based position of its offset in the key's list."""
        offsets = self._keys.get(key, [])
        position = len(offsets)
        if after is not None:
            position = after.entry - 1
            if not (0 <= position < len(offsets) and offsets[position] == after.offset):
                raise InvalidCursorError(f"cursor {after.offset}.{after.entry} names no message "
                                         "with this key")
        out: list[StoredMessage] = []
        last: KeyCursor | None = None
        seen = after.offset if after is not None else -1
        for position in range(position - 1, -1, -1):
            phys = offsets[position]
            if phys == seen or phys not in self._records:
                continue  # a record naming the key twice; or removed by retention
            seen = phys
            message = self.read_at(phys)
            if since_ms is not None and message.store_ts < since_ms:
                continue
            if len(out) == limit:
                return KeyPage(out, last)
            out.append(message)
            last = KeyCursor(phys, position + 1)
        return KeyPage(out, None)

    # -- compaction and retention ------------------------------------------------------------

    def enable_compaction(self, topic: str) -> None:
        with self._lock:
            if topic not in self._compacted:
                self._compacted.add(topic)
                self._latest[topic] = {m.keys[0]: m.phys_offset for m in self._all_messages(topic) if m.body}

    def _all_messages(self, topic: str) -> list[StoredMessage]:
        offsets = sorted(phys for (name, _), queue in self._queues.items() if name == topic
                         for phys in queue.entries)
        return [decode(self._records[phys], 0, phys) for phys in offsets]

    def compact(self, topic: str) -> int:
        return len(self._latest.get(topic, ()))

    def compacted(self, topic: str) -> list[StoredMessage]:
        with self._lock:
            return [self.read_at(phys) for phys in sorted(self._latest.get(topic, {}).values())]

    def apply_retention(self, now_ms: int | None = None) -> RetentionReport:
        now = int(time.time() * 1000) if now_ms is None else now_ms
        with self._lock:
            segments = [(int(size), int(base + size), written) for base, size, written in self._segments]
            count = expired_segments(segments, self.config, now, self._end)
            report = RetentionReport()
            for _ in range(count):
                base, size, _ = self._segments.pop(0)
                report.deleted_segments.append(f"{int(base):020d}")
                report.deleted_bytes += int(size)
            log_min = int(self._segments[0][0]) if self._segments else self._end
            report.log_min_offset = log_min
            if count:
                self._forget_before(log_min)
            return report

    def _forget_before(self, log_min: int) -> None:
        """Drop records, queue entries and keys below ``log_min``; keep compacted topics' newest."""
        keep = {phys for latest in self._latest.values() for phys in latest.values()}
        self._records = {phys: data for phys, data in self._records.items() if phys >= log_min or phys in keep}
        for queue in self._queues.values():
            dropped = next((i for i, phys in enumerate(queue.entries) if phys >= log_min), len(queue.entries))
            queue.min_offset += dropped
            del queue.entries[:dropped]

    def close(self) -> None:
        self._closed = True

    def __enter__(self) -> MemoryStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
