"""Tiered ranges as Spark's own Parquet scan: what ``analytics.register(spark)`` adds.

A Python data source hands Spark Arrow batches from Python workers; it cannot reach Spark's
vectorized Parquet reader, nor prune columns and row groups inside it. After ``register``,
``spark.read.format("sluice")...load(PATH)`` in that session is planned here instead, as one
DataFrame: for each subscribed topic, ``spark.read.parquet`` of the tiered files holding the
requested offsets (chosen from the tier's manifest), with ``topic`` as a literal and the rows
outside each queue's range filtered out (Spark pushes those filters, and any the query adds,
into the scan), unioned by name with the ``sluice`` Python source reading the rest, the hot
tail still in local segments. The columns are the source's (schema.py), plus ``data``, the
body parsed into typed fields, when every subscribed topic has the same body schema (the hot
tail parses it with ``from_json``).

Only ``DataFrameReader.format/option/options/schema/load`` of classic PySpark are wrapped, once
per process: they note the format, options and schema on the reader and do what they always
did; ``load`` plans here only for the ``sluice`` format in a registered session. A broker
endpoint, a data directory with no tier, and an S3 tier when the JVM lacks ``s3a``
(hadoop-aws) are read by the Python source as before.
"""

from __future__ import annotations

import json
import logging
import os
import weakref
from collections.abc import Callable, Mapping
from functools import reduce
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.readwriter import DataFrameReader
from pyspark.sql.types import StructType
from pyspark.sql.utils import to_str

from store.tier.body_schema import spark_ddl
from store.tier.manifest import TieredFile
from store.tier.objects import TierLocation

from .options import SourceOptions
from .schema import COLUMN_TYPES
from .source import SluiceBatchReader
from .tiered import Tier, fans_out_to

log = logging.getLogger(__name__)

FORMAT = "sluice"
DATA = "data"
S3A = "org.apache.hadoop.fs.s3a.S3AFileSystem"
FILE_SCHEMA = ", ".join(f"`{name}` {kind}" for name, kind in COLUMN_TYPES.items() if name != "topic")
DISPATCH = "dispatch ARRAY<STRUCT<topic: STRING, queue: INT, offset: BIGINT>>"
_OPTIONS = {"startingoffsets", "endingoffsets", "startingtimestamp", "endingtimestamp", "path"}
"""Options the planner resolves into offsets itself (the hot tail gets its own)."""

_sessions: weakref.WeakSet = weakref.WeakSet()
_original: dict[str, Callable] = {}
Bounds = dict[tuple[str, int], tuple[int, int]]


def install(spark: SparkSession) -> None:
    """Plan ``format("sluice")`` reads of ``spark`` here from now on (idempotent)."""
    if not isinstance(spark, SparkSession) or not hasattr(spark, "_jsparkSession"):
        return  # Spark Connect: its reader is another class; the Python source still works
    _sessions.add(spark)
    if _original:
        return
    for name in ("format", "option", "options", "schema", "load"):
        _original[name] = getattr(DataFrameReader, name)
    DataFrameReader.format = _format
    DataFrameReader.option = _option
    DataFrameReader.options = _options
    DataFrameReader.schema = _schema
    DataFrameReader.load = _load


def _noted(reader: DataFrameReader) -> dict[str, Any]:
    return reader.__dict__.setdefault("_sluice", {"format": None, "options": {}, "schema": None})


def _format(self: DataFrameReader, source: str) -> DataFrameReader:
    _noted(self)["format"] = source
    return _original["format"](self, source)


def _option(self: DataFrameReader, key: str, value: Any) -> DataFrameReader:
    if value is not None:
        _noted(self)["options"][key.lower()] = to_str(value)
    return _original["option"](self, key, value)


def _options(self: DataFrameReader, **options: Any) -> DataFrameReader:
    _noted(self)["options"].update({key.lower(): to_str(value) for key, value in options.items()
                                    if value is not None})
    return _original["options"](self, **options)


def _schema(self: DataFrameReader, schema: StructType | str) -> DataFrameReader:
    _noted(self)["schema"] = schema
    return _original["schema"](self, schema)


def _load(self: DataFrameReader, path: Any = None, format: str | None = None,
          schema: StructType | str | None = None, **options: Any) -> DataFrame:
    if format is not None:
        self.format(format)
    if schema is not None:
        self.schema(schema)
    self.options(**options)
    noted = _noted(self)
    path = path if path is not None else noted["options"].get("path")
    if (str(noted["format"]).lower() != FORMAT or self._spark not in _sessions
            or not isinstance(path, str)):
        return _original["load"](self, path)
    return plan(self._spark, {**noted["options"], "path": path}, noted["schema"],
                lambda: _original["load"](self, path))


def plan(spark: SparkSession, options: Mapping[str, str], schema: StructType | str | None,
         python_source: Callable[[], DataFrame]) -> DataFrame:
    """The DataFrame of a ``format("sluice")`` read with ``options`` (lower-case keys, the
    data directory under ``path``): tiered ranges as Parquet scans, the rest through the Python
    source; ``python_source`` loads the read as given, for what is not tiered."""
    if isinstance(schema, str):
        schema = StructType.fromDDL(schema)
    source = SluiceBatchReader(options, schema)
    tier = source.tier()
    if tier is None:
        return python_source()
    root = _scan_root(spark, tier.location)
    if root is None:
        return python_source()
    bounds = source.bounds(tier)
    spans = tier.spans()
    tiered: Bounds = {}
    hot: Bounds = {}
    for key, (start, end) in bounds.items():
        first, tier_end = spans.get(key, (start, start))
        if start < tier_end and start < end:
            tiered[key] = (max(start, first), min(end, tier_end))
        hot[key] = (max(start, tier_end), max(end, start, tier_end))
    body = _common_body_schema(tier, source.options.topics) if schema is None else None
    columns = [*source.options.columns, *([DATA] if body else [])]
    frames = [frame for topic in source.options.topics
              for frame in _tiered_frames(spark, tier, root, topic, tiered, source.options, columns, body)]
    if any(start < end for start, end in hot.values()) or not frames:
        frames.append(_hot_tail(spark, options, schema, hot, body))
    return reduce(DataFrame.unionByName, frames)


def _tiered_frames(spark: SparkSession, tier: Tier, root: str, topic: str, bounds: Bounds,
                   options: SourceOptions, columns: list[str], body: str | None) -> list[DataFrame]:
    """The topic's tiered rows: from its own files (those wholly inside the requested ranges
    scanned with no range filter), and, fanned out to it, from other topics' files and from
    its own files whose footers show targets in it (another queue of the topic)."""
    queues = {queue: span for (name, queue), span in bounds.items() if name == topic}
    files = {file.key: file for queue, (start, end) in queues.items()
             for file in tier.files(topic, queue, start, end)}
    whole = sorted(key for key, file in files.items() if file.topic == topic and _inside(file, topic, queues))
    part = sorted(key for key, file in files.items() if file.topic == topic and key not in whole)
    others = sorted(key for key, file in files.items()
                    if file.topic != topic or fans_out_to(tier.location, file, topic))
    file_schema = FILE_SCHEMA + (f", {DATA} STRUCT<{spark_ddl(body)}>" if body else "")
    frames = []
    if whole:
        frames.append(spark.read.schema(file_schema).parquet(*[root + key for key in whole]))
    if part:
        frames.append(spark.read.schema(file_schema).parquet(*[root + key for key in part])
                      .where(_in_ranges(queues)))
    if others:
        fanned = spark.read.schema(f"{file_schema}, {DISPATCH}").parquet(*[root + key for key in others])
        target = F.explode(F.filter("dispatch", lambda to: to.topic == F.lit(topic))).alias("_to")
        frames.append(fanned.select("*", target).drop("queue", "offset", "dispatch")
                      .withColumn("queue", F.col("_to.queue")).withColumn("offset", F.col("_to.offset"))
                      .drop("_to").where(_in_ranges(queues)))
    selected = []
    for frame in frames:
        if options.subject_regex is not None:
            frame = frame.where(F.col("subject").rlike(options.subject_regex))
        # one projection from SQL text: each DataFrame step is a JVM call that analyses the plan
        selected.append(frame.selectExpr(*[_literal(topic) + " AS topic" if name == "topic" else name
                                           for name in columns]))
    return selected


def _literal(text: str) -> str:
    """``text`` as a Spark SQL string literal, whatever characters it holds."""
    return f"CAST(X'{text.encode().hex()}' AS STRING)"


def _inside(file: TieredFile, topic: str, queues: Mapping[int, tuple[int, int]]) -> bool:
    """Whether every row ``file`` holds of ``topic``'s queues is in the requested ranges."""
    return all(span.queue in queues and queues[span.queue][0] <= span.first
               and span.last < queues[span.queue][1] for span in file.queues if span.topic == topic)


def _in_ranges(queues: Mapping[int, tuple[int, int]]) -> str:
    """Rows of ``queue -> [start, end)``: a filter Spark pushes into the Parquet scan (SQL
    text: one JVM call however many queues)."""
    return " OR ".join(f"(queue = {int(queue)} AND offset >= {int(start)} AND offset < {int(end)})"
                       for queue, (start, end) in sorted(queues.items()))


def _hot_tail(spark: SparkSession, options: Mapping[str, str], schema: StructType | None,
              hot: Bounds, body: str | None) -> DataFrame:
    """The Python source over what the tier does not hold: each queue from its first offset
    past the tier (or the requested start, if later) to the requested end."""
    starting: dict[str, dict[str, int]] = {}
    ending: dict[str, dict[str, int]] = {}
    for (topic, queue), (start, end) in hot.items():
        starting.setdefault(topic, {})[str(queue)] = start
        ending.setdefault(topic, {})[str(queue)] = end
    reader = _original["format"](spark.read, FORMAT)
    if schema is not None:
        reader = _original["schema"](reader, schema)
    kept = {key: value for key, value in options.items() if key not in _OPTIONS}
    reader = _original["options"](reader, **kept, startingOffsets=json.dumps(starting),
                                  endingOffsets=json.dumps(ending))
    frame = _original["load"](reader, options["path"])
    if body:
        frame = frame.withColumn(DATA, F.from_json(F.col("body").cast("string"), spark_ddl(body)))
    return frame


def _common_body_schema(tier: Tier, topics: tuple[str, ...]) -> str | None:
    """The body schema every subscribed topic's tiered files have, if they share one."""
    schemas = {tier.body_schema(topic) for topic in topics}
    return schemas.pop() if len(schemas) == 1 else None


def _scan_root(spark: SparkSession, location: TierLocation) -> str | None:
    """The URL prefix Spark reads the tier's keys under; None (and a warning) for an S3 tier
    when the JVM has no ``s3a`` filesystem."""
    if location.url.startswith("file://"):
        return location.url.rstrip("/") + "/"
    jvm = spark.sparkContext._jvm
    try:
        jvm.java.lang.Class.forName(S3A)
    except Exception:  # py4j wraps the JVM's ClassNotFoundException
        log.warning("the tier %s is read through the Python source: Spark has no s3a filesystem "
                    "(%s); add hadoop-aws and its AWS SDK bundle to spark.jars.packages "
                    "(org.apache.hadoop:hadoop-aws matching Spark's Hadoop version) to scan it "
                    "with Spark's Parquet reader", location.url, S3A)
        return None
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    if location.s3_endpoint:
        conf.set("fs.s3a.endpoint", location.s3_endpoint)
        conf.set("fs.s3a.path.style.access", "true")
    conf.set("fs.s3a.endpoint.region", location.s3_region)
    for variable, key in (("SLUICE_TIER_S3_ACCESS_KEY", "fs.s3a.access.key"),
                          ("SLUICE_TIER_S3_SECRET_KEY", "fs.s3a.secret.key")):
        if os.environ.get(variable):
            conf.set(key, os.environ[variable])
    return "s3a://" + location.url.removeprefix("s3://").rstrip("/") + "/"
