"""analytics/columnar.py gives the rows that decoding record by record gives, and stops at a corrupt record."""
from __future__ import annotations

import os
import shutil

import pyarrow as pa
import pytest

from analytics.columnar import record_batch
from analytics.source import ARROW_SCHEMA, QueueRange, SharedRanges, SluiceBatchReader, _record_batch
from sluice.client.packing import BATCH_PROPERTY, pack_bodies
from store import FileStore, StoreConfig
from store.errors import CorruptRecordError
from store.reader import StoreReader

WAIT = 120
MESSAGES = [  # (body, tag, keys, properties, msg_id)
    (b'{"t": 1}', "", (), {}, ""),
    (b"", "alarm", ("k1",), {"sluice.subject": "devices/d1/telemetry"}, ""),
    ("température °C → 21".encode(), "métrique", ("clé", "ключ", ""), {"unité": "°C", "leer": ""}, "ид-1"),
    (pack_bodies([b"r0", b"", "ü".encode()]), "", ("batch",), {BATCH_PROPERTY: "3", "sluice.subject": "s/b"}, ""),
    (b"x" * 5000, "t", (), {"a": "1", "b": "2", "c": "3", "sluice.subject": ""}, "given-id"),
    (pack_bodies([]), "", (), {BATCH_PROPERTY: "0"}, ""),
    (b"not packed", "", (), {BATCH_PROPERTY: ""}, ""),
]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> str:
    """Topic ``mixed``: every kind of message above, many times over two queues and several small
    segments (queue 0 begins with one of each, in order), with records of ``noise`` and fanned-out
    records of ``home`` between them."""
    directory = str(tmp_path_factory.mktemp("store"))
    with FileStore(directory, StoreConfig(segment_size=64 << 10, queue_entries_per_file=64)) as store:
        for i in range(300):
            body, tag, keys, properties, msg_id = MESSAGES[i % len(MESSAGES)]
            last = store.append("mixed", body, queue_id=i // len(MESSAGES) % 2, tag=tag, keys=keys, properties=properties,
                                msg_id=msg_id and f"{msg_id}-{i}", born_ts=1_700_000_000_000 + i)
            store.append("noise", b"n" * (i % 50))
            if i % 10 == 0:
                store.append("home", b"fanned %d" % i, extra_queues=[("mixed", 1)])
        assert store.wait_durable(last.end_offset, timeout=WAIT)
        store.checkpoint()
    return directory


def row_by_row(reader: StoreReader, partition: QueueRange) -> pa.Table:
    """The reference: every message decoded on its own, then ``_record_batch``."""
    messages = reader.read(partition.topic, partition.queue, partition.start,
                           max_count=partition.end - partition.start, max_bytes=1 << 40)
    rows = [(partition.start + i, m.msg_id, list(m.keys), m.tag, m.properties, m.body, m.born_ts,
             m.store_ts) for i, m in enumerate(messages)]
    return pa.Table.from_batches([_record_batch(partition, rows)])


def test_every_queue_reads_as_decoding_record_by_record_does(data_dir):
    reader = StoreReader(data_dir)
    source = SluiceBatchReader({"path": data_dir, "subscribe": "mixed", "maxRecordsPerPartition": "70"})
    partitions = source.partitions()
    ranges = [one for p in partitions for one in (p.ranges if isinstance(p, SharedRanges) else (p,))]
    assert len(ranges) == 3 + 3 and len(reader.log.segments()) >= 4
    assert len(partitions) == 5, "the two short tails share a partition"
    shared = next(p for p in partitions if isinstance(p, SharedRanges))
    assert pa.Table.from_batches(list(source.read(shared))).num_rows == sum(
        row_by_row(reader, one).num_rows for one in shared.ranges)
    for partition in ranges:
        batches = list(source.read(partition))
        assert all(batch.schema == ARROW_SCHEMA for batch in batches)
        got, expected = pa.Table.from_batches(batches, ARROW_SCHEMA), row_by_row(reader, partition)
        assert got.num_rows == expected.num_rows > partition.end - partition.start
        assert got.equals(expected), partition
    reader.close()


def test_rows_carry_what_was_stored(data_dir):
    source = SluiceBatchReader({"path": data_dir, "subscribe": "mixed"})
    partition = QueueRange("mixed", 0, 0, 7)
    rows = pa.Table.from_batches(list(source.read(partition))).to_pylist()
    assert [(row["offset"], row["batch_index"], row["body"]) for row in rows if row["offset"] == 3] == [
        (3, 0, b"r0"), (3, 1, b""), (3, 2, "ü".encode())]
    text = next(row for row in rows if row["offset"] == 2)
    assert text["tag"] == "métrique" and text["keys"] == ["clé", "ключ", ""] and text["msg_id"] == "ид-1-2"
    assert text["properties"] == [("unité", "°C"), ("leer", "")] and text["subject"] is None
    first = rows[0]
    assert first["tag"] is None and first["keys"] == [] and first["properties"] == [] and first["batch_index"] is None
    assert first["born_ts"].timestamp() == 1_700_000_000 and first["born_ts"].tzname() == "UTC"
    assert {row["offset"] for row in rows} == set(range(7)) - {5}, "an empty packed batch gives no row"
    fanned = pa.Table.from_batches(list(source.read(QueueRange("mixed", 1, 0, 200)))).to_pylist()
    assert {row["topic"] for row in fanned} == {"mixed"}
    assert sum(row["body"].startswith(b"fanned") for row in fanned) == 30


def test_a_corrupt_record_is_an_error_naming_it_after_the_rows_before_it(data_dir, tmp_path):
    copy = shutil.copytree(data_dir, tmp_path / "copy")
    reader = StoreReader(copy)
    victim = reader.read("mixed", 0, 40, 1)[0]
    segment = next(s for s in reader.log.segments() if s.base <= victim.phys_offset < s.end)
    with open(segment.path, "r+b") as file:
        file.seek(victim.phys_offset - segment.base + victim.size - 1)
        last = file.read(1)[0]
        file.seek(-1, os.SEEK_CUR)
        file.write(bytes([last ^ 1]))
    source = SluiceBatchReader({"path": copy, "subscribe": "mixed"})
    batches = source.read(QueueRange("mixed", 0, 0, 150))
    before = []
    with pytest.raises(CorruptRecordError, match="CRC32C mismatch") as error:
        for batch in batches:
            before += batch.column("offset").to_pylist()
    assert error.value.offset == victim.phys_offset and error.value.segment == segment.name
    assert set(before) == {offset for offset in range(40) if offset % len(MESSAGES) != 5}
    reader.close()


@pytest.mark.parametrize("columns", [("body",), ("subject", "body"), ("keys", "offset", "store_ts"),
                                     ("properties", "batch_index", "tag", "msg_id")])
def test_a_subset_of_columns_decodes_to_those_columns_of_the_whole_batch(data_dir, columns):
    reader = StoreReader(data_dir)
    for topic in ("mixed", "noise"):  # with packed records, and with no properties at all
        for records in reader.read_columns(topic, 0, 0, 60):
            whole = record_batch(records, topic, 0, 0)
            part = record_batch(records, topic, 0, 0, columns)
            assert part.schema.names == list(columns)
            assert part.equals(whole.select(list(columns)))
    reader.close()
