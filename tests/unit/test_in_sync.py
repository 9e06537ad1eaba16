"""The leader's rule for the in-sync set, as a table, and the set confirms wait for meanwhile."""
from __future__ import annotations

import pytest

from sluice.cluster.in_sync import InSyncGate, Progress, next_in_sync

T = 4.0  # timeout_s

# (case, current set, followers {node: (durable, caught_up_at, connected)}, leader durable,
#  confirmed, epoch start, now, expected)
CASES = [
    ("all keeping up", ["n1", "n2", "n3"], {"n2": (100, 9.0, True), "n3": (100, 9.5, True)},
     100, 100, 0, 10.0, ("n1", "n2", "n3")),
    ("idle but caught up long ago stays", ["n1", "n2"], {"n2": (100, 1.0, True)},
     100, 100, 0, 60.0, ("n1", "n2")),
    ("behind and silent past the timeout leaves", ["n1", "n2", "n3"], {"n2": (100, 9.0, True), "n3": (40, 5.0, True)},
     100, 40, 0, 10.0, ("n1", "n2")),
    ("behind but within the timeout stays", ["n1", "n2"], {"n2": (40, 7.0, True)},
     100, 40, 0, 10.0, ("n1", "n2")),
    ("disconnected and behind leaves after the timeout", ["n1", "n2"], {"n2": (40, 2.0, False)},
     100, 40, 0, 10.0, ("n1",)),
    ("never connected in this epoch: grace until the timeout", ["n1", "n2"], {},
     100, 0, 0, 3.0, ("n1", "n2")),
    ("never connected in this epoch: gone after it", ["n1", "n2"], {},
     100, 0, 0, 5.0, ("n1",)),
    ("a follower holding everything confirmed joins", ["n1"], {"n2": (80, 10.0, True)},
     100, 80, 50, 10.0, ("n1", "n2")),
    ("a follower behind the confirm offset does not join", ["n1"], {"n2": (79, 10.0, True)},
     100, 80, 50, 10.0, ("n1",)),
    ("a follower still before this epoch's start does not join", ["n1"], {"n2": (40, 10.0, True)},
     100, 30, 50, 10.0, ("n1",)),
    ("a disconnected follower does not join", ["n1"], {"n2": (100, 10.0, False)},
     100, 100, 50, 10.0, ("n1",)),
    ("the leader is always in its set", ["n2", "n3"], {"n2": (100, 9.0, True), "n3": (100, 9.0, True)},
     100, 100, 0, 10.0, ("n1", "n2", "n3")),
    # double failover: n3 led epoch 2 and died; n1 leads epoch 3; n3 comes back with a longer log
    ("a returning old leader joins only after truncating into this epoch", ["n1", "n2"],
     {"n2": (300, 9.0, True), "n3": (250, 10.0, True)}, 300, 300, 200, 10.0, ("n1", "n2")),
    ("and does once it holds what is confirmed", ["n1", "n2"],
     {"n2": (300, 9.0, True), "n3": (300, 10.0, True)}, 300, 300, 200, 10.0, ("n1", "n2", "n3")),
]


@pytest.mark.parametrize("case, current, followers, leader_durable, confirmed, epoch_start, now, expected",
                         CASES, ids=[case[0] for case in CASES])
def test_next_in_sync(case, current, followers, leader_durable, confirmed, epoch_start, now, expected):
    progress = {node: Progress(durable, caught_up_at, connected=connected)
                for node, (durable, caught_up_at, connected) in followers.items()}
    assert next_in_sync(current, "n1", progress, leader_durable=leader_durable, confirmed=confirmed,
                        epoch_start=epoch_start, epoch_began_at=0.0, now=now, timeout_s=T) == expected


def test_a_follower_is_caught_up_when_it_holds_what_the_leader_had_one_ack_earlier():
    progress = Progress(durable=0, caught_up_at=0.0)
    progress.acknowledged(50, leader_durable=100, now=1.0)  # target was 0: caught up
    assert progress.caught_up_at == 1.0
    progress.acknowledged(90, leader_durable=150, now=2.0)  # behind the 100 of the last ack
    assert progress.caught_up_at == 1.0
    progress.acknowledged(150, leader_durable=200, now=3.0)  # holds the 150 of the last ack
    assert progress.caught_up_at == 3.0


def test_confirms_wait_for_old_and_new_members_while_a_change_is_committed():
    gate = InSyncGate(("n1", "n2", "n3"))
    gate.propose(("n1", "n2"))
    assert set(gate.members()) == {"n1", "n2", "n3"}, "n3 holds confirms until its removal is recorded"
    gate.committed(("n1", "n2"))
    assert gate.members() == ("n1", "n2")
    gate.propose(("n1", "n2", "n3"))
    assert set(gate.members()) == {"n1", "n2", "n3"}, "a joining member holds confirms at once"
    gate.abandoned()
    assert gate.members() == ("n1", "n2")


def test_a_member_whose_lease_is_gone_leaves_at_once_and_a_live_one_gets_the_timeout():
    common = dict(leader_durable=100, confirmed=100, epoch_start=100, epoch_began_at=0.0, now=1.0, timeout_s=4.0)
    assert next_in_sync(["n1", "n2", "n3"], "n1", {}, alive={"n1", "n3"}, **common) == ("n1", "n3")
    connected = {"n2": Progress(100, 1.0)}  # connected although etcd no longer lists it: kept while it keeps up
    assert next_in_sync(["n1", "n2"], "n1", connected, alive={"n1"}, **common) == ("n1", "n2")
