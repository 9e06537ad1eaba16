"""A segment written as Parquet holds every record exactly: each row re-encodes to the record's
log bytes (packed batches packed again), files split by home topic and UTC day, a body schema
gives typed fields (null only for a body that does not parse), and the key-index file is sorted
so a lookup reads one row group."""
from __future__ import annotations

import io
import json

import pyarrow as pa
import pyarrow.parquet as pq

from store import Message, record
from store.tier import layout, packing
from store.tier.body_schema import arrow_type
from store.tier.schema import DATA_SCHEMA, INDEX_ROW_GROUP, INDEX_SCHEMA, with_data
from store.tier.writer import write_segment

from .conftest import WAIT_S

SCHEMA = json.dumps({"type": "object", "properties": {
    "device": {"type": "string"}, "ts": {"type": "integer"}, "temperature": {"type": "number"},
    "ok": {"type": "boolean"}, "pos": {"type": "object", "properties": {"x": {"type": "number"}}}}})
TOPIC = "plant/line-1%hot"


def segment_bytes(store) -> tuple[bytes, int, str]:
    segment = store.log.segments()[0]
    return store.log.read(segment.base, segment.size)[0], segment.base, segment.name


def reencoded(row: dict, topic: str, body: bytes) -> bytes:
    """The log bytes of the record a row (with the record's whole body) describes."""
    dispatch = b"".join(record.dispatch_head(t["topic"].encode()) + record.pack_target(t["queue"], t["offset"])
                        for t in row["dispatch"])
    micros = (row["born_ts"], row["store_ts"])
    born, stored = (int(value.timestamp() * 1000) if value is not None else 0 for value in micros)
    return record.encode(row["log_offset"], row["queue"], row["offset"], born, stored, topic.encode(),
                         row["msg_id"].encode(), (row["tag"] or "").encode(), record.encode_keys(row["keys"]),
                         record.encode_properties(dict(row["properties"])), dispatch, body)


def test_every_record_round_trips_through_its_rows(file_store) -> None:
    store = file_store(segment_size=1 << 20)
    messages = [
        Message(TOPIC, json.dumps({"device": "d1", "ts": 1, "temperature": 20.5, "ok": True,
                                   "pos": {"x": 1.5}}).encode(), queue_id=3, tag="t1", keys=("k1", "k2"),
                properties={"sluice.subject": "s/1", "unit": "°C"}, msg_id="chosen-1", born_ts=1700000000123),
        Message(TOPIC, b"not json", keys=("k1",)),
        Message(TOPIC, packing.pack([b'{"device": "p0", "ts": 7}', b"{broken", b'{"ok": false}\r\n']),
                properties={packing.BATCH_PROPERTY: "3"}, extra_queues=(("fan/out", 2), ("audit", 0))),
        Message(TOPIC, b"SB\x01\x09", properties={packing.BATCH_PROPERTY: "9"}),  # claims a batch, is not one
        Message(TOPIC, packing.pack([]), properties={packing.BATCH_PROPERTY: "0"}),
        Message("plain", b"", queue_id=1),
        Message("plain", bytes(range(256)), tag="binary"),
    ]
    store.append_batch(messages)
    assert store.wait_durable(store.appended_end, WAIT_S)
    data, base, name = segment_bytes(store)
    files = write_segment(data, base, name, lambda topic: SCHEMA if topic == TOPIC else None)
    assert files.records == len(messages)
    by_topic = {f.info.topic: f for f in files.files}
    assert set(by_topic) == {TOPIC, "plain"}
    for topic, data_file in by_topic.items():
        info = data_file.info
        assert info.key == layout.data_key(topic, info.day, base) and info.bytes == len(data_file.parquet)
        table = pq.read_table(io.BytesIO(data_file.parquet))
        expected = DATA_SCHEMA if topic == "plain" else with_data(arrow_type(SCHEMA))
        assert table.schema.remove_metadata() == expected
        assert info.rows == table.num_rows and info.body_schema == (SCHEMA if topic == TOPIC else None)
        rows = table.to_pylist()
        offsets = [row["log_offset"] for row in rows]
        assert (info.log_first, info.log_last) == (offsets[0], offsets[-1])
        for log_offset in sorted(set(offsets)):
            mine = [row for row in rows if row["log_offset"] == log_offset]
            stored = store.read_at(log_offset)
            packed = mine[0]["batch_index"] is not None
            assert [row["batch_index"] for row in mine] == (list(range(len(mine))) if packed else [None])
            body = packing.pack([row["body"] for row in mine]) if packed else mine[0]["body"]
            assert reencoded(mine[0], topic, body) == stored.encode()
            assert mine[0]["subject"] == stored.properties.get("sluice.subject")
            assert mine[0]["log_size"] == stored.size
    rows = pq.read_table(io.BytesIO(by_topic[TOPIC].parquet)).to_pylist()
    assert [row["data"] for row in rows] == [
        {"device": "d1", "ts": 1, "temperature": 20.5, "ok": True, "pos": {"x": 1.5}}, None,
        {"device": "p0", "ts": 7, "temperature": None, "ok": None, "pos": None}, None,
        {"device": None, "ts": None, "temperature": None, "ok": False, "pos": None}, None, None]
    spans = {(s.topic, s.queue): (s.first, s.last) for s in by_topic[TOPIC].info.queues}
    assert spans == {(TOPIC, 3): (0, 0), (TOPIC, 0): (0, 3), ("fan/out", 2): (0, 0), ("audit", 0): (0, 0)}


def synthetic_segment(records: list[tuple[str, int, tuple[str, ...]]], base: int = 1 << 20) -> bytes:
    """Log bytes of records (topic, store_ts, keys) at commit-log offsets from ``base``."""
    out = bytearray()
    for number, (topic, store_ts, keys) in enumerate(records):
        out += record.encode(base + len(out), 0, number, store_ts, store_ts, topic.encode(),
                             f"id-{number}".encode(), b"", record.encode_keys(keys), b"", b"", b"body")
    return bytes(out)


def test_files_split_by_utc_day() -> None:
    day = 86_400_000
    base = 1 << 20
    data = synthetic_segment([("t", 19_000 * day - 1, ()), ("t", 19_000 * day, ()), ("u", 19_000 * day + 5, ())],
                             base)
    files = {f.info.key: f.info for f in write_segment(data, base, "segment").files}
    assert sorted(files) == [layout.data_key("t", "2022-01-07", base), layout.data_key("t", "2022-01-08", base),
                             layout.data_key("u", "2022-01-08", base)]
    assert files[layout.data_key("t", "2022-01-08", base)].store_ts_min == 19_000 * day


def test_corrupt_bytes_are_skipped_and_the_rest_tiered() -> None:
    base = 0
    data = bytearray(synthetic_segment([("t", 1, ()), ("t", 2, ()), ("t", 3, ())], base))
    second = record.HEADER.unpack_from(data, 0)[0]
    data[second + 70] ^= 0xFF  # the second record's CRC no longer matches
    rows = pq.read_table(io.BytesIO(write_segment(bytes(data), base, "segment").files[0].parquet)).to_pylist()
    assert [row["msg_id"] for row in rows] == ["id-0", "id-2"]


def test_index_is_sorted_so_a_lookup_reads_one_row_group() -> None:
    count = 70_000  # two keys each: more than two row groups of index rows
    data = synthetic_segment([("t", 1000, (f"key-{n:06d}", f"other-{n % 7}")) for n in range(count)])
    index = pq.ParquetFile(io.BytesIO(write_segment(data, 1 << 20, "segment").index))
    assert index.schema_arrow.remove_metadata() == INDEX_SCHEMA
    assert index.metadata.num_row_groups == -(-(3 * count) // INDEX_ROW_GROUP)
    admitting = []
    for group in range(index.metadata.num_row_groups):
        stats = index.metadata.row_group(group).column(1).statistics
        if stats.min <= "key-034567" <= stats.max:
            admitting.append(group)
    assert len(admitting) == 1
    rows = index.read_row_group(admitting[0]).filter(pa.compute.equal(index.read_row_group(admitting[0])["value"],
                                                                      "key-034567")).to_pylist()
    assert [(row["kind"], row["topic"], row["log_offset"]) for row in rows] == [("key", "t", rows[0]["log_offset"])]
    found = record.decode(data, rows[0]["log_offset"] - (1 << 20), rows[0]["log_offset"])
    assert found.msg_id == "id-34567" and "key-034567" in found.keys
    table = index.read()
    pairs = list(zip(table["kind"].to_pylist(), table["value"].to_pylist()))
    assert pairs == sorted(pairs)
    assert table["kind"].to_pylist().count("id") == count
    assert sorted(table.filter(pa.compute.equal(table["value"], "other-3"))["log_offset"].to_pylist(),
                  reverse=True) == table.filter(pa.compute.equal(table["value"], "other-3"))["log_offset"].to_pylist()


def test_generated_ids_are_not_indexed(file_store) -> None:
    store = file_store(segment_size=1 << 20)
    store.append("t", b"a")
    store.append("t", b"b", msg_id="mine")
    assert store.wait_durable(store.appended_end, WAIT_S)
    data, base, name = segment_bytes(store)
    index = pq.read_table(io.BytesIO(write_segment(data, base, name).index)).to_pylist()
    assert [(row["kind"], row["value"]) for row in index] == [("id", "mine")]
