"""A file store whose old segments were tiered and then deleted by local retention answers
every read for the old offsets exactly as it did before the deletion, through the tier."""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

from store.api import StoreConfig
from store.errors import CorruptRecordError, InvalidCursorError, OffsetOutOfRangeError
from store.file_store import FileStore
from store.reader import StoreReader
from store.tier.objects import LocalDirectory, TierLocation, save_location
from store.tier.reader import TierReader
from store.view import TIERED_CURSOR

from .build import segment_records, tier_segments
from .conftest import fill


def snapshot(view, offsets: list[int]) -> dict:
    """Everything a user can read of ``view``, as bytes and numbers."""
    out: dict = {"ranges": {}, "reads": {}, "at": {}, "keys": {}, "ids": {}, "times": {}}
    for topic, queue in view.queues():
        low, high = view.queue_range(topic, queue)
        out["ranges"][topic, queue] = (low, high)
        for size in (1, 7, 1000):
            for start in range(low, high, max(1, size // 2)):
                out["reads"][topic, queue, start, size] = [m.encode() for m in view.read(topic, queue, start, size)]
    for offset in offsets:
        message = view.read_at(offset)
        out["at"][offset] = message.encode()
        out["ids"][message.msg_id] = [m.encode() for m in view.lookup_id(message.msg_id, ["orders", "audit"], 3)]
        for topic, queue in (("orders", 0), ("orders-copy", 1), ("audit", 0)):
            out["times"][topic, queue, message.store_ts] = view.offset_for_time(topic, queue, message.store_ts)
    for key in ("k0", "k3", "all", "none"):
        out["keys"][key] = [m.encode() for m in view.lookup_key("orders", key, 500)]
    return out


def pages(view, key: str, limit: int) -> list[bytes]:
    found, after = [], None
    while True:
        page = view.lookup_key_page("orders", key, limit, after)
        found += [m.encode() for m in page.messages]
        if page.next is None:
            return found
        after = page.next


@pytest.fixture
def tiered(tmp_path):
    """A filled store, every sealed segment tiered, and what it answered before retention."""
    store = FileStore(str(tmp_path / "data"), StoreConfig(segment_size=4096, retention_max_bytes=1))
    fill(store)
    offsets = [m.phys_offset for segment in store.log.segments()[:-1] for m in segment_records(store, segment)]
    before = snapshot(store, offsets)
    before_pages = {limit: pages(store, "all", limit) for limit in (1, 4, 50)}
    objects = LocalDirectory(str(tmp_path / "tier"))
    manifest = tier_segments(store, objects, 1000)
    store.tier = TierReader(objects, cache_bytes=64 << 10)
    store.tier.refresh()
    report = store.apply_retention()
    assert store.log.min_offset == manifest.tiered_end and report.deleted_segments
    yield store, objects, offsets, before, before_pages
    store.close()


def test_every_read_answers_as_before_local_retention(tiered):
    store, _, offsets, before, before_pages = tiered
    assert snapshot(store, offsets) == before
    assert {limit: pages(store, "all", limit) for limit in (1, 4, 50)} == before_pages
    assert store.tier.cache_size <= 64 << 10


def test_without_the_tier_the_old_offsets_are_gone(tiered):
    store, _, offsets, before, _ = tiered
    store.tier = None
    low, _ = store.queue_range("orders", 0)
    assert low > before["ranges"]["orders", 0][0]
    with pytest.raises(OffsetOutOfRangeError):
        store.read("orders", 0, before["ranges"]["orders", 0][0])
    with pytest.raises(CorruptRecordError):
        store.read_at(offsets[0])


def test_a_read_spanning_the_boundary_continues_into_the_local_log(tiered):
    store, _, _, before, _ = tiered
    local_start = store.consume_queues.get("orders", 0, create=False).min_offset
    low, high = store.queue_range("orders", 0)
    assert low < local_start < high
    read = store.read("orders", 0, local_start - 2, 5)
    assert [m.queue_offset for m in read] == list(range(local_start - 2, local_start + 3))
    assert [m.encode() for m in read] == before["reads"]["orders", 0, low, 1000][local_start - 2 - low:][:5]


def test_reads_below_the_tier_are_out_of_range(tiered):
    store, objects, _, _, _ = tiered
    low, high = store.queue_range("orders", 1)
    assert low == 0
    tier = TierReader(objects)
    tier.refresh()
    manifest = tier.manifest
    dropped = [f for f in manifest.files if f.segment == manifest.segments[0].base]
    store.tier.set_manifest(dataclasses.replace(
        manifest, version=manifest.version + 1, segments=manifest.segments[1:],
        files=tuple(f for f in manifest.files if f not in dropped)))
    new_low = store.queue_range("orders", 1)[0]
    assert new_low > 0
    with pytest.raises(OffsetOutOfRangeError) as error:
        store.read("orders", 1, 0)
    assert error.value.min_offset == new_low


def test_a_tiered_cursor_needs_the_tier(tiered):
    store, _, _, _, _ = tiered
    page = store.lookup_key_page("orders", "all", 500)
    assert page.next is None
    first = store.lookup_key_page("orders", "all", 1)
    while first.next.entry != TIERED_CURSOR:
        first = store.lookup_key_page("orders", "all", 1, first.next)
    store.tier = None
    with pytest.raises(InvalidCursorError):
        store.lookup_key_page("orders", "all", 1, first.next)


def test_a_store_reader_in_another_process_reads_tiered_history(tiered, tmp_path):
    store, _, offsets, before, _ = tiered
    store.checkpoint()
    save_location(store.directory, TierLocation("file://" + str(tmp_path / "tier")))
    script = """
import json, sys
from store.reader import StoreReader
reader = StoreReader(sys.argv[1])
low, high = reader.queue_range("orders", 0)
print(json.dumps({"range": [low, high],
                  "read": [m.encode().hex() for m in reader.read("orders", 0, low, 10_000, 1 << 30)],
                  "at": reader.read_at(int(sys.argv[2])).encode().hex()}))
"""
    done = subprocess.run([sys.executable, "-c", script, store.directory, str(offsets[0])],
                          capture_output=True, text=True, timeout=120, check=True)
    answer = json.loads(done.stdout)
    assert tuple(answer["range"]) == before["ranges"]["orders", 0]
    assert [bytes.fromhex(h) for h in answer["read"]] == before["reads"]["orders", 0, 0, 1000]
    assert bytes.fromhex(answer["at"]) == before["at"][offsets[0]]
