"""The ``sluice`` PySpark data source: topics of a Sluice data directory as a DataFrame.

``spark.read.format("sluice").option("subscribe", "devices,alerts").load("/var/lib/sluice")``
reads through the store reader (no broker needed; it may run beside one), and so does
``spark.readStream`` with the same options. With ``option("endpoint", "host:8081")`` (and
``user``/``password``, default sluice/sluice) and no path, it reads a running broker over the
native pull API instead. Options follow Spark's Kafka source where one exists:

- ``subscribe``: comma-separated topics (required).
- ``startingOffsets`` / ``endingOffsets``: ``earliest``, ``latest``, or per-queue JSON such as
  ``{"devices": {"0": 10, "1": -2}}`` (-2 earliest, -1 latest; queues left out use the default:
  earliest for the start, latest for the end). The end is exclusive.
- ``startingTimestamp`` / ``endingTimestamp`` (ms since the epoch): each queue from (or up to)
  its first message stored at or after that time; they take precedence over the offsets.
  ``endingTimestamp`` is for batch reads.
- ``queues``: comma-separated queue ids (default: every queue of each topic).
- ``subjectPattern``: only rows whose subject matches this MQTT-style filter
  (``devices/+/telemetry``, ``devices/#``).
- ``maxRecordsPerPartition``: records per partition (default 1,000,000): a large backfill of
  one queue is split into several partitions that read in parallel.
- ``maxOffsetsPerTrigger`` (streaming): at most this many records per micro-batch.

A schema given with ``.schema("subject STRING, body BINARY")`` picks a subset of the columns
(by name, with the source's types): Spark then converts only those. One partition per queue
range, and short ranges share one (a micro-batch is then one task, not one per queue);
``read`` opens the store lazily on the executor and yields Arrow record batches. Packed native
batches (``sluice.batch``) become one row per body, with their index in ``batch_index``.
Offsets below the local store's start that the data directory's tier holds (``tier.json``,
docs/tier-layout.md) are read from its Parquet files with pyarrow, one partition per file
range; ``analytics.register(spark)`` plans those ranges as Spark's own Parquet scan instead
(planner.py). Filters are options, never ``pushFilters``: PySpark 4.3 reuses pushed filters in later queries
on the same DataFrame.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (DataSource, DataSourceReader, DataSourceStreamReader,
                                    InputPartition)
from pyspark.sql.streaming.datasource import (ReadAllAvailable, ReadLimit, ReadMaxRows,
                                              SupportsTriggerAvailableNow)
from pyspark.sql.types import StructType

from sluice.client.packing import BATCH_PROPERTY, unpack_bodies
from store.tier.objects import TierLocation

from .options import EARLIEST, LATEST, SourceError, SourceOptions, parse_options
from .remote import RemoteTopicNotFound, Row
from .remote import offsets_for_time as remote_offsets_for_time
from .remote import queue_ranges as remote_queue_ranges
from .remote import read_range as remote_read_range
from .schema import ARROW_SCHEMA, SCHEMA, SUBJECT_PROPERTY
from .tiered import Tier, open_tier, read_range

log = logging.getLogger(__name__)

__all__ = ["ARROW_SCHEMA", "SCHEMA", "SUBJECT_PROPERTY", "QueueRange", "SharedRanges",
           "SluiceBatchReader", "SluiceDataSource", "SluiceStreamReader", "SourceError", "TierRange"]

READ_BATCH = 4096
SHARE_BELOW = 16_384
"""Queue ranges shorter than this share a partition, up to this many records in all."""


@dataclass(frozen=True)
class QueueRange(InputPartition):
    """Records ``[start, end)`` of one queue of one topic."""

    topic: str
    queue: int
    start: int
    end: int


@dataclass(frozen=True)
class TierRange(InputPartition):
    """Records ``[start, end)`` of one queue of one topic held by one tiered data file."""

    topic: str
    queue: int
    start: int
    end: int
    location: TierLocation
    key: str
    home: str
    """The topic the file belongs to (another one's when its rows were fanned out to this)."""


@dataclass(frozen=True)
class SharedRanges(InputPartition):
    """Several short queue ranges read by one task, in order."""

    ranges: tuple[QueueRange, ...]


Partition = QueueRange | SharedRanges | TierRange
QueueKey = tuple[str, int]


class SluiceDataSource(DataSource):
    """``format("sluice")``: Sluice topics as rows."""

    @classmethod
    def name(cls) -> str:
        return "sluice"

    def schema(self) -> str:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return SluiceBatchReader(self.options, schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return SluiceStreamReader(self.options, schema)


class SluiceBatchReader(DataSourceReader):
    """Plans queue ranges on the driver; ``read`` runs on executors and holds no state."""

    def __init__(self, given: Mapping[str, str], schema: StructType | None = None) -> None:
        self.options: SourceOptions = parse_options(given, schema)

    def partitions(self) -> list[Partition]:
        tier = self.tier()
        return plan(self.bounds(tier), tier, self.options.partition_records)

    def bounds(self, tier: Tier | None) -> dict[QueueKey, tuple[int, int]]:
        """(topic, queue) -> the ``[start, end)`` the options ask for, for every selected queue."""
        ranges = self.queue_ranges(tier=tier)
        starts = self.offsets_at(self.options.starting_ms, ranges)
        ends = self.offsets_at(self.options.ending_ms, ranges)
        bounds = {}
        for (topic, queue), (earliest, latest) in ranges.items():
            start = starts[(topic, queue)] if starts else _resolve(
                self.options.starting, topic, queue, EARLIEST, earliest, latest)
            end = ends[(topic, queue)] if ends else _resolve(
                self.options.ending, topic, queue, LATEST, earliest, latest)
            bounds[(topic, queue)] = (start, max(start, end))
        return bounds

    def tier(self) -> Tier | None:
        """The data directory's tier at its newest manifest (None: not tiered, or a broker)."""
        return None if self.options.remote is not None else open_tier(self.options.path)

    def queue_ranges(self, store=None, streaming: bool = False,
                     tier: Tier | None = None) -> dict[QueueKey, tuple[int, int]]:
        """(topic, queue) -> (earliest, end) for every selected queue of the subscribed topics,
        from the broker or from ``store`` (a StoreReader; one is opened for the call if None)
        and ``tier`` (its offsets count as the queue's). A topic with no messages in a data
        directory is an error for a batch; a stream just has no queues of it yet (it reads
        them from their first message once they appear)."""
        options = self.options
        if options.remote is not None:
            try:
                ranges = remote_queue_ranges(options.remote, list(options.topics))
            except RemoteTopicNotFound as missing:
                raise SourceError(f"topic {missing.args[0]!r} does not exist on the broker at "
                                  f"{options.remote.endpoint}") from None
        else:
            with _opened(options.path, store) as reader:
                ranges = _queue_ranges(reader, options.topics, options.path, streaming,
                                       tier.spans() if tier is not None else {})
        if options.queues is None:
            return ranges
        chosen = {key: span for key, span in ranges.items() if key[1] in options.queues}
        if streaming:  # the chosen queues of a topic may not exist yet
            return chosen
        for topic in options.topics:
            if not any(key[0] == topic for key in chosen):
                present = sorted(queue for name, queue in ranges if name == topic)
                raise SourceError(f"topic {topic!r} has none of the queues {sorted(options.queues)}; "
                                  f"its queues are {present}")
        return chosen

    def offsets_at(self, timestamp_ms: int | None, ranges: Mapping[QueueKey, tuple[int, int]],
                   store=None) -> dict[QueueKey, int]:
        """Each queue's first offset stored at or after ``timestamp_ms`` (empty for None)."""
        if timestamp_ms is None:
            return {}
        if self.options.remote is not None:
            return remote_offsets_for_time(self.options.remote, list(ranges), timestamp_ms)
        with _opened(self.options.path, store) as reader:
            return {key: reader.offset_for_time(*key, timestamp_ms) for key in ranges}

    def read(self, partition: Partition) -> Iterator[pa.RecordBatch]:
        ranges: tuple[QueueRange | TierRange, ...] = (
            partition.ranges if isinstance(partition, SharedRanges) else (partition,))
        options = self.options
        build = options.columns  # plus the subject, when rows are filtered on it
        if options.subject_regex is not None and "subject" not in build:
            build = (*build, "subject")
        for one in ranges:
            if isinstance(one, TierRange):
                batches = read_range(one.location, one.key, one.home, one.topic, one.queue, one.start,
                                     one.end, build)
            elif options.remote is None:
                batches = _local_batches(options.path, one, build)
            else:
                rows = remote_read_range(options.remote, one.topic, one.queue, one.start, one.end,
                                         READ_BATCH)
                batches = (_record_batch(one, chunk).select(build) for chunk in rows)
            for batch in batches:
                if options.subject_regex is not None:
                    batch = batch.filter(pc.fill_null(
                        pc.match_substring_regex(batch.column("subject"), options.subject_regex), False))
                yield batch if build == options.columns else batch.select(options.columns)


@contextmanager
def _opened(path: str, store=None) -> Iterator:
    """``store`` if given, else a StoreReader on ``path`` closed afterwards."""
    if store is not None:
        yield store
        return
    from store import StoreReader

    reader = StoreReader(path)
    try:
        yield reader
    finally:
        reader.close()


Offsets = dict[str, dict[str, int]]
"""A streaming position: topic -> queue id (as text) -> next offset, keys in sorted order
(Spark compares offsets as JSON text)."""


class SluiceStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches of new messages. The driver opens the store once and asks it for each
    queue's end on every trigger (a constant-time look, not a scan); ``read`` runs on
    executors exactly like the batch reader's. Offsets are per queue, so a restart from a
    checkpoint replays an uncommitted batch with the same bounds: nothing is read twice or
    skipped (exactly once with an idempotent sink). ``maxOffsetsPerTrigger`` caps a batch."""

    def __init__(self, given: Mapping[str, str], schema: StructType | None = None) -> None:
        self.batch = SluiceBatchReader(given, schema)
        if self.batch.options.ending_ms is not None:
            raise SourceError("endingTimestamp is for batch reads; a stream has no end")
        self._store = None
        self._tier: Tier | None = None
        self._target: Offsets | None = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_store": None, "_tier": None}  # executors open their own

    def _ranges(self) -> dict[QueueKey, tuple[int, int]]:
        if self.batch.options.remote is not None:
            return self.batch.queue_ranges()
        from store import StoreReader

        if self._store is None:
            self._store = StoreReader(self.batch.options.path)
        else:
            self._store.refresh()
        self._tier = self.batch.tier()
        return self.batch.queue_ranges(self._store, streaming=True, tier=self._tier)

    def initialOffset(self) -> Offsets:
        ranges = self._ranges()
        starts = self.batch.offsets_at(self.batch.options.starting_ms, ranges, self._store)
        offsets: Offsets = {}
        for (topic, queue), (earliest, latest) in ranges.items():
            offset = starts[(topic, queue)] if starts else _resolve(
                self.batch.options.starting, topic, queue, EARLIEST, earliest, latest)
            offsets.setdefault(topic, {})[str(queue)] = offset
        return _ordered(offsets)

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self.batch.options.max_per_trigger
        return ReadMaxRows(limit) if limit else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._ends()

    def _ends(self) -> Offsets:
        ends: Offsets = {}
        for (topic, queue), (_, latest) in self._ranges().items():
            ends.setdefault(topic, {})[str(queue)] = latest
        return ends

    def latestOffset(self, start: Offsets, limit: ReadLimit) -> Offsets:
        ends = self._target if self._target is not None else self._ends()
        budget = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        latest: Offsets = {}
        for topic, queues in ends.items():
            for queue, end in sorted(queues.items(), key=lambda item: int(item[0])):
                begin = start.get(topic, {}).get(queue, 0)
                if budget is not None:
                    take = max(0, min(end - begin, budget))
                    budget -= take
                    end = begin + take
                latest.setdefault(topic, {})[queue] = max(begin, end)
        for topic, queues in start.items():  # queues that vanished (retention) keep their place
            for queue, offset in queues.items():
                latest.setdefault(topic, {}).setdefault(queue, offset)
        return _ordered(latest)

    def partitions(self, start: Offsets, end: Offsets) -> list[Partition]:
        bounds = {(topic, int(queue)): (start.get(topic, {}).get(queue, 0), stop)
                  for topic, queues in end.items() for queue, stop in queues.items()}
        tier = self._tier if self._tier is not None or self.batch.options.remote else self.batch.tier()
        return plan(bounds, tier, self.batch.options.partition_records)

    def read(self, partition: Partition) -> Iterator[pa.RecordBatch]:
        return self.batch.read(partition)

    def commit(self, end: Offsets) -> None:
        """Nothing to do: Spark's checkpoint holds the position."""

    def stop(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None


_WARNED_EMPTY: set[tuple[str, str]] = set()
"""(data directory, topic) pairs already warned about having no messages."""


def _queue_ranges(reader, topics: tuple[str, ...], path: str, waiting: bool = False,
                  tiered: Mapping[QueueKey, tuple[int, int]] | None = None) -> dict[QueueKey, tuple[int, int]]:
    """(topic, queue) -> (earliest, end) for every queue of ``topics``, the ``tiered`` offsets
    included. A topic with no messages at all is a SourceError, or with ``waiting`` a warning
    (once per topic and process)."""
    tiered = tiered or {}
    present: dict[str, set[int]] = {}
    for topic, queue in [*reader.queues(), *tiered]:
        present.setdefault(topic, set()).add(queue)
    ranges = {}
    for topic in topics:
        if topic not in present:
            problem = (f"topic {topic!r} has no messages in {path}; topics there: "
                       f"{', '.join(sorted(present)) or 'none'}")
            if not waiting:
                raise SourceError(problem)
            if (path, topic) not in _WARNED_EMPTY:
                _WARNED_EMPTY.add((path, topic))
                log.warning("%s. The stream reads it once it has messages.", problem)
            continue
        for queue in sorted(present[topic]):
            earliest, end = reader.queue_range(topic, queue)
            if (topic, queue) in tiered:
                first, last = tiered[(topic, queue)]
                never_local = earliest == end == 0
                earliest, end = (first if never_local else min(earliest, first)), max(end, last)
            ranges[(topic, queue)] = (earliest, end)
    return ranges


def plan(bounds: Mapping[QueueKey, tuple[int, int]], tier: Tier | None, size: int) -> list[Partition]:
    """Partitions reading ``[start, end)`` of each queue: one per tiered file range for the
    offsets the tier holds, the rest from the local store in ranges of at most ``size``."""
    spans = tier.spans() if tier is not None else {}
    tiered: list[Partition] = []
    local: list[QueueRange] = []
    for (topic, queue), (start, end) in bounds.items():
        first, tier_end = spans.get((topic, queue), (start, start))
        if start < tier_end:
            low = max(start, first)
            for file in tier.files(topic, queue, low, min(end, tier_end)):
                span = next(s for s in file.queues if (s.topic, s.queue) == (topic, queue))
                piece = (max(low, span.first), min(end, tier_end, span.last + 1))
                if piece[0] < piece[1]:
                    tiered.append(TierRange(topic, queue, *piece, tier.location, file.key, file.topic))
            start = max(start, tier_end)
        local += _split(topic, queue, start, end, size)
    return tiered + _share(local, size)


def _split(topic: str, queue: int, start: int, end: int, size: int) -> list[QueueRange]:
    return [QueueRange(topic, queue, low, min(end, low + size)) for low in range(start, end, size)]


def _share(ranges: list[QueueRange], partition_records: int) -> list[Partition]:
    """Ranges shorter than ``SHARE_BELOW`` (and than ``partition_records``) grouped into
    partitions of at most that many records; longer ones keep a partition each."""
    limit = min(SHARE_BELOW, partition_records)
    partitions: list[Partition] = []
    group: list[QueueRange] = []
    for one in ranges:
        size = one.end - one.start
        if size >= limit:
            partitions.append(one)
            continue
        if group and sum(r.end - r.start for r in group) + size > limit:
            partitions.append(group[0] if len(group) == 1 else SharedRanges(tuple(group)))
            group = []
        group.append(one)
    if group:
        partitions.append(group[0] if len(group) == 1 else SharedRanges(tuple(group)))
    return partitions


def _ordered(offsets: Offsets) -> Offsets:
    return {topic: dict(sorted(queues.items(), key=lambda item: int(item[0])))
            for topic, queues in sorted(offsets.items())}


def _local_batches(path: str, partition: QueueRange, columns: tuple[str, ...]) -> Iterator[pa.RecordBatch]:
    """The rows of one queue range, read on an executor with its own store reader a run of
    records at a time, as columns (columnar.py)."""
    from store import StoreReader

    from .columnar import record_batch  # numpy: loaded on executors only

    reader = StoreReader(path)
    try:
        offset = partition.start
        while offset < partition.end:
            before = offset
            for records in reader.read_columns(partition.topic, partition.queue, offset,
                                               min(READ_BATCH, partition.end - offset)):
                yield record_batch(records, partition.topic, partition.queue, offset, columns)
                offset += len(records)
            if offset == before:
                break
    finally:
        reader.close()


def _record_batch(partition: QueueRange, rows: list[Row]) -> pa.RecordBatch:
    """One Arrow batch of rows read from a broker; a packed record gives one row per body."""
    columns: dict[str, list] = {name: [] for name in ARROW_SCHEMA.names}
    for offset, msg_id, keys, tag, properties, body, born_ms, store_ms in rows:
        count = properties.get(BATCH_PROPERTY)
        bodies = unpack_bodies(body) if count else [body]
        subject, pairs = properties.get(SUBJECT_PROPERTY), list(properties.items())
        for index, one in enumerate(bodies):
            columns["topic"].append(partition.topic)
            columns["queue"].append(partition.queue)
            columns["offset"].append(offset)
            columns["batch_index"].append(index if count else None)
            columns["msg_id"].append(msg_id)
            columns["keys"].append(keys)
            columns["tag"].append(tag or None)
            columns["subject"].append(subject)
            columns["properties"].append(pairs)
            columns["body"].append(one)
            columns["born_ts"].append(born_ms * 1000)
            columns["store_ts"].append(store_ms * 1000)
    return pa.RecordBatch.from_arrays([pa.array(columns[field.name], type=field.type)
                                       for field in ARROW_SCHEMA], schema=ARROW_SCHEMA)


def _resolve(spec: dict | int, topic: str, queue: int, default: int, earliest: int, latest: int) -> int:
    """A concrete offset in ``[earliest, latest]`` for one queue."""
    wanted = spec if isinstance(spec, int) else spec.get(topic, {}).get(str(queue), default)
    if wanted == EARLIEST:
        return earliest
    if wanted == LATEST:
        return latest
    return min(max(wanted, earliest), latest)
