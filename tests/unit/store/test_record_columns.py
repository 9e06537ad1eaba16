"""StoreReader.read_columns: every field of every record where ``read`` finds it, and records whose
sections do not add up refused."""
from __future__ import annotations

import struct
from array import array

import pytest

from store import FileStore, StoreConfig, StoreReader, record
from store.errors import CorruptRecordError
from store.record_columns import RecordColumns, decode
from store.record_run import RecordRun

WAIT = 120


def strings(records: RecordColumns, spans) -> list[bytes]:
    return [records.data[start:stop] for start, stop in zip(*spans)]


def items(records: RecordColumns, found) -> list[list[tuple[bytes, ...]]]:
    """Each record's items, each a tuple of its strings."""
    offsets, spans = found
    every = list(zip(*(strings(records, one) for one in spans)))
    return [every[offsets[i]:offsets[i + 1]] for i in range(len(records))]


def test_columns_hold_what_read_returns(tmp_path):
    directory = str(tmp_path / "data")
    with FileStore(directory, StoreConfig(segment_size=16 << 10)) as store:
        for i in range(200):
            last = store.append("t", b"b%d" % i * (i % 7), tag="x" * (i % 3), keys=[f"k{j}" for j in range(i % 4)],
                                properties={f"p{j}": "v" * j for j in range(i % 5)}, msg_id=f"id-{i}" * (i % 2),
                                born_ts=1000 + i)
            if i % 9 == 0:
                store.append("u", b"fanned", extra_queues=[("t", 0)])
        assert store.wait_durable(last.end_offset, timeout=WAIT)
        store.checkpoint()
    reader = StoreReader(directory)
    expected = reader.read("t", 0, 0, max_count=1000, max_bytes=1 << 30)
    found = list(reader.read_columns("t", 0, 0, 1000))
    assert len(found) > 1, "the records span several segments, so several runs"
    assert sum(len(records) for records in found) == len(expected) > 200
    rows = []
    for records in found:
        keys, properties = items(records, records.keys()), items(records, records.properties())
        for i in range(len(records)):
            rows.append((records.born_ts[i], records.store_ts[i],
                         *(strings(records, records.spans(name))[i] for name in ("topic", "msg_id", "tag", "body")),
                         [key for (key,) in keys[i]], properties[i]))
    assert rows == [(m.born_ts, m.store_ts, m.topic.encode(), m.msg_id.encode(), m.tag.encode(), m.body,
                     [key.encode() for key in m.keys],
                     [(name.encode(), value.encode()) for name, value in m.properties.items()])
                    for m in expected]
    assert list(reader.read_columns("t", 0, len(expected), 10)) == []
    reader.close()


def resealed(raw: bytes, field: int, value: int, width: int = 4) -> bytes:
    """``raw`` (one encoded record) with the integer at ``field`` replaced and its CRC made to match."""
    out = bytearray(raw)
    out[field:field + width] = value.to_bytes(width, "little")
    struct.pack_into("<I", out, 8, record.crc(bytes(out[12:])))
    return bytes(out)


def test_records_whose_lengths_do_not_add_up_are_an_error_not_garbage():
    good = record.encode(0, 0, 0, 1, 2, b"t", b"id", b"", b"", record.encode_properties({"a": "1"}), b"", b"body")
    records = decode(RecordRun(good, 0, array("q", [0]), ""))
    assert strings(records, records.spans("body")) == [b"body"]
    short_body = resealed(good, 64, 3)  # body_len: 3 of the 4 bytes
    run = RecordRun(good + short_body, 1000, array("q", [0, len(good)]), "00000000000000001000")
    with pytest.raises(CorruptRecordError, match="section lengths") as error:
        decode(run)
    assert error.value.offset == 1000 + len(good) and error.value.segment == run.segment
    long_name = resealed(good, record.HEADER_SIZE + 3, 5, width=2)  # the property name's length
    with pytest.raises(CorruptRecordError, match="properties overrun"):
        decode(RecordRun(long_name, 0, array("q", [0]), "")).properties()
