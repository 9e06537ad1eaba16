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
- ``maxRecordsPerPartition``: records per partition (default 1,000,000): a large backfill of
  one queue is split into several partitions that read in parallel.
- ``maxOffsetsPerTrigger`` (streaming): at most this many records per micro-batch.

One partition per queue range; ``read`` opens the store lazily on the executor and yields Arrow
record batches. Packed native batches (``sluice.batch``) become one row per body, with their
index in ``batch_index``. Filters are options, never ``pushFilters``: PySpark 4.3 reuses pushed
filters in later queries on the same DataFrame.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import (DataSource, DataSourceReader, DataSourceStreamReader,
                                    InputPartition)
from pyspark.sql.streaming.datasource import (ReadAllAvailable, ReadLimit, ReadMaxRows,
                                              SupportsTriggerAvailableNow)
from pyspark.sql.types import StructType

from protocols.native.sdk.packing import BATCH_PROPERTY, unpack_bodies

from .remote import RemoteTopicNotFound, Row, client_config
from .remote import queue_ranges as remote_queue_ranges
from .remote import read_range as remote_read_range

SCHEMA = ("topic STRING, queue INT, offset BIGINT, batch_index INT, msg_id STRING, "
          "keys ARRAY<STRING>, tag STRING, subject STRING, properties MAP<STRING, STRING>, "
          "body BINARY, born_ts TIMESTAMP, store_ts TIMESTAMP")
SUBJECT_PROPERTY = "sluice.subject"
EARLIEST, LATEST = -2, -1
DEFAULT_PARTITION_RECORDS = 1_000_000
READ_BATCH = 4096
ARROW_SCHEMA = pa.schema([
    ("topic", pa.string()), ("queue", pa.int32()), ("offset", pa.int64()),
    ("batch_index", pa.int32()), ("msg_id", pa.string()), ("keys", pa.list_(pa.field("element", pa.string()))),
    ("tag", pa.string()), ("subject", pa.string()), ("properties", pa.map_(pa.string(), pa.string())),
    ("body", pa.binary()), ("born_ts", pa.timestamp("us", tz="UTC")),
    ("store_ts", pa.timestamp("us", tz="UTC")),
])
"""Exactly the Arrow types Spark expects for ``SCHEMA`` (it refuses any other)."""


class SourceError(ValueError):
    """Options that do not describe something readable; the message says what to change."""


@dataclass(frozen=True)
class QueueRange(InputPartition):
    """Records ``[start, end)`` of one queue of one topic."""

    topic: str
    queue: int
    start: int
    end: int


class SluiceDataSource(DataSource):
    """``format("sluice")``: Sluice topics as rows."""

    @classmethod
    def name(cls) -> str:
        return "sluice"

    def schema(self) -> str:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return SluiceBatchReader(self.options)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return SluiceStreamReader(self.options)


class SluiceBatchReader(DataSourceReader):
    """Plans queue ranges on the driver; ``read`` runs on executors and holds no state."""

    def __init__(self, given: Mapping[str, str]) -> None:
        options = {key.lower(): value for key, value in given.items()}  # Spark's keys are case-blind
        self.path = options.get("path") or ""
        self.remote = client_config(options) if options.get("endpoint") else None
        if not self.path and self.remote is None:
            raise SourceError("give the data directory, spark.read.format('sluice').load(PATH), "
                              "or a broker, .option('endpoint', 'host:8081')")
        self.topics = [t.strip() for t in options.get("subscribe", "").split(",") if t.strip()]
        if not self.topics:
            raise SourceError("option 'subscribe' names no topic: .option('subscribe', 'devices')")
        self.starting = _offsets_option(options.get("startingoffsets", "earliest"), "startingOffsets")
        self.ending = _offsets_option(options.get("endingoffsets", "latest"), "endingOffsets")
        self.partition_records = int(options.get("maxrecordsperpartition", DEFAULT_PARTITION_RECORDS))

    def partitions(self) -> list[QueueRange]:
        ranges = []
        for (topic, queue), (earliest, latest) in self.queue_ranges().items():
            start = _resolve(self.starting, topic, queue, EARLIEST, earliest, latest)
            end = _resolve(self.ending, topic, queue, LATEST, earliest, latest)
            ranges += _split(topic, queue, start, end, self.partition_records)
        return ranges

    def queue_ranges(self, store=None) -> dict[tuple[str, int], tuple[int, int]]:
        """(topic, queue) -> (earliest, end) for every queue of the subscribed topics, from the
        broker or from ``store`` (a StoreReader; one is opened for the call if None)."""
        if self.remote is not None:
            try:
                return remote_queue_ranges(self.remote, self.topics)
            except RemoteTopicNotFound as missing:
                raise SourceError(f"topic {missing.args[0]!r} does not exist on the broker at "
                                  f"{self.remote.endpoint}") from None
        from store.reader import StoreReader

        reader = store if store is not None else StoreReader(self.path)
        try:
            return _queue_ranges(reader, self.topics, self.path)
        finally:
            if store is None:
                reader.close()

    def read(self, partition: QueueRange) -> Iterator[pa.RecordBatch]:
        if self.remote is None:
            return _local_batches(self.path, partition)
        rows = remote_read_range(self.remote, partition.topic, partition.queue, partition.start,
                                 partition.end, READ_BATCH)
        return (_record_batch(partition, chunk) for chunk in rows)


Offsets = dict[str, dict[str, int]]
"""A streaming position: topic -> queue id (as text) -> next offset, keys in sorted order
(Spark compares offsets as JSON text)."""


class SluiceStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches of new messages. The driver opens the store once and asks it for each
    queue's end on every trigger (a constant-time look, not a scan); ``read`` runs on
    executors exactly like the batch reader's. Offsets are per queue, so a restart from a
    checkpoint replays an uncommitted batch with the same bounds: nothing is read twice or
    skipped (exactly once with an idempotent sink). ``maxOffsetsPerTrigger`` caps a batch."""

    def __init__(self, given: Mapping[str, str]) -> None:
        options = {key.lower(): value for key, value in given.items()}
        self.batch = SluiceBatchReader(options)
        self.max_per_trigger = int(options["maxoffsetspertrigger"]) \
            if "maxoffsetspertrigger" in options else None
        self._store = None
        self._target: Offsets | None = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_store": None}  # executors open their own

    def _ranges(self) -> dict[tuple[str, int], tuple[int, int]]:
        if self.batch.remote is not None:
            return self.batch.queue_ranges()
        from store.reader import StoreReader

        if self._store is None:
            self._store = StoreReader(self.batch.path)
        else:
            self._store.refresh()
        return self.batch.queue_ranges(self._store)

    def initialOffset(self) -> Offsets:
        offsets: Offsets = {}
        for (topic, queue), (earliest, latest) in self._ranges().items():
            offset = _resolve(self.batch.starting, topic, queue, EARLIEST, earliest, latest)
            offsets.setdefault(topic, {})[str(queue)] = offset
        return _ordered(offsets)

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_per_trigger) if self.max_per_trigger else ReadAllAvailable()

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

    def partitions(self, start: Offsets, end: Offsets) -> list[QueueRange]:
        ranges: list[QueueRange] = []
        for topic, queues in end.items():
            for queue, stop in queues.items():
                begin = start.get(topic, {}).get(queue, 0)
                ranges += _split(topic, int(queue), begin, stop, self.batch.partition_records)
        return ranges

    def read(self, partition: QueueRange) -> Iterator[pa.RecordBatch]:
        return self.batch.read(partition)

    def commit(self, end: Offsets) -> None:
        """Nothing to do: Spark's checkpoint holds the position."""

    def stop(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None


def _queue_ranges(reader, topics: list[str], path: str) -> dict[tuple[str, int], tuple[int, int]]:
    """(topic, queue) -> (earliest, end) for every queue of ``topics``; SourceError for a topic
    with no messages at all."""
    present: dict[str, list[int]] = {}
    for topic, queue in reader.queues():
        present.setdefault(topic, []).append(queue)
    ranges = {}
    for topic in topics:
        if topic not in present:
            raise SourceError(f"topic {topic!r} has no messages in {path}; topics there: "
                              f"{', '.join(sorted(present)) or 'none'}")
        for queue in sorted(present[topic]):
            ranges[(topic, queue)] = reader.queue_range(topic, queue)
    return ranges


def _split(topic: str, queue: int, start: int, end: int, size: int) -> list[QueueRange]:
    return [QueueRange(topic, queue, low, min(end, low + size)) for low in range(start, end, size)]


def _ordered(offsets: Offsets) -> Offsets:
    return {topic: dict(sorted(queues.items(), key=lambda item: int(item[0])))
            for topic, queues in sorted(offsets.items())}


def _local_batches(path: str, partition: QueueRange) -> Iterator[pa.RecordBatch]:
    """The rows of one queue range, read on an executor with its own store reader and decoded
    a run of records at a time (columnar.py)."""
    from store.reader import StoreReader

    from .columnar import record_batch  # imports this module, and numpy: executors only

    reader = StoreReader(path)
    try:
        offset = partition.start
        while offset < partition.end:
            runs = reader.read_runs(partition.topic, partition.queue, offset,
                                    min(READ_BATCH, partition.end - offset))
            if not runs:
                break
            for run in runs:
                yield record_batch(run, partition.topic, partition.queue, offset)
                offset += len(run.positions)
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


def _offsets_option(text: str, option: str) -> dict | int:
    """``earliest``/``latest`` as a default for every queue, or the per-queue JSON object."""
    value = text.strip()
    if value == "earliest":
        return EARLIEST
    if value == "latest":
        return LATEST
    try:
        parsed = json.loads(value)
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict) or not all(isinstance(q, dict) for q in parsed.values()):
        raise SourceError(f"{option} must be 'earliest', 'latest' or JSON like "
                          f'{{"devices": {{"0": 42}}}}, not {text!r}')
    return {topic: {str(queue): int(offset) for queue, offset in queues.items()}
            for topic, queues in parsed.items()}


def _resolve(spec: dict | int, topic: str, queue: int, default: int, earliest: int, latest: int) -> int:
    """A concrete offset in ``[earliest, latest]`` for one queue."""
    wanted = spec if isinstance(spec, int) else spec.get(topic, {}).get(str(queue), default)
    if wanted == EARLIEST:
        return earliest
    if wanted == LATEST:
        return latest
    return min(max(wanted, earliest), latest)
