"""StoreView.read_runs: undecoded runs of records hold exactly what ``read`` returns, checked the same way."""
from __future__ import annotations

import os

import pytest

from store.api import StoreConfig
from store.errors import CorruptRecordError, OffsetOutOfRangeError
from store.file_store import FileStore
from store.reader import StoreReader
from store.record import decode

WAIT = 120


@pytest.fixture
def data_dir(tmp_path):
    return str(tmp_path / "data")


def fill(store, count):
    """``count`` records over queues 0 and 1 of topic ``t`` with noise on ``u`` between them."""
    results = []
    for i in range(count):
        results.append(store.append("t", b"%d" % i * 40, queue_id=i % 2, keys=[f"k{i}"], tag="x" * (i % 3)))
        store.append("u", b"noise")
    assert store.wait_durable(results[-1].end_offset, timeout=WAIT)
    store.checkpoint()
    return results


def decoded(runs):
    return [decode(run.data, pos, run.base + pos, run.segment) for run in runs for pos in run.positions]


def read_all(view, queue_id, start, count=7):
    """Every record from ``start`` to the end of the queue, ``count`` asked for at a time."""
    out = []
    while runs := view.read_runs("t", queue_id, start + len(out), count):
        out += decoded(runs)
    return out


def test_runs_hold_what_read_returns_across_segments_and_queue_files(config, data_dir):
    with FileStore(data_dir, config) as store:
        fill(store, 150)
        expected = store.read("t", 0, 0, max_count=1000, max_bytes=1 << 30)
    reader = StoreReader(data_dir)
    assert len(reader.log.segments()) > 3 and len(expected) == 75
    got = read_all(reader, 0, 0)
    assert [(m.queue_offset, m.body, m.keys, m.tag) for m in got] == [
        (m.queue_offset, m.body, m.keys, m.tag) for m in expected]
    runs = reader.read_runs("t", 0, 10, 100)
    assert sum(len(run.positions) for run in runs) == 6, "a read stops at the end of a queue file (16 entries)"
    assert all(len(run.data) <= config.segment_size for run in runs)
    crossing = [start for start in range(0, 75, 16) if len(reader.read_runs("t", 0, start, 16)) > 1]
    assert crossing, "some reads span two segments: one run each"
    assert len(reader.read_runs("t", 0, crossing[0], 16, max_bytes=1)) == 1
    assert reader.read_runs("t", 0, 75, 10) == [] and reader.read_runs("nope", 0, 0, 10) == []
    reader.close()


def test_a_corrupt_record_ends_the_runs_before_it_and_is_an_error_when_first(config, data_dir):
    with FileStore(data_dir, config) as store:
        victim = fill(store, 40)[20]  # queue 0, offset 10
    segment = flip_body_bit(data_dir, victim.phys_offset + victim.size - 5)
    reader = StoreReader(data_dir)
    assert [m.queue_offset for m in decoded(reader.read_runs("t", 0, 0, 100))] == list(range(10))
    with pytest.raises(CorruptRecordError, match="CRC32C mismatch") as error:
        reader.read_runs("t", 0, 10, 100)
    assert error.value.segment == segment and error.value.offset == victim.phys_offset
    assert [m.queue_offset for m in read_all(reader, 0, 11)] == list(range(11, 20))
    reader.close()


def test_offsets_removed_by_retention_are_out_of_range(config, data_dir):
    trimmed = StoreConfig(**{**config.__dict__, "retention_max_bytes": 20_000})
    with FileStore(data_dir, trimmed) as store:
        fill(store, 150)
        assert store.apply_retention().deleted_segments
        earliest, end = store.queue_range("t", 0)
        assert earliest > 0
        with pytest.raises(OffsetOutOfRangeError):
            store.read_runs("t", 0, earliest - 1, 10)
        assert [m.queue_offset for m in read_all(store, 0, earliest)] == list(range(earliest, end))


def flip_body_bit(data_dir, phys_offset):
    """Flip one bit at commit-log offset ``phys_offset``; return the segment's name."""
    directory = os.path.join(data_dir, "commitlog")
    name = max(n for n in os.listdir(directory) if n.isdigit() and int(n) <= phys_offset)
    with open(os.path.join(directory, name), "r+b") as file:
        file.seek(phys_offset - int(name))
        byte = file.read(1)
        file.seek(-1, os.SEEK_CUR)
        file.write(bytes([byte[0] ^ 0x10]))
    return name
