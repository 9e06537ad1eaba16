"""TierReader over a tier in a local directory: what it reads, what it never reads, and how
much it keeps."""
from __future__ import annotations

import dataclasses
import os

import pytest

from store.api import StoreConfig
from store.errors import CorruptRecordError, OffsetOutOfRangeError, StoreError
from store.file_store import FileStore
from store.tier.objects import LocalDirectory
from store.tier.reader import MissingFromTier, TierReader
from store.tier.rebuild import TierDataError

from .build import row_groups, segment_records, tier_segments


class Counting:
    """An object store that records every range it was asked for."""

    def __init__(self, objects) -> None:
        self.objects, self.fetched = objects, []
        self.description = objects.description

    def __getattr__(self, name):
        return getattr(self.objects, name)

    def get_range(self, key: str, start: int, length: int) -> bytes:
        self.fetched.append((key, start, length))
        return self.objects.get_range(key, start, length)


@pytest.fixture
def tier(filled, tmp_path):
    objects = LocalDirectory(str(tmp_path / "tier"))
    with row_groups(5):
        manifest = tier_segments(filled, objects, 6)
    records = {m.phys_offset: m for s in filled.log.segments()[:6] for m in segment_records(filled, s)}
    return filled, objects, manifest, records


def test_reads_match_the_log_for_home_and_fanned_out_queues(tier):
    store, objects, manifest, _ = tier
    reader = TierReader(objects)
    assert reader.queue_start("orders", 0) is None  # no manifest loaded yet
    reader.refresh()
    assert reader.manifest == manifest
    for topic, queue in store.queues():
        start, end = reader.queue_start(topic, queue), reader.queue_end(topic, queue)
        assert start == 0 and end > 0
        local = store.read(topic, queue, 0, end, 1 << 30)
        for count in (1, 3, end):
            for offset in range(0, end, count):
                got = reader.read(topic, queue, offset, count, 1 << 30)
                assert [m.encode() for m in got] == [m.encode() for m in local[offset:offset + count]]
                assert [m.dispatch for m in got] == [m.dispatch for m in local[offset:offset + count]]
        assert reader.read(topic, queue, end, 5) == []


def test_max_bytes_ends_a_read_after_the_first_message(tier):
    _, objects, _, _ = tier
    reader = TierReader(objects)
    reader.refresh()
    assert len(reader.read("orders", 0, 0, 100, max_bytes=1)) == 1
    some = reader.read("orders", 0, 0, 100, max_bytes=400)
    assert 1 < len(some) < 100 and sum(m.size for m in some[:-1]) <= 400


def test_read_at_lookups_and_time(tier):
    store, objects, manifest, records = tier
    reader = TierReader(objects)
    reader.refresh()
    for offset, record in records.items():
        assert reader.read_at(offset).encode() == record.encode()
    with pytest.raises(KeyError):
        reader.read_at(manifest.tiered_end)
    with pytest.raises(KeyError):
        reader.read_at(min(records) + 1)  # inside a record
    assert reader.lookup_key("orders", "k2", 100) == [] or all(
        "k2" in m.keys for m in reader.lookup_key("orders", "k2", 100))
    expected = sorted((m.phys_offset for m in records.values() if m.topic == "orders" and "k2" in m.keys), reverse=True)
    assert [m.phys_offset for m in reader.lookup_key("orders", "k2", 100)] == expected
    assert [m.phys_offset for m in reader.lookup_key("orders", "k2", 2)] == expected[:2]
    newest = records[expected[0]].store_ts
    assert all(m.store_ts >= newest for m in reader.lookup_key("orders", "k2", 100, since_ms=newest))
    assert [m.phys_offset for m in reader.lookup_key("orders", "k2", 100, before=expected[1])] == expected[2:]
    audit = next(m for m in records.values() if m.topic == "audit")
    assert [m.encode() for m in reader.lookup_id(audit.msg_id, ["audit"])] == [audit.encode()]
    assert reader.lookup_id(audit.msg_id, ["orders"]) == []
    last = max(m.store_ts for m in records.values())
    assert reader.offset_for_time("orders", 0, 0) == 0
    assert reader.offset_for_time("orders", 0, last + 1) is None


def test_files_for_names_the_files_of_a_range(tier):
    _, objects, manifest, _ = tier
    reader = TierReader(objects)
    reader.refresh()
    files = reader.files_for("orders-copy", 0, 0, 3)
    assert files and all(any(s.topic == "orders-copy" and s.queue == 0 and s.first <= 2 for s in f.queues)
                         for f in files)
    assert {f.key for f in reader.files_for("audit", None, 0, 1 << 40)} == {
        f.key for f in manifest.files if f.topic == "audit" or any(s.topic == "audit" for s in f.queues)}
    assert reader.files_for("nothing", None, 0, 10) == []


def test_range_gets_fetch_the_footer_and_the_needed_row_groups_only(tmp_path):
    store = FileStore(str(tmp_path / "data"), StoreConfig(segment_size=1 << 19))
    try:
        for n in range(200):
            last = store.append("big", os.urandom(2000), queue_id=n % 3, keys=[f"k{n}"])
        assert store.wait_visible(last.end_offset, timeout=60)
        assert store.wait_durable(store.append("big", b"next segment " * 10_000).end_offset, timeout=60)
        objects = LocalDirectory(str(tmp_path / "tier"))
        with row_groups(20):
            manifest = tier_segments(store, objects, 1)
        counting = Counting(objects)
        reader = TierReader(counting)
        reader.refresh()
        (file,) = manifest.files
        message = reader.read("big", 1, 30, 1)[0]
        assert message.encode() == store.read("big", 1, 30, 1)[0].encode()
        fetched = sum(length for key, _, length in counting.fetched if key == file.key)
        assert fetched < file.bytes / 4
    finally:
        store.close()


def test_the_cache_stays_within_its_bound(tier):
    store, objects, _, records = tier
    for bound in (0, 8 << 10, 64 << 10):
        reader = TierReader(objects, cache_bytes=bound)
        reader.refresh()
        for offset in records:
            reader.read_at(offset)
            assert reader.cache_size <= bound
        for topic, queue in store.queues():
            reader.read(topic, queue, 0, 1000, 1 << 30)
            assert reader.cache_size <= bound


def test_cached_reads_fetch_nothing_again(tier):
    _, objects, _, records = tier
    counting = Counting(objects)
    reader = TierReader(counting, cache_bytes=64 << 20)
    reader.refresh()
    first = [reader.read_at(offset).encode() for offset in records]
    fetched = len(counting.fetched)
    assert [reader.read_at(offset).encode() for offset in records] == first
    assert len(counting.fetched) == fetched


def test_a_file_no_manifest_names_is_never_read(tier):
    store, objects, manifest, _ = tier
    orphaned = tier_segments(store, objects, 1)  # the next segment: its files, then manifest 2
    objects.delete(f"manifest/{orphaned.version:020d}.json")  # as if the commit never happened
    orphans = {f.key for f in orphaned.files} - {f.key for f in manifest.files}
    assert orphans
    counting = Counting(objects)
    reader = TierReader(counting)
    reader.refresh()
    assert reader.manifest == manifest
    late = [m for m in segment_records(store, store.log.segments()[6])]
    for message in late:
        with pytest.raises(KeyError):
            reader.read_at(message.phys_offset)
        assert reader.read(message.topic, message.queue_id, message.queue_offset, 10) == []
        assert reader.lookup_id(message.msg_id, [message.topic]) == [] or all(
            m.phys_offset < manifest.tiered_end for m in reader.lookup_id(message.msg_id, [message.topic]))
    assert not {key for key, _, _ in counting.fetched} & orphans


def test_a_file_dropped_from_the_manifest_is_no_longer_served(tier):
    _, objects, manifest, records = tier
    reader = TierReader(objects)
    reader.refresh()
    oldest = min(manifest.segments, key=lambda s: s.base)
    gone = [f for f in manifest.files if f.segment == oldest.base]
    reader.set_manifest(dataclasses.replace(manifest, version=manifest.version + 1,
                                            segments=tuple(s for s in manifest.segments if s is not oldest),
                                            files=tuple(f for f in manifest.files if f not in gone)))
    reader.set_manifest(manifest)  # an older version is ignored
    first = min(records)
    with pytest.raises(KeyError):
        reader.read_at(first)
    assert reader.lookup_id(records[first].msg_id, [records[first].topic]) == []
    start = reader.queue_start("orders", 0)
    assert start > 0
    with pytest.raises(OffsetOutOfRangeError):
        reader.read("orders", 0, 0, 10)


def test_a_file_replaced_under_its_name_is_an_error_not_a_wrong_record(tier):
    _, objects, manifest, records = tier
    victim = max(manifest.files, key=lambda f: f.rows)
    other = next(f for f in manifest.files if f.key != victim.key)
    objects.put(victim.key, objects.get(other.key))
    reader = TierReader(objects)
    reader.refresh()
    for offset in range(victim.log_first, victim.log_last + 1):
        if offset in records and records[offset].topic == victim.topic:
            with pytest.raises((KeyError, StoreError)):  # missing from its file, or an error
                reader.read_at(offset)
            break
    span = victim.queues[0]
    with pytest.raises((TierDataError, CorruptRecordError)):
        reader.read(span.topic, span.queue, span.first, 5)


def test_a_missing_object_is_an_object_store_error(tier):
    _, objects, manifest, records = tier
    objects.delete(manifest.files[0].key)
    reader = TierReader(objects)
    reader.refresh()
    with pytest.raises(StoreError):
        reader.read_at(manifest.files[0].log_first)


def test_offsets_whose_home_files_are_gone_are_skipped_one_by_one(tier):
    """``orders-copy`` holds fan-out of ``audit`` and ``orders``: once ``audit``'s files are
    gone (its tier retention), its offsets there are missing, and reads stop before them."""
    store, objects, manifest, _ = tier
    reader = TierReader(objects)
    reader.refresh()
    reader.set_manifest(dataclasses.replace(manifest, version=manifest.version + 1,
                                            files=tuple(f for f in manifest.files if f.topic != "audit")))
    everything = store.read("orders-copy", 0, 0, 1000, 1 << 30)
    gone = [n for n, m in enumerate(everything) if m.topic == "audit" and n < reader.queue_end("orders-copy", 0)]
    assert gone and gone[0] > 0
    first = gone[0]
    assert [m.encode() for m in reader.read("orders-copy", 0, 0, 1000, 1 << 30)] == \
        [m.encode() for m in everything[:first]]
    with pytest.raises(MissingFromTier) as error:
        reader.read("orders-copy", 0, first, 10)
    assert isinstance(error.value, CorruptRecordError) and "next offset" in str(error.value)
    following = next(n for n in range(first + 1, reader.queue_end("orders-copy", 0)) if n not in gone)
    assert reader.read("orders-copy", 0, following, 1)[0].encode() == everything[following].encode()
