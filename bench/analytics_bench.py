"""The ``analytics`` section: a batch read of telemetry through the ``sluice`` Spark source
beside ``spark.read.json`` of the same readings as JSON lines (the ceiling to compare with),
and beside a Python data source that decodes nothing (``spark_ceiling.py``: what any Python
source can reach).

Then the same readings fully tiered: a second store written with small segments, whose topic
has a body schema, tiered by the Tierer into a local directory and its segments deleted, read
with ``format("sluice")`` after ``analytics.register(spark)`` (Spark's own Parquet scan of the
tier, ``select data.*``), beside ``spark.read.parquet`` of the same readings written by Spark.

Every side yields the same typed columns into Spark's ``noop`` sink, so what is timed is
reading and parsing. The stores are written directly (``append_batch``) with the simulator's
fleet; the JSON lines file holds the same bodies. Runs alternate and medians are reported.

Last, once Spark has stopped, the cost of writing the tier: ``tier_bench.measure``, a broker
taking an MQTT QoS 1 load with tiering off and on (the load's ratio, and the tiering throughput
meanwhile).
"""

from __future__ import annotations

import itertools
import json
import os
import statistics
import sys
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sluice.cli.simulator import Fleet
from store import FileStore, StoreConfig
from store.api import Message

from . import tier_bench
from .spark_ceiling import CeilingSource

Log = Callable[[str], None]
READING = "device STRING, ts BIGINT, temperature DOUBLE, humidity DOUBLE, battery DOUBLE"
BODY_SCHEMA = json.dumps({"type": "object", "properties": {
    "device": {"type": "string"}, "ts": {"type": "integer"}, "temperature": {"type": "number"},
    "humidity": {"type": "number"}, "battery": {"type": "number"}}})
"""The topic's registered body schema: the same fields and types as ``READING``."""
TARGET_RATIO = 0.7
TIERED_JSON_TARGET, TIERED_PARQUET_TARGET = 1.0, 0.8
ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Settings:
    records: int = 1_000_000
    rounds: int = 3
    devices: int = 1000
    segment_size: int = 16 << 20
    """Of the tiered store: a segment is tiered once sealed."""
    tiering: tier_bench.Settings = field(default_factory=tier_bench.Settings)
    """Of the broker tiering under MQTT load."""

    @classmethod
    def smoke(cls) -> Settings:
        return cls(records=20_000, rounds=1, devices=50, segment_size=1 << 20,
                   tiering=tier_bench.Settings.smoke())


@dataclass
class Report:
    settings: Settings
    sluice: list[float] = field(default_factory=list)
    sluice_body: list[float] = field(default_factory=list)
    ceiling: list[float] = field(default_factory=list)
    json: list[float] = field(default_factory=list)
    tiered: list[float] = field(default_factory=list)
    parquet: list[float] = field(default_factory=list)
    tiering: list[str] = field(default_factory=list)
    """``tier_bench.figure_lines`` of the broker tiering under load."""

    def render(self) -> str:
        every, body = statistics.median(self.sluice), statistics.median(self.sluice_body)
        json_rate, ceiling = statistics.median(self.json), statistics.median(self.ceiling)
        tiered, parquet = statistics.median(self.tiered), statistics.median(self.parquet)
        verdict = "PASS" if body / json_rate >= TARGET_RATIO else "MISS"
        tiered_verdict = ("PASS" if tiered / json_rate >= TIERED_JSON_TARGET
                          and tiered / parquet >= TIERED_PARQUET_TARGET else "MISS")
        return "\n".join([
            f"analytics benchmark: batch read and parse of {self.settings.records:,} telemetry "
            f"readings, local[2] Spark, medians of {self.settings.rounds} alternating runs",
            f"  sluice source, all 12 columns     {every:>12,.0f} rows/s   {every / json_rate:.2f}x",
            f"  sluice source, .schema(body)      {body:>12,.0f} rows/s   {body / json_rate:.2f}x"
            f"   target >= {TARGET_RATIO}x  {verdict}   (the hot tail: local segments)",
            f"  format(sluice) tiered, data.*     {tiered:>12,.0f} rows/s   {tiered / json_rate:.2f}x"
            f"   {tiered / parquet:.2f}x parquet   target >= {TIERED_JSON_TARGET}x json and >= "
            f"{TIERED_PARQUET_TARGET}x parquet  {tiered_verdict}",
            f"  spark.read.parquet (Spark-written){parquet:>12,.0f} rows/s   {parquet / json_rate:.2f}x",
            f"  a Python source decoding nothing  {ceiling:>12,.0f} rows/s   {ceiling / json_rate:.2f}x"
            f"   (the ceiling of PySpark's Python data sources)",
            f"  spark.read.json (JSON lines)      {json_rate:>12,.0f} rows/s",
            "  writing the tier: a broker under MQTT QoS 1 load, tiering off and on",
            *[f"    {line}" for line in self.tiering],
        ])


def run_section(settings: Settings, workdir: Path, log: Log) -> Report:
    """Write the data, then time the readers in alternation."""
    store_dir, lines = workdir / "store", workdir / "telemetry.jsonl"
    tiered_dir, parquet_dir = workdir / "tiered", workdir / "readings.parquet"
    workdir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    _write(settings, FileStore(str(store_dir), StoreConfig(flush="async")), lines)
    log(f"[analytics] wrote {settings.records:,} readings to the store and as JSON lines "
        f"in {time.perf_counter() - started:.1f}s")
    started = time.perf_counter()
    files = _write_tiered(settings, tiered_dir, workdir / "tier")
    log(f"[analytics] wrote them again with {settings.segment_size >> 20} MiB segments, tiered "
        f"them into {files} Parquet files and deleted the segments in {time.perf_counter() - started:.1f}s")
    spark = _spark()
    report = Report(settings)
    try:
        from pyspark.sql import functions as F

        from analytics import register

        register(spark)
        spark.read.schema(READING).json(str(lines)).write.parquet(str(parquet_dir))

        def tiered() -> None:
            frame = spark.read.format("sluice").option("subscribe", "devices").load(str(tiered_dir))
            frame.select("data.*").write.format("noop").mode("overwrite").save()

        def parquet() -> None:
            spark.read.parquet(str(parquet_dir)).write.format("noop").mode("overwrite").save()

        def sluice(columns: str | None) -> Callable[[], None]:
            def run() -> None:
                reader = spark.read.format("sluice")
                reader = reader.schema(columns) if columns else reader
                frame = (reader.option("subscribe", "devices").load(str(store_dir))
                         .select(F.from_json(F.col("body").cast("string"), READING).alias("r")).select("r.*"))
                frame.write.format("noop").mode("overwrite").save()
            return run

        def json_lines() -> None:
            spark.read.schema(READING).json(str(lines)).write.format("noop").mode("overwrite").save()

        def ceiling() -> None:
            frame = (spark.read.format("sluice_ceiling").option("lines", str(lines))
                     .option("records", settings.records).option("partitions", 4).load()
                     .select(F.from_json(F.col("body").cast("string"), READING).alias("r")).select("r.*"))
            frame.write.format("noop").mode("overwrite").save()

        spark.dataSource.register(CeilingSource)
        runs = (("sluice", sluice(None), report.sluice),
                ("sluice .schema(body)", sluice("body BINARY"), report.sluice_body),
                ("ceiling", ceiling, report.ceiling),
                ("read.json", json_lines, report.json),
                ("format(sluice) tiered", tiered, report.tiered),
                ("read.parquet", parquet, report.parquet))
        for _, run, _ in runs:  # warm up every path once (Python workers, JIT)
            run()
        for round_number in range(1, settings.rounds + 1):
            for name, run, rates in runs:
                began = time.perf_counter()
                run()
                rates.append(settings.records / (time.perf_counter() - began))
                log(f"[analytics] round {round_number}/{settings.rounds} {name}: {rates[-1]:,.0f} rows/s")
    finally:
        spark.stop()
    report.tiering = tier_bench.figure_lines(tier_bench.measure(settings.tiering, workdir / "tiering", log))
    return report


def _write(settings: Settings, store: FileStore, lines: Path | None, seal: bool = False) -> None:
    """The fleet's readings into ``store`` (closed afterwards), and as JSON lines to ``lines``;
    with ``seal``, filler on another topic until the segment holding the last reading is sealed."""
    readings = Fleet(settings.devices, seed=7).readings(lambda: int(time.time() * 1000))
    try:
        with lines.open("wb") if lines else open(os.devnull, "wb") as out:
            remaining = settings.records
            while remaining:
                chunk = list(itertools.islice(readings, min(10_000, remaining)))
                remaining -= len(chunk)
                results = store.append_batch([Message("devices", body, queue_id=zlib.crc32(topic.encode()) % 4,
                                                      properties={"sluice.subject": topic})
                                              for topic, body in chunk])
                out.write(b"\n".join(body for _, body in chunk) + b"\n")
            readings_end = results[-1].end_offset
            while seal and store.log.segments()[-1].base < readings_end:
                results = store.append_batch([Message("filler", bytes(64 << 10))])
            store.wait_durable(results[-1].end_offset)
            store.checkpoint()
    finally:
        store.close()


def _write_tiered(settings: Settings, store_dir: Path, tier_dir: Path) -> int:
    """The same readings in a store of small segments, every segment holding them tiered into
    ``tier_dir`` (topic ``devices`` with ``BODY_SCHEMA``) and then deleted locally; returns
    how many data files the tier has."""
    from store.tier.objects import TierLocation, save_location
    from store.tier.tierer import Tierer

    config = StoreConfig(flush="async", segment_size=settings.segment_size, retention_max_bytes=1)
    _write(settings, FileStore(str(store_dir), config), None, seal=True)
    store = FileStore(str(store_dir), config)
    try:
        location = TierLocation(tier_dir.resolve().as_uri())
        tierer = Tierer(store, location.open(), body_schema=lambda topic: BODY_SCHEMA if topic == "devices" else None)
        while tierer.tier_once() is not None:
            pass
        save_location(str(store_dir), location)
        store.apply_retention()
        return len(tierer.manifest.files)
    finally:
        store.close()


def _spark():
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2]").appName("sluice-analytics-bench")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.driver.memory", "2g").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark
