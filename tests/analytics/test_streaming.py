"""``spark.readStream.format("sluice")``: new messages arrive in later micro-batches; a restart
from the checkpoint neither re-reads nor skips; ``maxOffsetsPerTrigger`` bounds a batch; a
topic with no messages yet is waited for."""
from __future__ import annotations

import pytest

from store import FileStore, StoreConfig


@pytest.fixture
def store(tmp_path):
    opened = FileStore(str(tmp_path / "store"), StoreConfig(segment_size=1 << 20))
    yield opened
    opened.close()


def append(store: FileStore, first: int, count: int) -> None:
    last = None
    for number in range(first, first + count):
        last = store.append("telemetry", b"m%d" % number, queue_id=number % 2)
    store.wait_durable(last.end_offset)
    store.checkpoint()  # queue entries on disk, so a reader in another process sees them


def run_available_now(spark, path: str, out: str, checkpoint: str, **options: str):
    reader = spark.readStream.format("sluice").option("subscribe", "telemetry")
    for key, value in options.items():
        reader = reader.option(key, value)
    query = (reader.load(path).select("queue", "offset", "body").writeStream.format("parquet")
             .option("path", out).option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start())
    query.awaitTermination(120)
    assert query.exception() is None, query.exception()
    return query


def test_a_restarted_stream_reads_every_new_message_exactly_once(spark, store, tmp_path):
    out, checkpoint = str(tmp_path / "out"), str(tmp_path / "checkpoint")
    append(store, 0, 100)
    run_available_now(spark, store.directory, out, checkpoint)
    assert spark.read.parquet(out).count() == 100
    append(store, 100, 50)
    run_available_now(spark, store.directory, out, checkpoint)  # a new query, same checkpoint
    rows = spark.read.parquet(out).collect()
    assert len(rows) == 150
    assert sorted(bytes(r.body) for r in rows) == sorted(b"m%d" % n for n in range(150))
    assert len({(r.queue, r.offset) for r in rows}) == 150


def test_max_offsets_per_trigger_bounds_each_micro_batch(spark, store, tmp_path):
    append(store, 0, 150)
    query = run_available_now(spark, store.directory, str(tmp_path / "out"), str(tmp_path / "cp"),
                              maxOffsetsPerTrigger="40")
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sum(sizes) == 150 and max(sizes) <= 40 and len(sizes) >= 4


def test_a_stream_started_before_its_topic_has_messages_reads_them_once_they_arrive(
        spark, store, tmp_path):
    out, checkpoint = str(tmp_path / "out"), str(tmp_path / "checkpoint")
    last = store.append("other", b"not subscribed")
    store.wait_durable(last.end_offset)
    store.checkpoint()
    query = run_available_now(spark, store.directory, out, checkpoint)
    assert not any(p["numInputRows"] for p in query.recentProgress)
    append(store, 0, 30)
    run_available_now(spark, store.directory, out, checkpoint)
    rows = spark.read.parquet(out).collect()
    assert sorted(bytes(r.body) for r in rows) == sorted(b"m%d" % n for n in range(30))
