"""``format("sluice")`` over a store whose oldest segments were tiered and then deleted locally:
the same rows as before the deletion, through the Python source alone (no ``register``) and
through the planner (``analytics.register``: Spark's Parquet scan of the tier + the source for
the hot tail); offset and time ranges across the boundary, subject filters, the typed ``data``
column with filters pruned into the scan, streaming from the tier, and an S3 tier read without
Spark's s3a filesystem."""
from __future__ import annotations

import json
import logging
import time

import pytest

from sluice.client.packing import BATCH_PROPERTY, pack_bodies
from store import FileStore, StoreConfig, StoreReader
from store.tier.objects import TierLocation, save_location
from store.tier.tierer import Tierer

SCHEMA = json.dumps({"type": "object", "properties": {
    "device": {"type": "string"}, "seq": {"type": "integer"}, "temperature": {"type": "number"}}})
CONFIG = StoreConfig(segment_size=1 << 16, retention_max_bytes=1)
COUNT = 1200
MIRRORED = 10
ALERTS = 6


def body(i: int) -> bytes:
    return json.dumps({"device": f"d{i % 7}", "seq": i, "temperature": 20 + i % 5 + 0.5}).encode()


def alert(i: int) -> bytes:
    return b"alert %d" % i


def write_and_tier(directory: str, location: TierLocation) -> dict:
    """``devices`` (4 queues, subjects; written in two eras a millisecond apart; its first
    MIRRORED messages fanned out to ``mirror`` too), one packed batch on ``bulk`` and ALERTS
    messages on queue 0 of ``alerts`` fanned out to its queue 1 and to queue 1 of ``mirror``;
    every sealed segment tiered to ``location``, then deleted locally."""
    store = FileStore(directory, CONFIG)
    try:
        packed = store.append("bulk", pack_bodies([b"r0", b"r1", b"r2"]), properties={BATCH_PROPERTY: "3"})
        for i in range(ALERTS):
            store.append("alerts", alert(i), queue_id=0, extra_queues=[("alerts", 1), ("mirror", 1)])
        boundary = None
        for i in range(COUNT):
            if i == COUNT // 2:
                store.wait_durable(result.end_offset)
                boundary = store.read("devices", (i - 1) % 4, (i - 1) // 4, 1)[0].store_ts + 1
                while int(time.time() * 1000) < boundary:  # the clock passes the boundary first
                    pass
            result = store.append("devices", body(i), queue_id=i % 4, keys=[f"d{i % 7}"],
                                  properties={"sluice.subject": f"devices/d{i % 7}/telemetry"},
                                  extra_queues=[("mirror", 0)] if i < MIRRORED else ())
        store.wait_durable(result.end_offset)
        store.checkpoint()
        tierer = Tierer(store, location.open(), body_schema=lambda topic: SCHEMA if topic == "devices" else None)
        while tierer.tier_once() is not None:
            pass
        save_location(directory, location)
        store.apply_retention()
        assert store.log.min_offset > packed.end_offset, "the oldest segments are gone locally"
        return {"path": directory, "boundary": boundary}
    finally:
        store.close()


@pytest.fixture(scope="module")
def tiered(tmp_path_factory, spark) -> dict:
    """The tiered store, its era boundary and each queue's first offset still local."""
    root = tmp_path_factory.mktemp("tiered")
    directory = str(root / "data")
    made = write_and_tier(directory, TierLocation((root / "tier").as_uri()))
    reader = StoreReader(directory)
    try:
        local_start = {queue: reader.consume_queues.get("devices", queue, create=False).min_offset
                       for queue in range(4)}
    finally:
        reader.close()
    assert all(start > 0 for start in local_start.values())
    return {**made, "local_start": local_start}


def sessions(spark):
    """A session that plans with Spark's Parquet reader, and one that does not."""
    from analytics import register

    planned = spark.newSession()
    register(planned)
    return {"source": spark.newSession(), "planned": planned}


def load(session, path: str, **options: str):
    reader = session.read.format("sluice")
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load(path)


def rows_by_queue(frame) -> dict:
    out: dict = {}
    for row in frame.collect():
        out.setdefault((row.topic, row.queue), []).append(
            (row.offset, row.batch_index, bytes(row.body), row.msg_id, tuple(row.keys), row.subject,
             dict(row.properties), row.store_ts))
    return {key: sorted(value, key=lambda one: (one[0], one[1] or 0)) for key, value in out.items()}


def expected() -> dict:
    want: dict = {("bulk", 0): [(0, i, b"r%d" % i) for i in range(3)],
                  ("mirror", 0): [(i, None, body(i)) for i in range(MIRRORED)],
                  ("mirror", 1): [(i, None, alert(i)) for i in range(ALERTS)],
                  ("alerts", 0): [(i, None, alert(i)) for i in range(ALERTS)],
                  ("alerts", 1): [(i, None, alert(i)) for i in range(ALERTS)]}
    for i in range(COUNT):
        want.setdefault(("devices", i % 4), []).append((i // 4, None, body(i)))
    return want


def test_tiered_history_reads_as_before_with_and_without_register(spark, tiered):
    for name, session in sessions(spark).items():
        got = rows_by_queue(load(session, tiered["path"], subscribe="devices,bulk,mirror,alerts"))
        assert {key: [row[:3] for row in rows] for key, rows in got.items()} == expected(), name
        sample = got[("devices", 1)][0]
        assert sample[4] == ("d1",) and sample[5] == "devices/d1/telemetry", name
        assert sample[6]["sluice.subject"] == sample[5], name
    planned = load(sessions(spark)["planned"], tiered["path"], subscribe="devices,bulk")
    assert "data" not in planned.columns  # bulk has no body schema


def test_fanned_out_records_read_the_same_with_and_without_register(spark, tiered):
    """A record fanned out to another queue of its own topic and to another topic's queue is
    a row of each target queue, with the target's queue and offset, whichever reads it."""
    got = {name: rows_by_queue(load(session, tiered["path"], subscribe="alerts,mirror"))
           for name, session in sessions(spark).items()}
    assert got["planned"] == got["source"]
    for key in (("alerts", 0), ("alerts", 1), ("mirror", 1)):
        assert [row[:3] for row in got["planned"][key]] == [(i, None, alert(i)) for i in range(ALERTS)], key
    home, fanned = got["planned"][("alerts", 0)], got["planned"][("alerts", 1)]
    assert [row[3] for row in fanned] == [row[3] for row in home]  # the same records (msg ids)
    ranged = load(sessions(spark)["planned"], tiered["path"], subscribe="alerts",
                  startingOffsets=json.dumps({"alerts": {"0": 5, "1": 2}}),
                  endingOffsets=json.dumps({"alerts": {"0": 6, "1": 4}}))
    assert sorted((r.queue, r.offset, bytes(r.body)) for r in ranged.collect()) == [
        (0, 5, alert(5)), (1, 2, alert(2)), (1, 3, alert(3))]


def test_offset_time_and_subject_ranges_cross_the_tier_boundary(spark, tiered):
    start = {q: tiered["local_start"][q] - 5 for q in range(4)}
    starting = json.dumps({"devices": {str(q): s for q, s in start.items()}})
    ending = json.dumps({"devices": {"0": tiered["local_start"][0] + 5}})
    boundary = str(tiered["boundary"])
    for name, session in sessions(spark).items():
        got = rows_by_queue(load(session, tiered["path"], subscribe="devices",
                                 startingOffsets=starting, endingOffsets=ending))
        assert [row[0] for row in got[("devices", 0)]] == list(range(start[0], start[0] + 10)), name
        assert [row[0] for row in got[("devices", 3)]] == list(range(start[3], COUNT // 4)), name
        after = load(session, tiered["path"], subscribe="devices", startingTimestamp=boundary)
        assert sorted(bytes(r.body) for r in after.collect()) == sorted(body(i) for i in range(COUNT // 2, COUNT)), name
        before = load(session, tiered["path"], subscribe="devices", endingTimestamp=boundary,
                      subjectPattern="devices/d3/#")
        assert sorted(bytes(r.body) for r in before.collect()) == sorted(
            body(i) for i in range(COUNT // 2) if i % 7 == 3), name


def test_the_data_column_is_typed_and_filters_prune_into_the_parquet_scan(spark, tiered):
    frame = load(sessions(spark)["planned"], tiered["path"], subscribe="devices")
    hot = frame.where("data.temperature > 23").select("offset", "queue", "data.device", "data.seq")
    rows = hot.collect()
    assert sorted(r.seq for r in rows) == [i for i in range(COUNT) if 20 + i % 5 + 0.5 > 23]
    assert all(r.device == f"d{r.seq % 7}" and r.offset == r.seq // 4 for r in rows)
    plan = hot._jdf.queryExecution().executedPlan().toString()
    scan = next(line for line in plan.splitlines() if "FileScan parquet" in line)
    assert "GreaterThan(data.temperature,23.0)" in scan, scan
    assert "ReadSchema: struct<queue:int,offset:bigint,data:struct<device:string,seq:bigint,temperature:double>>" in scan, scan


def test_a_stream_from_earliest_starts_in_the_tier(spark, tiered, tmp_path):
    out = str(tmp_path / "out")
    query = (spark.readStream.format("sluice").option("subscribe", "devices")
             .option("startingOffsets", "earliest").load(tiered["path"]).select("queue", "offset", "body")
             .writeStream.format("parquet").option("path", out)
             .option("checkpointLocation", str(tmp_path / "checkpoint")).trigger(availableNow=True).start())
    query.awaitTermination(300)
    assert query.exception() is None, query.exception()
    rows = spark.read.parquet(out).collect()
    assert sorted((r.queue, r.offset, bytes(r.body)) for r in rows) == sorted(
        (i % 4, i // 4, body(i)) for i in range(COUNT))


def test_an_s3_tier_without_s3a_is_read_through_the_python_source(spark, tmp_path, caplog, monkeypatch):
    from tests.tier_support import seaweedfs

    (tmp_path / "s3").mkdir()
    with seaweedfs(tmp_path / "s3") as server:
        for variable, value in (("SLUICE_TIER_S3_ACCESS_KEY", server.access_key),
                                ("SLUICE_TIER_S3_SECRET_KEY", server.secret_key)):
            monkeypatch.setenv(variable, value)  # the driver's
            monkeypatch.setitem(spark.sparkContext.environment, variable, value)  # the workers'
        location = TierLocation(f"s3://{server.bucket}/tier", s3_endpoint=server.endpoint)
        made = write_and_tier(str(tmp_path / "data"), location)
        with caplog.at_level(logging.WARNING, logger="analytics.planner"):
            got = rows_by_queue(load(sessions(spark)["planned"], made["path"], subscribe="devices,bulk,mirror,alerts"))
        assert {key: [row[:3] for row in rows] for key, rows in got.items()} == expected()
        assert "hadoop-aws" in caplog.text


def test_the_tier_layout_page_examples_read_what_was_tiered(spark, tmp_path, monkeypatch):
    """docs/tier-layout.md: its tier is built, then read by Spark as the page shows (the page's
    pyarrow and DuckDB blocks run with the other pages' examples)."""
    from tests.analytics.test_readme_spark import run, spark_block
    from tests.readme import every_block

    monkeypatch.chdir(tmp_path)
    make = next(block.code for block in every_block() if block.argument == "tier-layout-make")
    run(make, tmp_path)
    _, printed = run(spark_block("tier-layout-spark"), tmp_path)
    for device in range(5):
        hot = sum(1 for i in range(2000) if i % 5 == device and 20 + i % 7 >= 25)
        assert f"|    d{device}|  {hot}|" in printed, printed
    assert "FileScan parquet" in printed and "data.temperature" in printed, printed
