"""The ``sluice`` data source reads a data directory in batch: what was stored, row for row."""
from __future__ import annotations

import json

import pytest

from sluice.client.packing import BATCH_PROPERTY, pack_bodies
from store import FileStore, StoreConfig


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> dict:
    """A store with telemetry on topic ``devices`` (4 queues, MQTT subjects), a packed batch on
    ``bulk``, and noise on ``other``; returns what was appended."""
    directory = tmp_path_factory.mktemp("store")
    store = FileStore(str(directory), StoreConfig(segment_size=1 << 20))
    appended = []
    for i in range(600):
        device = f"d{i % 7}"
        body = json.dumps({"device": device, "temperature": 20 + i % 5}).encode()
        result = store.append("devices", body, queue_id=i % 4, keys=[device], tag="telemetry",
                              properties={"sluice.subject": f"devices/{device}/telemetry"})
        appended.append((result.queue_id, result.queue_offset, body, device))
    packed = store.append("bulk", pack_bodies([b"r0", b"r1", b"r2"]),
                          properties={BATCH_PROPERTY: "3"})
    store.append("other", b"not subscribed")
    store.wait_durable(packed.end_offset)
    store.checkpoint()
    store.close()
    return {"path": str(directory), "devices": appended}


def load(spark, path: str, **options: str):
    reader = spark.read.format("sluice")
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load(path)


def test_a_batch_read_returns_every_stored_message_once(spark, data_dir):
    rows = load(spark, data_dir["path"], subscribe="devices").collect()
    got = sorted((r.queue, r.offset, bytes(r.body), r.keys[0]) for r in rows)
    assert got == sorted(data_dir["devices"])
    sample = next(r for r in rows if r.queue == 1 and r.offset == 0)
    assert sample.topic == "devices" and sample.tag == "telemetry"
    assert sample.subject == "devices/d1/telemetry"
    assert sample.properties["sluice.subject"] == sample.subject
    assert sample.batch_index is None and sample.born_ts is not None and sample.store_ts is not None


def test_packed_records_become_one_row_per_body(spark, data_dir):
    rows = load(spark, data_dir["path"], subscribe="bulk").orderBy("batch_index").collect()
    assert [(r.offset, r.batch_index, bytes(r.body)) for r in rows] == [
        (0, 0, b"r0"), (0, 1, b"r1"), (0, 2, b"r2")]


def test_offset_options_select_a_range_per_queue(spark, data_dir):
    starting = json.dumps({"devices": {"0": 100, "1": -1}})
    ending = json.dumps({"devices": {"0": 110}})
    rows = load(spark, data_dir["path"], subscribe="devices", startingOffsets=starting,
                endingOffsets=ending).collect()
    by_queue: dict[int, list[int]] = {}
    for row in rows:
        by_queue.setdefault(row.queue, []).append(row.offset)
    assert sorted(by_queue[0]) == list(range(100, 110))
    assert 1 not in by_queue                      # started at latest: nothing
    assert sorted(by_queue[2]) == list(range(150))  # defaults: earliest to latest


def test_large_queues_are_split_into_partitions_that_read_the_same_rows(spark, data_dir):
    whole = load(spark, data_dir["path"], subscribe="devices")
    split = load(spark, data_dir["path"], subscribe="devices", maxRecordsPerPartition="40")
    assert split.rdd.getNumPartitions() == 4 * 4  # 150 records per queue, 40 per partition
    assert sorted(split.select("queue", "offset").collect()) == sorted(whole.select("queue", "offset").collect())


def test_an_unknown_topic_is_a_clear_error(spark, data_dir):
    with pytest.raises(Exception, match="topic 'nope' has no messages") as error:
        load(spark, data_dir["path"], subscribe="nope").collect()
    assert "devices" in str(error.value)


def test_explicit_registration_also_works(spark, data_dir):
    from analytics import register

    register(spark)
    assert load(spark, data_dir["path"], subscribe="bulk").count() == 3


@pytest.fixture(scope="module")
def two_eras(tmp_path_factory) -> dict:
    """Topic ``eras`` (2 queues): 20 messages, then, stored at least a millisecond later, 10 more."""
    import time

    directory = tmp_path_factory.mktemp("eras")
    store = FileStore(str(directory), StoreConfig(segment_size=1 << 20))
    last = None
    for i in range(20):
        last = store.append("eras", b"old %d" % i, queue_id=i % 2)
    store.wait_durable(last.end_offset)
    boundary = store.read("eras", 0, 9, 1)[0].store_ts + 1
    while int(time.time() * 1000) < boundary:  # the clock must pass the boundary first
        pass
    for i in range(10):
        last = store.append("eras", b"new %d" % i, queue_id=i % 2)
    store.wait_durable(last.end_offset)
    store.checkpoint()
    store.close()
    return {"path": str(directory), "boundary": boundary}


def test_timestamps_choose_where_each_queue_starts_and_ends(spark, two_eras):
    after = load(spark, two_eras["path"], subscribe="eras", startingTimestamp=str(two_eras["boundary"]))
    assert sorted(bytes(r.body) for r in after.collect()) == sorted(b"new %d" % i for i in range(10))
    before = load(spark, two_eras["path"], subscribe="eras", endingTimestamp=str(two_eras["boundary"]))
    assert sorted(bytes(r.body) for r in before.collect()) == sorted(b"old %d" % i for i in range(20))
    with pytest.raises(Exception, match="startingTimestamp is milliseconds"):
        load(spark, two_eras["path"], subscribe="eras", startingTimestamp="yesterday").collect()


def test_queues_and_subject_pattern_select_rows(spark, data_dir):
    rows = load(spark, data_dir["path"], subscribe="devices", queues="1,3").collect()
    assert sorted((r.queue, r.offset) for r in rows) == sorted(
        (q, o) for q, o, _, _ in data_dir["devices"] if q in (1, 3))
    one_device = load(spark, data_dir["path"], subscribe="devices", subjectPattern="devices/d1/#").collect()
    assert {r.subject for r in one_device} == {"devices/d1/telemetry"}
    assert len(one_device) == sum(1 for *_, device in data_dir["devices"] if device == "d1")
    every = load(spark, data_dir["path"], subscribe="devices", subjectPattern="devices/+/telemetry")
    assert every.count() == len(data_dir["devices"])
    assert load(spark, data_dir["path"], subscribe="devices", subjectPattern="devices/+").count() == 0
    with pytest.raises(Exception, match="has none of the queues"):
        load(spark, data_dir["path"], subscribe="devices", queues="9").collect()
    with pytest.raises(Exception, match="is not a subject filter"):
        load(spark, data_dir["path"], subscribe="devices", subjectPattern="devices/d#").collect()


def test_a_declared_schema_reads_only_those_columns(spark, data_dir):
    frame = (spark.read.format("sluice").schema("subject STRING, body BINARY")
             .option("subscribe", "devices").load(data_dir["path"]))
    assert frame.columns == ["subject", "body"]
    got = sorted((r.subject, bytes(r.body)) for r in frame.collect())
    assert got == sorted((f"devices/{device}/telemetry", body) for _, _, body, device in data_dir["devices"])
    wrong = spark.read.format("sluice").schema("body STRING").option("subscribe", "devices")
    with pytest.raises(Exception, match="declare a subset of"):
        wrong.load(data_dir["path"]).collect()


def test_short_queue_ranges_share_one_partition(spark, data_dir):
    assert load(spark, data_dir["path"], subscribe="devices").rdd.getNumPartitions() == 1
