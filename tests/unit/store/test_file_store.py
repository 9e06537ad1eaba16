"""FileStore on disk: reopening, recovery, torn tails, corruption, locking, the read-only reader."""
from __future__ import annotations

import functools
import logging
import os
import shutil
import threading

import pytest

from store import record
from store.api import Message, StoreConfig
WAIT = 120  # seconds: only guards against hanging; a busy disk may stall one fsync for long

from store.errors import CorruptRecordError, InvalidRecordError, StoreLockedError
from store.file_store import FileStore
from store.reader import StoreReader


def fill(store, count, topic="t", size=300):
    results = [store.append(topic, bytes([i % 256]) * size, queue_id=i % 2, keys=[f"k{i}"]) for i in range(count)]
    assert store.wait_durable(results[-1].end_offset, timeout=WAIT)
    return results


def bodies(store, topic, queue_id):
    low, high = store.queue_range(topic, queue_id)
    return [m.body for m in store.read(topic, queue_id, low, max_count=high - low + 1, max_bytes=1 << 40)]


def segment_files(directory):
    return sorted(name for name in os.listdir(os.path.join(directory, "commitlog")) if name.isdigit())


@pytest.fixture
def data_dir(tmp_path):
    return str(tmp_path / "data")


def test_clean_reopen_scans_nothing_and_continues_offsets(config, data_dir):
    with FileStore(data_dir, config) as store:
        before = fill(store, 60)
        expected = bodies(store, "t", 1)
    with FileStore(data_dir, config) as store:
        assert store.recovery.clean and store.recovery.scanned_bytes == 0
        assert bodies(store, "t", 1) == expected
        after = store.append("t", b"next", queue_id=1)
        assert after.queue_offset == 30 and after.phys_offset == before[-1].end_offset
        assert store.lookup_key("t", "k7")[0].phys_offset == before[7].phys_offset


def make_index_files_of_version_1(data_dir):
    """What an older version left: key index files of format version 1."""
    index = os.path.join(data_dir, "index")
    for name in os.listdir(index):
        with open(os.path.join(index, name), "r+b") as file:
            file.seek(4)
            file.write((1).to_bytes(2, "little"))


def test_an_index_of_an_older_format_is_rebuilt_from_the_log_at_open(config, data_dir):
    with FileStore(data_dir, config) as store:
        results = fill(store, 60)
    make_index_files_of_version_1(data_dir)
    with FileStore(data_dir, config) as store:
        assert not store.recovery.clean and store.recovery.replayed_records == 60
        found = store.lookup_id(results[42].msg_id, ["t"])
        assert [m.phys_offset for m in found] == [results[42].phys_offset]
        assert [m.phys_offset for m in store.lookup_key("t", "k7")] == [results[7].phys_offset]
    with FileStore(data_dir, config) as store:
        assert store.recovery.clean


def test_an_open_killed_while_rebuilding_the_index_rebuilds_it_next_time(config, data_dir, monkeypatch):
    with FileStore(data_dir, config) as store:
        results = fill(store, 60)
    make_index_files_of_version_1(data_dir)  # discarded at the next open, to be rebuilt

    def dies(*args, **kwargs):
        raise KeyboardInterrupt("killed while replaying the log")
    with monkeypatch.context() as patched:
        patched.setattr("store.file_store.recover", dies)
        with pytest.raises(KeyboardInterrupt):
            FileStore(data_dir, config)
    with FileStore(data_dir, config) as store:
        assert not store.recovery.clean
        assert all([m.phys_offset for m in store.lookup_key("t", f"k{i}")] == [r.phys_offset]
                   for i, r in enumerate(results))


def test_lost_queues_and_index_are_rebuilt_from_the_log(config, data_dir):
    with FileStore(data_dir, config) as store:
        results = fill(store, 60)
        expected = [bodies(store, "t", q) for q in (0, 1)]
    for derived in ("consumequeue", "index", "checkpoint"):
        path = os.path.join(data_dir, derived)
        shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
    with FileStore(data_dir, config) as store:
        assert not store.recovery.clean and store.recovery.replayed_records == 60
        assert [bodies(store, "t", q) for q in (0, 1)] == expected
        found = store.lookup_id(results[42].msg_id, ["t"])
        assert [m.phys_offset for m in found] == [results[42].phys_offset]
        assert store.lookup_key("t", "k42")[0].queue_offset == 21


def crash_after_writing(data_dir, end, damage):
    """Leave what a crash mid-write leaves: ``damage`` after the last record (which ends at
    commit-log offset ``end``) and no clean checkpoint. Returns the last segment's name."""
    name = segment_files(data_dir)[-1]
    with open(os.path.join(data_dir, "commitlog", name), "r+b") as file:
        file.seek(end - int(name))
        file.write(damage)
    os.remove(os.path.join(data_dir, "checkpoint"))
    return name


def test_torn_tail_is_truncated_and_logged(config, data_dir, caplog):
    with FileStore(data_dir, config) as store:
        results = fill(store, 20)
    half = record.encode(results[-1].end_offset, 0, 99, 0, 0, b"t", b"id", b"", b"", b"", b"", b"z" * 200)
    name = crash_after_writing(data_dir, results[-1].end_offset, half[: len(half) // 2])
    with caplog.at_level(logging.WARNING), FileStore(data_dir, config) as store:
        assert store.recovery.truncated_bytes == len(half) // 2
        assert any("torn tail" in r.getMessage() and name in r.getMessage() for r in caplog.records)
        assert len(bodies(store, "t", 0)) == 10
        new = store.append("t", b"after", queue_id=0)
        assert new.phys_offset == results[-1].end_offset and new.queue_offset == 10
        assert store.wait_visible(new.end_offset, WAIT)
        assert bodies(store, "t", 0)[-1] == b"after"


def test_garbage_at_the_tail_is_truncated(config, data_dir):
    with FileStore(data_dir, config) as store:
        results = fill(store, 5)
    crash_after_writing(data_dir, results[-1].end_offset, os.urandom(776) + b"\xff")
    with FileStore(data_dir, config) as store:
        assert store.recovery.truncated_bytes == 777
        assert store.log.end_offset == results[-1].end_offset
        assert len(bodies(store, "t", 0)) == 3
    assert StoreReader(data_dir).verify() == []


def test_a_crash_after_clean_writes_needs_no_truncation(config, data_dir):
    with FileStore(data_dir, config) as store:
        results = fill(store, 30)
    os.remove(os.path.join(data_dir, "checkpoint"))  # as if killed after the last fsync
    with FileStore(data_dir, config) as store:
        assert not store.recovery.clean and store.recovery.truncated_bytes == 0
        assert store.log.end_offset == results[-1].end_offset
        assert store.append("t", b"next").phys_offset == results[-1].end_offset


def segment_sizes(data_dir):
    return [os.path.getsize(os.path.join(data_dir, "commitlog", name)) for name in segment_files(data_dir)]


def test_eager_segments_start_preallocated_and_roll_into_prepared_files(config, data_dir):
    config = StoreConfig(**{**config.__dict__, "preallocate": "eager"})
    sizes = functools.partial(segment_sizes, data_dir)

    with FileStore(data_dir, config) as store:
        assert sizes() == [config.segment_size], "a new store's first segment is written ahead"
        for _ in range(3):
            assert store.log.preallocator.wait_ready(WAIT)
            before = len(segment_files(data_dir))
            while len(segment_files(data_dir)) == before:  # append until the log rolls
                store.wait_durable(store.append("t", bytes(700)).end_offset, WAIT)
        assert sizes() == [config.segment_size] * 4
    with FileStore(data_dir, config) as store:
        assert store.recovery.clean and len(bodies(store, "t", 0)) == store.queue_range("t", 0)[1]


def test_a_lazy_store_writes_nothing_ahead_until_a_segment_is_half_full(config, data_dir):
    prepared = os.path.join(data_dir, "commitlog", "next.prealloc")
    with FileStore(data_dir, config) as store:
        assert segment_sizes(data_dir) == [0] and not os.path.exists(prepared)
        while store.log.end_offset * 2 < config.segment_size:
            assert not os.path.exists(prepared), "prepared before the segment was half full"
            store.wait_durable(store.append("t", bytes(700)).end_offset, WAIT)
        assert store.log.preallocator.wait_ready(WAIT) and os.path.exists(prepared)
        while len(segment_files(data_dir)) == 1:  # append until the log rolls
            store.wait_durable(store.append("t", bytes(700)).end_offset, WAIT)
        assert segment_sizes(data_dir)[1] == config.segment_size, "it rolled into the prepared file"
    with FileStore(data_dir, config) as store:
        assert store.recovery.clean and len(bodies(store, "t", 0)) == store.queue_range("t", 0)[1]


def flip_byte_in_body(data_dir, result):
    """Flip one bit inside the body of the record ``result`` names; return its segment name."""
    name = [n for n in segment_files(data_dir) if int(n) <= result.phys_offset][-1]
    with open(os.path.join(data_dir, "commitlog", name), "r+b") as file:
        file.seek(result.phys_offset - int(name) + result.size - 5)
        byte = file.read(1)
        file.seek(-1, os.SEEK_CUR)
        file.write(bytes([byte[0] ^ 0x10]))
    return name


def test_bit_flip_in_a_middle_segment_is_reported_when_read(config, data_dir):
    with FileStore(data_dir, config) as store:
        results = fill(store, 80)
    victim = results[40]  # queue 0, offset 20, in a segment before the last
    name = flip_byte_in_body(data_dir, victim)
    assert name != segment_files(data_dir)[-1]
    with FileStore(data_dir, config) as store:
        got = store.read("t", 0, 0, max_count=100)
        assert [m.queue_offset for m in got] == list(range(20)), "records before the bad one are served"
        with pytest.raises(CorruptRecordError) as error:
            store.read("t", 0, 20)
        assert name in str(error.value) and str(victim.phys_offset) in str(error.value)
        assert [m.queue_offset for m in store.read("t", 0, 21, max_count=100)] == list(range(21, 40))
        assert len(bodies(store, "t", 1)) == 40
    problems = StoreReader(data_dir).verify()
    assert len(problems) == 1 and name in problems[0] and str(victim.phys_offset) in problems[0]


@pytest.mark.parametrize("queues_survive", [True, False])
def test_corruption_in_the_replayed_region_loses_only_the_bad_record(config, data_dir, queues_survive, caplog):
    with FileStore(data_dir, config) as store:
        results = fill(store, 80)
    victim = results[40]
    name = flip_byte_in_body(data_dir, victim)
    os.remove(os.path.join(data_dir, "checkpoint"))
    if not queues_survive:
        shutil.rmtree(os.path.join(data_dir, "consumequeue"))
    with caplog.at_level(logging.ERROR), FileStore(data_dir, config) as store:
        assert store.recovery.corrupt_spans == [(name, victim.phys_offset, victim.end_offset)]
        assert store.recovery.truncated_bytes == 0
        assert any(name in r.getMessage() for r in caplog.records)
        with pytest.raises(CorruptRecordError):
            store.read("t", 0, 20)
        assert [m.queue_offset for m in store.read("t", 0, 21, max_count=100)] == list(range(21, 40))
        new = store.append("t", b"after", queue_id=0)
        assert new.queue_offset == 40
        assert store.wait_visible(new.end_offset, WAIT)
        assert store.read("t", 0, 40)[0].body == b"after"


def test_a_second_store_cannot_open_a_directory_in_use(config, data_dir):
    with FileStore(data_dir, config):
        with pytest.raises(StoreLockedError, match="in use"):
            FileStore(data_dir, config)


def test_async_flush_makes_records_durable_on_the_interval(config, data_dir):
    config = StoreConfig(**{**config.__dict__, "flush": "async", "flush_interval_ms": 10})
    with FileStore(data_dir, config) as store:
        result = store.append("t", b"x")
        assert store.wait_visible(result.end_offset, WAIT)
        assert store.wait_durable(result.end_offset, WAIT)


def test_reader_follows_a_running_store(config, data_dir):
    with FileStore(data_dir, config) as store:
        fill(store, 10)
        store.checkpoint()
        reader = StoreReader(data_dir)
        assert [m.body for m in reader.read("t", 0, 0, 100)] == bodies(store, "t", 0)
        fill(store, 40)
        store.checkpoint()
        assert len(reader.read("t", 0, 0, 100)) == 5, "nothing new until refresh"
        reader.refresh()
        assert len(reader.read("t", 0, 0, 100)) == 25
        described = reader.describe()
        assert {(q["topic"], q["queue_id"], q["max_offset"]) for q in described["queues"]} == {("t", 0, 25), ("t", 1, 25)}
        assert reader.verify() == []


def test_queue_file_geometry_is_fixed_at_creation(config, data_dir):
    with FileStore(data_dir, config) as store:
        fill(store, 50)
        expected = bodies(store, "t", 0)
    other = StoreConfig(**{**config.__dict__, "queue_entries_per_file": 7})
    with FileStore(data_dir, other) as store:
        assert bodies(store, "t", 0) == expected


def test_concurrent_checkpoints_do_not_collide(config, data_dir):
    busy = StoreConfig(**{**config.__dict__, "checkpoint_interval_ms": 1})
    with FileStore(data_dir, busy) as store:
        errors = []

        def checkpoint_often():
            try:
                for _ in range(100):
                    store.checkpoint()
            except Exception as error:  # collected: an exception in a thread would go unseen
                errors.append(error)

        threads = [threading.Thread(target=checkpoint_often) for _ in range(4)]
        for thread in threads:
            thread.start()
        fill(store, 50)
        for thread in threads:
            thread.join()
        assert errors == []
    with FileStore(data_dir, config) as store:
        assert store.recovery.clean and len(bodies(store, "t", 0)) == 25


def test_refused_appends_leave_no_gap_in_the_log(config, data_dir):
    with FileStore(data_dir, config) as store:
        for bad in ({"born_ts": 1 << 63}, {"queue_id": -1}, {"keys": ["k" * 70_000]}):
            store.append("t", b"before")
            with pytest.raises(InvalidRecordError):
                store.append("t", b"refused", **bad)
        last = store.append("t", b"after")
        assert store.wait_durable(last.end_offset, WAIT)
        assert [m.body for m in store.read("t", 0, 0, 10)] == [b"before"] * 3 + [b"after"]
    assert StoreReader(data_dir).verify() == []


def test_earliest_offsets_after_retention_survive_a_restart(config, data_dir):
    trimmed = StoreConfig(**{**config.__dict__, "retention_max_bytes": 20_000})
    with FileStore(data_dir, trimmed) as store:
        fill(store, 120)
        assert store.apply_retention().deleted_segments
        earliest = store.queue_range("t", 0)
        expected = bodies(store, "t", 0)
    for opened in (FileStore(data_dir, trimmed), StoreReader(data_dir)):
        assert opened.queue_range("t", 0) == earliest
        assert [m.body for m in opened.read("t", 0, earliest[0], max_count=1000)] == expected
        if isinstance(opened, FileStore):
            opened.close()


def test_compacted_state_outlives_its_segments_across_restarts(config, data_dir):
    trimmed = StoreConfig(**{**config.__dict__, "retention_max_bytes": 20_000})
    with FileStore(data_dir, trimmed) as store:
        store.enable_compaction("retained")
        for device in range(5):
            store.append("retained", b"v1-%d" % device, keys=[f"d{device}"])
        store.append("retained", b"", keys=["d3"])  # cleared
        store.append("retained", b"v2-1", keys=["d1"])
        fill(store, 120)
        assert store.apply_retention().deleted_segments
        assert store.queue_range("retained", 0)[0] > 0, "the raw records are gone from the queue"
    with FileStore(data_dir, trimmed) as store:
        assert [(m.keys[0], m.body) for m in store.compacted("retained")] == [
            ("d0", b"v1-0"), ("d2", b"v1-2"), ("d4", b"v1-4"), ("d1", b"v2-1")]
        store.append("retained", b"v3-0", keys=["d0"])
        assert store.wait_visible(store.append("retained", b"v1-5", keys=["d5"]).end_offset, WAIT)
        assert {m.keys[0]: m.body for m in store.compacted("retained")} == {
            "d0": b"v3-0", "d1": b"v2-1", "d2": b"v1-2", "d4": b"v1-4", "d5": b"v1-5"}


def test_retention_moves_the_earliest_offset_when_whole_queue_files_are_deleted(config, data_dir):
    store = FileStore(data_dir, StoreConfig(**{**config.__dict__, "retention_max_bytes": 20_000}))
    results = [store.append("bulk", bytes(900)) for _ in range(60)]
    store.wait_visible(results[-1].end_offset, 60)
    store.checkpoint()  # queue entries reach their files, so the oldest file can be deleted
    report = store.apply_retention()
    low, high = store.queue_range("bulk", 0)
    assert low >= config.queue_entries_per_file and high == 60
    assert store.read("bulk", 0, low, 1)[0].phys_offset >= report.log_min_offset
    store.close()


class _AppendFirst:
    """Stands in for the append buffer's lock: the flusher's next ``with lock`` first lets
    ``append`` run, as an appender taking the lock just before the flusher does."""

    def __init__(self, lock, append) -> None:
        self.lock = lock
        self.append = append
        self.appended = threading.Event()

    def __enter__(self):
        if threading.current_thread().name == "sluice-store-flusher" and self.append is not None:
            append, self.append = self.append, None
            append()
            self.appended.set()
        return self.lock.__enter__()

    def __exit__(self, *exc_info):
        return self.lock.__exit__(*exc_info)


def test_a_large_batch_handed_off_as_the_flusher_goes_idle_still_becomes_durable(data_dir):
    """The flusher finds nothing handed off, then takes the lock to sleep. A batch large enough
    to be handed off at once (256 KiB) that an appender places in between must be written
    without waiting for another append, which may never come: its producers would wait for
    durability forever."""
    store = FileStore(data_dir, StoreConfig(segment_size=4 << 20, flush="sync"))
    buffer = store._buffer
    real_lock = buffer.lock
    landed = []
    hook = buffer.lock = _AppendFirst(real_lock, lambda: landed.extend(
        store.append_batch([Message("t", b"x" * (100 << 10)) for _ in range(3)])))
    try:
        with real_lock:
            buffer.ready.notify()  # the flusher cycles once more, nothing else appends
        assert hook.appended.wait(WAIT), "the flusher did not take the lock again"
        assert store.wait_durable(landed[-1].end_offset, timeout=30), \
            "a batch handed off just before the flusher went idle never became durable"
    finally:
        buffer.lock = real_lock
        store.close()
