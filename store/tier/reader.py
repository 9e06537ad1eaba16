"""TierReader: the records of tiered segments, read back from object storage.

Manifest-driven: only the files the newest manifest names are ever read (an object no
manifest names, such as one a crashed tiering step left, is never served). Records come back
as the commit log held them (rebuild.py). Footers and the row groups a read needs are fetched
with range gets and kept, decoded, in one cache bounded by bytes (files.py).
"""
from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import CorruptRecordError, OffsetOutOfRangeError, StoreError
from ..record import StoredMessage
from ..record_builder import generated_id_offset
from . import positions
from .files import ParquetObjects, cached_only
from .intervals import Intervals
from .manifest import Manifest, TieredFile, load_latest
from .objects import ObjectStore
from .positions import Positions
from .rebuild import TierDataError, rebuild
from .schema import DATA_SCHEMA, INDEX_SCHEMA

DATA_TYPES: dict[str, pa.DataType] = {field.name: field.type for field in DATA_SCHEMA}
"""The data file columns a reader relies on (``data`` is the body schema's, not checked)."""
_RECORD_COLUMNS = ("queue", "offset", "batch_index", "msg_id", "keys", "tag", "properties", "body",
                   "born_ts", "store_ts", "log_offset", "log_size", "dispatch")
INDEX_TYPES: dict[str, pa.DataType] = {field.name: field.type for field in INDEX_SCHEMA}


class MissingFromTier(CorruptRecordError):
    """A queue offset inside the tier's range that no tiered file holds: its record went with
    the files of its home topic (tier retention), or was lost to corruption before tiering.
    Like a corrupt record, it is skipped by reading on from the next offset."""

    def __init__(self, topic: str, queue: int, offset: int) -> None:
        reason = (f"queue offset {offset} of {topic}/{queue} is in no tiered file (its home topic's "
                  "tier retention removed it); read on from the next offset")
        StoreError.__init__(self, reason)
        self.offset, self.segment, self.reason = -1, "", reason


@dataclass(frozen=True)
class _Catalog:
    """What one manifest names, arranged for lookups."""

    manifest: Manifest | None
    queues: dict[tuple[str, int], Intervals[TieredFile]]
    by_log: Intervals[TieredFile]
    keys: frozenset[str]

    @classmethod
    def of(cls, manifest: Manifest | None) -> _Catalog:
        files = manifest.files if manifest else ()
        spans: dict[tuple[str, int], list[tuple[int, int, TieredFile]]] = {}
        for file in files:
            for span in file.queues:
                spans.setdefault((span.topic, span.queue), []).append((span.first, span.last, file))
        keys = {file.key for file in files} | {segment.index_key for segment in (manifest.segments if manifest else ())}
        return cls(manifest, {queue: Intervals(found) for queue, found in spans.items()},
                   Intervals((file.log_first, file.log_last, file) for file in files), frozenset(keys))


class TierReader:
    """Reads the tier in ``objects``; thread-safe."""

    def __init__(self, objects: ObjectStore, cache_bytes: int = 256 << 20) -> None:
        self.objects = objects
        self._files = ParquetObjects(objects, cache_bytes)
        self._catalog = _Catalog.of(None)
        self._lock = threading.Lock()

    @property
    def manifest(self) -> Manifest | None:
        """The manifest reads follow (None: nothing tiered, or not loaded yet)."""
        return self._catalog.manifest

    @property
    def cache_size(self) -> int:
        """Bytes of decoded objects cached now (at most ``cache_bytes``)."""
        return self._files.cache.size

    @staticmethod
    def cached_only() -> cached_only:
        """A context: within it, on this thread, a read that would fetch from object storage
        raises TierFetchNeeded instead of waiting (``files.cached_only``)."""
        return cached_only()

    def refresh(self) -> None:
        """Load the newest manifest (ObjectStoreError when the object store cannot be read)."""
        manifest = load_latest(self.objects)
        if manifest is not None:
            self.set_manifest(manifest)

    def set_manifest(self, manifest: Manifest) -> None:
        """Follow ``manifest`` (an older version than the one followed is ignored)."""
        with self._lock:
            current = self._catalog.manifest
            if current is not None and manifest.version <= current.version:
                return
            catalog = _Catalog.of(manifest)
            self._catalog = catalog
        self._files.forget(lambda key: key in catalog.keys)

    def queues(self) -> list[tuple[str, int]]:
        """Every (topic, queue id) with tiered messages."""
        return sorted(self._catalog.queues)

    def queue_start(self, topic: str, queue: int) -> int | None:
        """The first tiered offset of a queue; None when none of it is tiered."""
        spans = self._catalog.queues.get((topic, queue))
        return spans.start if spans else None

    def queue_end(self, topic: str, queue: int) -> int | None:
        """One past the last tiered offset of a queue; None when none of it is tiered."""
        spans = self._catalog.queues.get((topic, queue))
        return spans.end if spans else None

    def read(self, topic: str, queue: int, queue_offset: int, max_count: int = 32,
             max_bytes: int = 4 << 20) -> list[StoredMessage]:
        """Tiered messages of a queue (home or fanned out to) from ``queue_offset`` on, as
        ``StoreView.read`` returns them: empty past the tiered end, OffsetOutOfRangeError below
        the tiered start, at least one message when any, then up to ``max_bytes``. Stops before
        an offset the tier lacks; CorruptRecordError when that is ``queue_offset`` itself."""
        spans = self._catalog.queues.get((topic, queue))
        if not spans or max_count <= 0 or queue_offset >= spans.end:
            return []
        if queue_offset < spans.start:
            raise OffsetOutOfRangeError(topic, queue, queue_offset, spans.start, spans.end)
        picked = self._pick(spans, topic, queue, queue_offset, max_count, max_bytes)
        if not picked:
            raise MissingFromTier(topic, queue, queue_offset)
        records: dict[tuple[str, int], StoredMessage] = {}
        for file in {file.key: file for _, file, _ in picked}.values():
            found = self._records(file, [log for _, holder, log in picked if holder is file])
            records.update(((file.key, log), message) for log, message in found.items())
        out = []
        for offset, file, log in picked:
            message = records.get((file.key, log))
            if message is None or not _holds(message, topic, queue, offset):
                raise TierDataError(file.key, f"it has no record for offset {offset} of {topic}/{queue} "
                                              f"at log offset {log}")
            out.append(message)
        return out

    def _pick(self, spans: Intervals[TieredFile], topic: str, queue: int, start: int, count: int,
              budget: int) -> list[tuple[int, TieredFile, int]]:
        """(queue offset, file, log offset) of the contiguous run of offsets a read returns."""
        found: list[tuple[int, TieredFile, int, int]] = []
        for _, _, file in spans.meeting(start, start + count - 1):
            where = self._positions(file).get((topic, queue))
            if where is None:
                continue
            low, high = np.searchsorted(where.offsets, [start, start + count])
            found += zip(where.offsets[low:high].tolist(), [file] * int(high - low),
                         where.logs[low:high].tolist(), where.sizes[low:high].tolist())
        found.sort(key=lambda row: row[0])
        picked: list[tuple[int, TieredFile, int]] = []
        for offset, file, log, size in found:
            if offset < start + len(picked):
                continue  # the same record twice (hostile file): the first is checked when read
            if offset > start + len(picked) or (picked and size > budget):
                break
            picked.append((offset, file, log))
            budget -= size
        return picked

    def _positions(self, file: TieredFile) -> dict[tuple[str, int], Positions]:
        def load() -> tuple[dict[tuple[str, int], Positions], int]:
            return positions.build(file, self._files.columns(file.key, positions.COLUMNS, DATA_TYPES))
        self._files.metadata(file.key, file.bytes)
        return self._files.cache.get_or_load(("positions", file.key), load)

    def _records(self, file: TieredFile, logs: list[int]) -> dict[int, StoredMessage]:
        """The records of ``file`` at the given log offsets (those it holds)."""
        meta = self._files.metadata(file.key, file.bytes)
        wanted = np.unique(np.asarray(logs, np.int64))
        rows: dict[int, dict[str, list]] = {}
        for group in _groups_holding(file.key, meta, "log_offset", int(wanted[0]), int(wanted[-1])):
            table = self._files.row_group(file.key, group, _RECORD_COLUMNS, DATA_TYPES)
            column = table.column("log_offset")
            if column.null_count:
                raise TierDataError(file.key, "column log_offset holds nulls")
            offsets = column.to_numpy()
            lows, highs = np.searchsorted(offsets, wanted), np.searchsorted(offsets, wanted + 1)
            present = np.flatnonzero(highs > lows)
            if not len(present):
                continue
            base = int(lows[present[0]])
            window = _columns(table.slice(base, int(highs[present[-1]]) - base))
            for index in present.tolist():
                part = rows.setdefault(int(wanted[index]), {})
                for name, values in window.items():
                    part.setdefault(name, []).extend(values[lows[index] - base:highs[index] - base])
        return {log: rebuild(file.topic, found, file.key) for log, found in rows.items()}

    def read_at(self, log_offset: int) -> StoredMessage:
        """The tiered record at a commit-log offset; KeyError when the tier holds none there."""
        for _, _, file in self._catalog.by_log.meeting(log_offset, log_offset):
            found = self._records(file, [log_offset]).get(log_offset)
            if found is not None:
                where = self._positions(file).get((found.topic, found.queue_id))
                index = np.searchsorted(where.offsets, found.queue_offset) if where is not None else 0
                if where is None or index == len(where.logs) or where.logs[index] != log_offset:
                    raise TierDataError(file.key, f"the record at log offset {log_offset} is not where "
                                                  "its queue offset says")
                return found
        raise KeyError(log_offset)

    def offset_for_time(self, topic: str, queue: int, timestamp_ms: int) -> int | None:
        """The first tiered queue offset stored at or after ``timestamp_ms``; None if none was."""
        spans = self._catalog.queues.get((topic, queue))
        best: int | None = None
        for first, _, file in spans.meeting(spans.start, spans.end) if spans else ():
            if best is not None and first >= best:
                break
            if file.store_ts_max < timestamp_ms:
                continue
            where = self._positions(file).get((topic, queue))
            if where is None:
                continue
            hits = np.flatnonzero(where.stamps >= timestamp_ms)
            if len(hits):
                best = min(int(where.offsets[hits[0]]), best if best is not None else 1 << 63)
        return best

    def lookup_id(self, msg_id: str, topics: Iterable[str], limit: int = 16) -> list[StoredMessage]:
        """Tiered messages of ``topics`` whose id is ``msg_id``, newest first, at most ``limit``
        of each topic (ids chosen by producers, and the one the store generated)."""
        wanted = set(topics)
        found: dict[int, StoredMessage] = {}
        counts = dict.fromkeys(wanted, 0)
        for log, topic in self._hits("id", msg_id, None, None):
            if topic in wanted and counts[topic] < limit:
                message = self._verified(log, lambda m: m.msg_id == msg_id and m.topic == topic)
                if message is not None:
                    found[log] = message
                    counts[topic] += 1
        generated = generated_id_offset(msg_id)
        if generated is not None and generated not in found:
            message = self._verified(generated, lambda m: m.msg_id == msg_id and m.topic in wanted)
            if message is not None:
                found[generated] = message
        return sorted(found.values(), key=lambda message: message.phys_offset, reverse=True)

    def lookup_key(self, topic: str, key: str, limit: int = 32, since_ms: int | None = None,
                   before: int | None = None) -> list[StoredMessage]:
        """Tiered messages of ``topic`` carrying business key ``key``, newest first; with
        ``since_ms`` only those stored then or later, with ``before`` only those below that log
        offset."""
        out: list[StoredMessage] = []
        for log, found_topic in self._hits("key", key, since_ms, before):
            if len(out) == limit:
                break
            if found_topic == topic:
                message = self._verified(log, lambda m: m.topic == topic and key in m.keys)
                if message is not None:
                    out.append(message)
        return out

    def _verified(self, log: int, matches) -> StoredMessage | None:
        """The record at ``log`` if the manifest still names its file and ``matches`` accepts it."""
        try:
            message = self.read_at(log)
        except KeyError:
            return None
        return message if matches(message) else None

    def _hits(self, kind: str, value: str, since_ms: int | None, before: int | None) -> Iterator[tuple[int, str]]:
        """(log offset, topic) of the index entries of ``value``, newest first."""
        catalog = self._catalog
        segments = sorted(catalog.manifest.segments if catalog.manifest else (), key=lambda s: s.base, reverse=True)
        newest = {}
        for file in catalog.manifest.files if catalog.manifest else ():
            newest[file.segment] = max(newest.get(file.segment, file.store_ts_max), file.store_ts_max)
        for segment in segments:
            if (before is not None and segment.base >= before) or (
                    since_ms is not None and newest.get(segment.base, since_ms) < since_ms):
                continue
            yield from self._index_hits(segment.index_key, kind, value, since_ms, before)

    def _index_hits(self, key: str, kind: str, value: str, since_ms: int | None,
                    before: int | None) -> list[tuple[int, str]]:
        meta = self._files.metadata(key)
        hits: list[tuple[int, str]] = []
        groups = set(_groups_holding(key, meta, "kind", kind, kind))
        for group in _groups_holding(key, meta, "value", value, value):
            if group not in groups:
                continue
            table = self._files.row_group(key, group, tuple(INDEX_TYPES), INDEX_TYPES)
            mask = pc.and_(pc.equal(table.column("kind"), kind), pc.equal(table.column("value"), value))
            if since_ms is not None:
                mask = pc.and_(mask, pc.greater_equal(table.column("store_ts").cast(pa.int64()), since_ms * 1000))
            if before is not None:
                mask = pc.and_(mask, pc.less(table.column("log_offset"), before))
            rows = table.filter(pc.fill_null(mask, False))
            hits += zip(rows.column("log_offset").to_pylist(), rows.column("topic").to_pylist())
        return sorted((hit for hit in hits if hit[0] is not None and hit[1] is not None), reverse=True)

    def files_for(self, topic: str, queue: int | None, start: int, end: int) -> list[TieredFile]:
        """The tiered files holding offsets in [start, end) of a queue (every queue of the topic
        when ``queue`` is None), by first offset: what a reader of that range must read."""
        found: dict[str, TieredFile] = {}
        for (span_topic, span_queue), spans in sorted(self._catalog.queues.items()):
            if span_topic == topic and queue in (None, span_queue) and end > start:
                for _, _, file in spans.meeting(start, end - 1):
                    found.setdefault(file.key, file)
        return sorted(found.values(), key=lambda file: (file.log_first, file.key))


def _holds(message: StoredMessage, topic: str, queue: int, offset: int) -> bool:
    """Whether ``message`` sits at ``offset`` of queue (``topic``, ``queue``)."""
    if (message.topic, message.queue_id, message.queue_offset) == (topic, queue, offset):
        return True
    return (topic, queue, offset) in message.dispatch


def _columns(table: pa.Table) -> dict[str, list]:
    """``table``'s record columns as lists (timestamps as integer microseconds)."""
    out = {}
    for name in _RECORD_COLUMNS:
        column = table.column(name)
        out[name] = (column.cast(pa.int64()) if pa.types.is_timestamp(column.type) else column).to_pylist()
    return out


def _groups_holding(key: str, meta, name: str, low, high) -> list[int]:
    """Row groups whose statistics of column ``name`` may hold a value in [low, high]."""
    try:
        schema = meta.schema
        index = next((i for i in range(len(schema)) if schema.column(i).path == name), None)
        out = []
        for group in range(meta.num_row_groups):
            stats = meta.row_group(group).column(index).statistics if index is not None else None
            if stats is None or not stats.has_min_max or not (stats.max < low or stats.min > high):
                out.append(group)
        return out
    except (pa.ArrowException, TypeError, ValueError, IndexError, UnicodeError) as error:
        raise TierDataError(key, f"its row group statistics are unreadable ({error})") from None
