"""A follower's store begun from a snapshot at the leader's log start, after the leader's
retention deleted the segments before it: the same queue offsets, reads, compacted values and
keys from there on as the leader, before and after more records, and across a reopen."""
from __future__ import annotations

import errno

import pytest

from store import snapshot
from store.api import StoreConfig
from store.faults import Fault
from store.file_store import FileStore

from tests.unit.store.test_replicated_append import SEGMENT, WAIT, contents, copy

QUEUES = [("t0", 0), ("t0", 1), ("t1", 0), ("state", 0), ("named", 0)]


def fill(leader: FileStore, start: int, count: int) -> None:
    results = []
    for i in range(start, start + count):
        results.append(leader.append(f"t{i % 2}", bytes([i % 251]) * 900, queue_id=(i // 2) % 2 if i % 2 == 0 else 0,
                                     keys=[f"k{i}"], extra_queues=(("named", 0),) if i % 5 == 0 else ()))
        if i % 7 == 0:  # a compacted topic: ten keys, each rewritten again and again
            results.append(leader.append("state", f"v{i}".encode(), keys=[f"s{i % 10}"]))
    assert leader.wait_durable(results[-1].end_offset, timeout=WAIT)


def test_a_follower_begun_at_the_leaders_log_start_matches_it_from_there_on(tmp_path):
    config = StoreConfig(segment_size=SEGMENT, retention_max_bytes=3 * SEGMENT)
    leader = FileStore(str(tmp_path / "leader"), config)
    FileStore(str(tmp_path / "follower"), config).close()  # a node that never got anything
    try:
        leader.enable_compaction("state")
        leader.append("state", b"set once, long ago", keys=["early"])  # only a compacted copy keeps it
        fill(leader, 0, 600)
        report = leader.apply_retention()
        assert report.deleted_segments and leader.log_start > 0
        assert all(leader.queue_range(topic, queue_id)[0] > 0 for topic, queue_id in QUEUES)

        snapshot.install(str(tmp_path / "follower"), snapshot.take(leader))
        follower = FileStore(str(tmp_path / "follower"), config)
        try:
            assert follower.log_start == follower.appended_end == leader.log_start
            copy(leader, follower, 1 << 20)
            fill(leader, 600, 100)
            copy(leader, follower, 1 << 20)
            assert follower.wait_visible(leader.durable_offset, timeout=WAIT)
            for topic, queue_id in QUEUES:
                assert follower.queue_range(topic, queue_id) == leader.queue_range(topic, queue_id), (topic, queue_id)
                assert contents(follower, topic, queue_id) == contents(leader, topic, queue_id)
            newest = {m.keys[0]: m.body for m in leader.compacted("state")}
            assert {m.keys[0]: m.body for m in follower.compacted("state")} == newest
            assert len(newest) == 11 and newest["early"] == b"set once, long ago"
            assert [m.phys_offset for m in follower.lookup_key("t1", "k651")] == \
                [m.phys_offset for m in leader.lookup_key("t1", "k651")] != []
        finally:
            follower.close()
        reopened = FileStore(str(tmp_path / "follower"), config)
        try:
            for topic, queue_id in QUEUES:
                assert contents(reopened, topic, queue_id) == contents(leader, topic, queue_id)
            assert reopened.appended_end == leader.durable_offset
        finally:
            reopened.close()
    finally:
        leader.close()


@pytest.mark.parametrize("op", ["mkdir", "write", "sync", "rename"])
def test_a_disk_fault_while_installing_leaves_the_old_store_whole(tmp_path, faults, op):
    """Every write of an install goes through the checked layer (site ``snapshot``): a failing
    one raises, and what the node had stays as it was (it asks for a snapshot again)."""
    config = StoreConfig(segment_size=SEGMENT)
    with FileStore(str(tmp_path / "node"), config) as store:
        result = store.append("kept", b"what the node had")
        assert store.wait_durable(result.end_offset, timeout=WAIT)
    faults.add(Fault("snapshot", op, errno.EIO, times=1))
    incoming = snapshot.StoreSnapshot(4096, [("t", 0, 5)], {"state/0.snapshot": b"x"}, b"1 0\n")
    if op == "rename":
        with pytest.raises(OSError):
            snapshot.install(str(tmp_path / "node"), incoming)
        with FileStore(str(tmp_path / "node"), config) as store:  # past the point of no return:
            assert store.appended_end in (0, 4096)  # it opens, shares nothing with the leader, asks again
        return
    with pytest.raises(OSError):
        snapshot.install(str(tmp_path / "node"), incoming)
    assert not (tmp_path / "node" / ".snapshot-staging").exists()
    with FileStore(str(tmp_path / "node"), config) as store:
        assert [m.body for m in store.read("kept", 0, 0)] == [b"what the node had"]
