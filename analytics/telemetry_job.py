"""The telemetry job: device readings from the ``sluice`` source to per-device window aggregates.

``parse`` turns message bodies into readings and sets aside what is not a reading (bad JSON, a
missing field) with the reason; ``aggregate`` computes per-device tumbling windows (average,
minimum, maximum, count) and flags a window whose extremes stray from its average by more than
``anomaly_threshold``. Both work on batch and streaming DataFrames alike; ``start`` runs them as
streaming queries writing Parquet (aggregates partitioned by date), a quarantine, and
optionally the aggregates back into a Sluice topic, so MQTT, AMQP and native clients can
subscribe to them.
"""

from __future__ import annotations

import json
import os
import threading
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQueryListener

from .schema import SUBJECT_PROPERTY

READING_SCHEMA = "device STRING, ts BIGINT, temperature DOUBLE, humidity DOUBLE, battery DOUBLE"
SOURCE_COLUMNS = "topic STRING, queue INT, offset BIGINT, body BINARY, store_ts TIMESTAMP"
"""The source columns the job uses: declaring them spares Spark converting the others."""
REQUIRED = ("device", "ts", "temperature")
_CORRUPT = "_corrupt_record"


@dataclass(frozen=True)
class ResultsTopic:
    """Where aggregates are also published, as JSON messages keyed ``<device>@<window start>``.
    A window is published again whenever a micro-batch changes it (and when a batch is
    replayed after a restart): the newest message for a key is the window's value."""

    endpoint: str
    topic: str
    user: str = "sluice"
    password: str = "sluice"

    def publish(self, batch: DataFrame, batch_id: int) -> None:
        """``foreachBatch`` sink: runs on the driver, one request per 256 windows."""
        from sluice.client import ClientConfig, Message, SyncProducer

        rows = batch.drop("date").collect()
        if not rows:
            return
        config = ClientConfig(self.endpoint, access_key=self.user, secret_key=self.password)
        with SyncProducer(config, [self.topic]) as producer:
            for first in range(0, len(rows), 256):
                producer.send_batch([_result_message(Message, self.topic, row)
                                     for row in rows[first:first + 256]])


def _result_message(message_type: Any, topic: str, row: Any) -> Any:
    window = row.window_start.isoformat()
    body = {**row.asDict(), "window_start": window, "window_end": row.window_end.isoformat(),
            "window_start_ms": _epoch_ms(row.window_start), "window_end_ms": _epoch_ms(row.window_end)}
    return message_type(topic, json.dumps(body).encode(), tag="anomaly" if row.anomaly else "window",
                        keys=[f"{row.device}@{window}"],
                        properties={SUBJECT_PROPERTY: f"{topic}/{row.device}"})


def _epoch_ms(moment: Any) -> int:
    """Spark hands timestamps to Python as naive local datetimes; ``timestamp()`` reads them so."""
    return round(moment.timestamp() * 1000)


@dataclass(frozen=True)
class JobSettings:
    """Window length, how late a reading may arrive, the anomaly threshold (degrees), and how
    often the Parquet queries run (the live results query runs as often as it can: on a small
    machine, leaving it the cores is what keeps results fresh)."""

    window: str = "1 minute"
    watermark: str = "30 seconds"
    anomaly_threshold: float = 10.0
    archive_every: str = "1 minute"
    state_partitions: int = max(1, (os.cpu_count() or 2) // 2)
    """Partitions of the window state (``spark.sql.shuffle.partitions`` when a checkpoint is
    new; a restart keeps the checkpoint's). Each costs a task per micro-batch."""


def parse(messages: DataFrame) -> tuple[DataFrame, DataFrame]:
    """(readings, quarantine): readings with an ``event_time``; the rest of the messages with
    a ``reason`` and their position (topic, queue, offset) and body as text."""
    text = F.col("body").cast("string")
    parsed = messages.select(
        "topic", "queue", "offset", "store_ts", text.alias("text"),
        F.from_json(text, f"{READING_SCHEMA}, {_CORRUPT} STRING",
                    {"columnNameOfCorruptRecord": _CORRUPT}).alias("reading"))
    malformed = F.col("reading").isNull() | F.col(f"reading.{_CORRUPT}").isNotNull()
    missing = [F.when(F.col(f"reading.{name}").isNull(), F.lit(name)) for name in REQUIRED]
    reason: Column = (F.when(malformed, F.lit("not a JSON object"))
                      .otherwise(F.concat(F.lit("missing "), F.concat_ws(", ", *missing))))
    complete = ~malformed
    for name in REQUIRED:
        complete = complete & F.col(f"reading.{name}").isNotNull()
    readings = (parsed.where(complete).select("reading.*").drop(_CORRUPT)
                .withColumn("event_time", F.timestamp_millis(F.col("ts"))))
    quarantine = (parsed.where(~complete)
                  .select("topic", "queue", "offset", "store_ts", "text", reason.alias("reason")))
    return readings, quarantine


def aggregate(readings: DataFrame, settings: JobSettings = JobSettings()) -> DataFrame:
    """Per device and tumbling window: avg/min/max of temperature and humidity, the lowest
    battery, the reading count, the newest reading's ``ts`` (``latest_ts``, for measuring how
    long results take) and ``anomaly``."""
    windows = (readings.withWatermark("event_time", settings.watermark)
               .groupBy(F.window("event_time", settings.window), "device")
               .agg(F.avg("temperature").alias("avg_temperature"),
                    F.min("temperature").alias("min_temperature"),
                    F.max("temperature").alias("max_temperature"),
                    F.avg("humidity").alias("avg_humidity"),
                    F.min("battery").alias("min_battery"),
                    F.count(F.lit(1)).alias("readings"),
                    F.max("ts").alias("latest_ts")))
    threshold = settings.anomaly_threshold
    return windows.select(
        F.col("window.start").alias("window_start"), F.col("window.end").alias("window_end"),
        "device", "avg_temperature", "min_temperature", "max_temperature", "avg_humidity",
        "min_battery", "readings", "latest_ts",
        ((F.col("max_temperature") - F.col("avg_temperature") > threshold)
         | (F.col("avg_temperature") - F.col("min_temperature") > threshold)).alias("anomaly"),
        F.to_date("window.start").alias("date"))


def start(spark: Any, source: dict[str, str], output: str, checkpoint: str,
          settings: JobSettings = JobSettings(), available_now: bool = False,
          results: ResultsTopic | None = None,
          cancel: threading.Event | None = None) -> list[Any]:
    """Start the streaming queries: with ``results``, the aggregates published back into
    Sluice in update mode (every micro-batch republishes the windows it changed, open ones
    included, so subscribers see live values); aggregates to ``output``/aggregates (Parquet,
    partitioned by date, append mode: windows the watermark closed); the quarantine to
    ``output``/quarantine. Each query starts once the one before it has read messages (see
    ``start_one_by_one``): with none on the topic yet, this waits for them, until ``cancel``
    is set. Returns the queries started."""
    spark.conf.set("spark.sql.shuffle.partitions", str(settings.state_partitions))

    def parsed() -> tuple[DataFrame, DataFrame]:
        # A plan of its own for every query, so no query shares plan objects with another.
        reader = spark.readStream.format("sluice").schema(SOURCE_COLUMNS)
        for key, value in source.items():  # the data directory, if any, is option "path"
            reader = reader.option(key, value)
        return parse(reader.load())

    writers = []
    if results is not None:
        writer = (aggregate(parsed()[0], settings).writeStream.outputMode("update")
                  .option("checkpointLocation", f"{checkpoint}/results")
                  .foreachBatch(results.publish))
        writer = writer.trigger(availableNow=True) if available_now else writer
        writers.append(writer.queryName("telemetry-results"))
    for name, frame, partitioning in (("aggregates", aggregate(parsed()[0], settings), ["date"]),
                                      ("quarantine", parsed()[1], [])):
        writer = (frame.writeStream.format("parquet").outputMode("append")
                  .option("path", f"{output}/{name}")
                  .option("checkpointLocation", f"{checkpoint}/{name}"))
        if partitioning:
            writer = writer.partitionBy(*partitioning)
        writer = writer.trigger(**({"availableNow": True} if available_now
                                   else {"processingTime": settings.archive_every}))
        writers.append(writer.queryName(f"telemetry-{name}"))
    return start_one_by_one(spark, writers, cancel)


def start_one_by_one(spark: Any, writers: list[Any],
                     cancel: threading.Event | None = None) -> list[Any]:
    """Start streaming queries in order, each once the one before it has run a micro-batch
    that read messages (or has ended). With no messages yet, this waits for the first, or
    until ``cancel`` is set (then the queries started so far are returned).

    In a Spark 4.3 driver that has run no micro-batch yet, the first micro-batches of
    queries reading a Python data source, run at the same moment, now and then fail to
    serialize a task ("Task not serializable: Illegal size 5 of collection, expected 6").
    Queries started together in a driver that has run one did not hit it."""
    first_batches = FirstBatches()
    spark.streams.addListener(first_batches)
    try:
        queries = []
        for writer in writers:
            if cancel is not None and cancel.is_set():
                break
            query = writer.start()
            queries.append(query)
            first_batches.wait(query, cancel)
        return queries
    finally:
        spark.streams.removeListener(first_batches)


class FirstBatches(StreamingQueryListener):
    """Tells when a query has run its first micro-batch that read rows, or has ended."""

    def __init__(self) -> None:
        self._done: dict[str, threading.Event] = defaultdict(threading.Event)
        self._lock = threading.Lock()

    def _finished(self, query_id: Any) -> None:
        with self._lock:
            self._done[str(query_id)].set()

    def wait(self, query: Any, cancel: threading.Event | None = None) -> None:
        """Block until ``query`` has read rows in a micro-batch, or has ended, or ``cancel``
        is set."""
        with self._lock:
            done = self._done[str(query.id)]
        while not done.wait(1.0):
            if not query.isActive or (cancel is not None and cancel.is_set()):
                return  # ended before the listener heard of it, or no longer wanted

    def onQueryStarted(self, event: Any) -> None:
        """Nothing to do: a started query has run nothing yet."""

    def onQueryProgress(self, event: Any) -> None:
        if event.progress.numInputRows:
            self._finished(event.progress.id)

    def onQueryIdle(self, event: Any) -> None:
        """Nothing to do: no messages yet."""

    def onQueryTerminated(self, event: Any) -> None:
        self._finished(event.id)
