"""Leader epochs and the consistent point a rejoining replica truncates to."""
from __future__ import annotations

import os

import pytest

from store.epochs import (Epoch, EpochFile, EpochFileError, EpochHistory, StaleEpochError,
                          consistent_point)


def history(*pairs: tuple[int, int]) -> EpochHistory:
    return EpochHistory([Epoch(epoch, start) for epoch, start in pairs])


def leader(entries: EpochHistory, end: int):
    questions: list[int] = []

    def ask(epoch: int):
        questions.append(epoch)
        return entries.end_of(epoch, end)
    ask.questions = questions  # type: ignore[attr-defined]
    return ask


# (case, replica epochs, replica end, leader epochs, leader end, consistent point)
CASES = [
    ("same history, replica behind", [(1, 0)], 500, [(1, 0)], 900, 500),
    ("same history, replica ahead of a leader that lost nothing confirmed", [(1, 0)], 900, [(1, 0)], 500, 500),
    ("identical", [(1, 0), (5, 300)], 800, [(1, 0), (5, 300)], 800, 800),
    # KIP-101: the old leader wrote past what the new leader had when it took over
    ("old leader's unreplicated tail", [(1, 0)], 700, [(1, 0), (4, 600)], 900, 600),
    ("replica missed a whole epoch", [(1, 0)], 400, [(1, 0), (3, 600), (7, 800)], 1000, 400),
    # KIP-279: a double failover, the replica's newest epoch never reached the leader
    ("replica's own epoch unknown to the leader", [(1, 0), (3, 500)], 700, [(1, 0), (4, 450)], 900, 450),
    ("two epochs unknown to the leader", [(1, 0), (3, 500), (6, 650)], 700, [(1, 0), (8, 480)], 900, 480),
    ("leader skipped an epoch the replica had", [(1, 0), (2, 100), (3, 200)], 300,
     [(1, 0), (2, 100), (4, 250)], 400, 200),
    ("replica's epoch unknown, the leader has a later one beside it", [(1, 0), (2, 100)], 300,
     [(1, 0), (3, 150)], 600, 100),
    ("nothing in common", [(5, 0)], 300, [(6, 0)], 200, 0),
    ("empty replica", [], 0, [(2, 0)], 200, 0),
    ("replica epochs all newer than the leader's", [(9, 0)], 50, [(2, 0), (4, 10)], 60, 0),
]


@pytest.mark.parametrize("case, replica, replica_end, leader_entries, leader_end, expected",
                         CASES, ids=[case[0] for case in CASES])
def test_consistent_point(case, replica, replica_end, leader_entries, leader_end, expected):
    ask = leader(history(*leader_entries), leader_end)
    assert consistent_point(history(*replica), replica_end, ask) == expected


def test_the_replica_asks_about_older_epochs_only_as_far_as_needed():
    ask = leader(history((1, 0), (2, 50), (4, 90)), 500)
    assert consistent_point(history((1, 0), (3, 100), (6, 300)), 400, ask) == 50
    assert ask.questions == [6, 3, 1]


def test_a_leader_answering_a_newer_epoch_is_refused():
    with pytest.raises(EpochFileError):
        consistent_point(history((2, 0)), 10, lambda epoch: (3, 10))


@pytest.mark.parametrize("epoch, expected", [(0, None), (1, (1, 100)), (2, (1, 100)), (3, (3, 250)),
                                             (4, (3, 250)), (5, (5, 400)), (99, (5, 400))])
def test_where_an_epoch_ends(epoch, expected):
    assert history((1, 0), (3, 100), (5, 250)).end_of(epoch, 400) == expected


def test_epochs_file_survives_reopen_and_refuses_stale_epochs(tmp_path):
    epochs = EpochFile(str(tmp_path))
    assert epochs.history.latest is None
    epochs.begin(3, 0)
    epochs.begin(7, 120)
    with pytest.raises(StaleEpochError):
        epochs.begin(7, 200)
    with pytest.raises(StaleEpochError):
        epochs.begin(5, 200)
    assert EpochFile(str(tmp_path)).history.entries == [Epoch(3, 0), Epoch(7, 120)]


def test_an_epoch_that_wrote_nothing_is_replaced_by_the_next(tmp_path):
    epochs = EpochFile(str(tmp_path))
    epochs.begin(3, 0)
    epochs.begin(4, 50)
    epochs.begin(6, 50)
    assert epochs.history.entries == [Epoch(3, 0), Epoch(6, 50)]


def test_truncation_forgets_epochs_that_start_at_or_after_the_cut(tmp_path):
    epochs = EpochFile(str(tmp_path))
    for epoch, start in ((1, 0), (2, 100), (4, 300)):
        epochs.begin(epoch, start)
    epochs.truncate(300)
    assert EpochFile(str(tmp_path)).history.entries == [Epoch(1, 0), Epoch(2, 100)]
    epochs.truncate(150)
    assert epochs.history.entries == [Epoch(1, 0), Epoch(2, 100)]


def test_a_damaged_epochs_file_is_an_error_that_says_what_to_do(tmp_path):
    with open(os.path.join(tmp_path, "epochs"), "w") as file:
        file.write("3 0\nthree 40\n")
    with pytest.raises(EpochFileError, match="line 2"):
        EpochFile(str(tmp_path))
    with open(os.path.join(tmp_path, "epochs"), "w") as file:
        file.write("5 0\n3 40\n")
    with pytest.raises(EpochFileError, match="out of order"):
        EpochFile(str(tmp_path))


@pytest.mark.parametrize("offset, epoch, following", [(0, 1, 100), (99, 1, 100), (100, 3, 250), (300, 5, None)])
def test_which_epoch_holds_an_offset_and_where_the_next_begins(offset, epoch, following):
    entries = history((1, 0), (3, 100), (5, 250))
    assert entries.epoch_at(offset) == epoch
    assert entries.next_start(offset) == following
