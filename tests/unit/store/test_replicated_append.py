"""A follower's log: the leader's records copied verbatim at the same offsets, indexed the same."""
from __future__ import annotations

import pytest

from store.api import StoreConfig
from store.errors import InvalidRecordError, ReplicaGapError
from store.file_store import FileStore

WAIT = 120  # seconds: only guards against hanging
SEGMENT = 64 << 10


def copy(leader: FileStore, follower: FileStore, max_bytes: int) -> int:
    """Ship everything durable on the leader, ``max_bytes`` at a time; return the batches sent."""
    batches = 0
    while chunk := leader.read_log(follower.appended_end, max_bytes, leader.durable_offset):
        follower.append_replicated(follower.appended_end, chunk)
        batches += 1
    return batches


def contents(store: FileStore, topic: str, queue_id: int) -> list[tuple]:
    low, high = store.queue_range(topic, queue_id)
    return [(m.phys_offset, m.queue_offset, m.msg_id, m.body, m.keys, m.properties, m.store_ts)
            for m in store.read(topic, queue_id, low, max_count=high - low + 1, max_bytes=1 << 40)]


@pytest.fixture
def pair(tmp_path):
    config = StoreConfig(segment_size=SEGMENT)
    leader, follower = FileStore(str(tmp_path / "leader"), config), FileStore(str(tmp_path / "follower"), config)
    yield leader, follower
    leader.close()
    follower.close()


@pytest.mark.parametrize("max_bytes", [1, 1000, 1 << 20])
def test_a_follower_holds_the_leaders_records_at_the_same_offsets_and_queue_positions(pair, tmp_path, max_bytes):
    leader, follower = pair
    results = [leader.append(f"t{i % 3}", bytes([i % 251]) * (i * 37 % 3000), queue_id=i % 2,
                             keys=[f"k{i}"], properties={"n": str(i)}) for i in range(400)]
    assert leader.wait_durable(results[-1].end_offset, timeout=WAIT)
    batches = copy(leader, follower, max_bytes)
    assert batches >= (400 if max_bytes == 1 else 2), "no batch spans segments"
    assert follower.wait_durable(leader.durable_offset, timeout=WAIT)
    assert follower.durable_offset == leader.durable_offset
    assert follower.wait_visible(leader.durable_offset, timeout=WAIT)
    for topic in ("t0", "t1", "t2"):
        for queue_id in (0, 1):
            assert contents(follower, topic, queue_id) == contents(leader, topic, queue_id)
    for i in (0, 199, 399):
        found = [m.phys_offset for m in follower.lookup_key(f"t{i % 3}", f"k{i}")]
        assert found == [results[i].phys_offset]
    follower.close()
    reopened = FileStore(str(tmp_path / "follower"), StoreConfig(segment_size=SEGMENT))
    try:
        assert contents(reopened, "t1", 1) == contents(leader, "t1", 1)
        assert reopened.appended_end == leader.durable_offset
    finally:
        reopened.close()


def test_a_follower_that_leads_appends_after_the_queue_positions_it_copied(pair):
    """A follower taking the lead keeps its open store: its own appends continue each queue
    (fan-out targets too) where the leader's copied records ended, never at a position a copied
    record holds."""
    leader, follower = pair
    results = [leader.append("t", b"x%d" % i, queue_id=i % 2, extra_queues=[("fan", 0)]) for i in range(5)]
    assert leader.wait_durable(results[-1].end_offset, timeout=WAIT)
    copy(leader, follower, 1 << 20)
    own = follower.append("t", b"own", queue_id=0, extra_queues=[("fan", 0)])
    assert (own.queue_offset, own.extra) == (3, (("fan", 0, 5),))
    assert follower.append("t", b"own1", queue_id=1).queue_offset == 2
    assert follower.wait_visible(follower.appended_end, timeout=WAIT)
    assert [m.body for m in follower.read("t", 0, 0, max_count=10)] == [b"x0", b"x2", b"x4", b"own"]
    assert [m.body for m in follower.read("fan", 0, 0, max_count=10)] == [b"x0", b"x1", b"x2", b"x3", b"x4", b"own"]


def test_bytes_that_do_not_start_at_the_followers_end_are_refused(pair):
    leader, follower = pair
    results = [leader.append("t", b"x" * 100) for _ in range(3)]
    assert leader.wait_durable(results[-1].end_offset, timeout=WAIT)
    second = leader.read_log(results[1].phys_offset, 1 << 20, leader.durable_offset)
    with pytest.raises(ReplicaGapError) as refused:
        follower.append_replicated(results[0].end_offset, second)
    assert refused.value.expected == 0
    assert follower.appended_end == 0


def test_damaged_or_partial_records_are_refused_and_nothing_is_appended(pair):
    leader, follower = pair
    results = [leader.append("t", b"y" * 200) for _ in range(2)]
    assert leader.wait_durable(results[-1].end_offset, timeout=WAIT)
    data = bytearray(leader.read_log(0, 1 << 20, leader.durable_offset))
    with pytest.raises(InvalidRecordError):
        follower.append_replicated(0, bytes(data[:-1]))  # the second record cut short
    data[100] ^= 0xFF
    with pytest.raises(InvalidRecordError):
        follower.append_replicated(0, bytes(data))
    assert follower.appended_end == 0
    with pytest.raises(InvalidRecordError):
        follower.append_replicated(0, leader.read_log(results[0].end_offset, 1 << 20, leader.durable_offset))


def test_reading_the_log_stops_at_the_end_asked_for_and_returns_a_large_record_whole(pair):
    leader, _ = pair
    results = [leader.append("t", b"z" * size) for size in (10, 5000, 10)]
    assert leader.wait_durable(results[-1].end_offset, timeout=WAIT)
    assert leader.read_log(0, 1 << 20, results[0].end_offset) == leader.read_log(0, 1, leader.durable_offset)
    big = leader.read_log(results[0].end_offset, 100, leader.durable_offset)
    assert len(big) == results[1].end_offset - results[0].end_offset
    assert leader.read_log(leader.durable_offset, 1 << 20, 1 << 40) == b""


def test_a_rejoining_follower_cut_back_to_the_leaders_history_matches_it_again(pair, tmp_path):
    from store.epochs import EpochFile
    from store.truncation import truncate_log

    leader, follower = pair
    shared = [leader.append("t", f"shared {i}".encode(), keys=[f"s{i}"]) for i in range(50)]
    assert leader.wait_durable(shared[-1].end_offset, timeout=WAIT)
    copy(leader, follower, 1 << 20)
    cut = follower.appended_end
    EpochFile(str(tmp_path / "follower")).begin(1, 0)
    EpochFile(str(tmp_path / "follower")).begin(2, cut)
    # the follower led briefly in epoch 2 and wrote records nobody else has, over a segment roll
    own = [follower.append("t", b"diverged" * 100, keys=["mine"]) for _ in range(300)]
    assert follower.wait_durable(own[-1].end_offset, timeout=WAIT)
    later = [leader.append("t", f"later {i}".encode()) for i in range(20)]
    assert leader.wait_durable(later[-1].end_offset, timeout=WAIT)
    follower.close()
    truncate_log(str(tmp_path / "follower"), cut, SEGMENT)
    assert EpochFile(str(tmp_path / "follower")).history.entries[-1].epoch == 1
    rejoined = FileStore(str(tmp_path / "follower"), StoreConfig(segment_size=SEGMENT))
    try:
        assert rejoined.appended_end == cut
        assert rejoined.lookup_key("t", "mine") == []
        copy(leader, rejoined, 4096)
        assert rejoined.wait_visible(leader.durable_offset, timeout=WAIT)
        assert contents(rejoined, "t", 0) == contents(leader, "t", 0)
    finally:
        rejoined.close()


def test_a_cut_below_what_was_confirmed_is_refused(tmp_path):
    from store.truncation import TruncationRefused, truncate_log

    with pytest.raises(TruncationRefused, match="already confirmed"):
        truncate_log(str(tmp_path), 100, SEGMENT, confirmed=200)
