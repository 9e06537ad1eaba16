"""Leader epochs of a replicated commit log, and where two replicas' histories part.

    <data>/epochs    one line per epoch: "<epoch> <start offset>\\n", epochs rising

An epoch is the fencing token of one leadership (in a cluster, the ``create_revision`` of the
leader key in etcd); its start offset is where the first record written under it begins. The
file is replaced durably before an epoch's first record is appended, so every byte of the log
belongs to the epoch with the greatest start at or below its offset.

A rejoining replica keeps only the prefix it shares with the leader: ``consistent_point`` asks
the leader where each of the replica's epochs ends in the leader's history (Kafka's
OffsetsForLeaderEpoch, KIP-101 and KIP-279) and returns the first offset that may differ.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .durable_files import replace_file
from .errors import StoreError

_SITE = "epochs"
FILE_NAME = "epochs"


class StaleEpochError(StoreError):
    """An epoch at or below one already recorded: its leader has been superseded."""


class EpochFileError(StoreError):
    """The epochs file cannot be read as written by this module."""


@dataclass(frozen=True)
class Epoch:
    """One leadership: its fencing token and the commit-log offset its first record has."""

    epoch: int
    start: int


class EpochHistory:
    """The epochs of one log, oldest first (in memory; ``EpochFile`` keeps them on disk)."""

    def __init__(self, entries: Sequence[Epoch] = ()) -> None:
        self.entries = list(entries)
        for before, after in zip(self.entries, self.entries[1:]):
            if after.epoch <= before.epoch or after.start < before.start:
                raise EpochFileError(f"epochs out of order: {before} then {after}")

    @property
    def latest(self) -> Epoch | None:
        return self.entries[-1] if self.entries else None

    def end_of(self, epoch: int, log_end: int) -> tuple[int, int] | None:
        """Answer a replica that last wrote in ``epoch``: (the greatest epoch here at or below
        it, the offset where that epoch's records end here), or None if every epoch here is
        greater (nothing in common but the empty prefix)."""
        found = None
        for index, entry in enumerate(self.entries):
            if entry.epoch > epoch:
                break
            found = index
        if found is None:
            return None
        following = self.entries[found + 1] if found + 1 < len(self.entries) else None
        return self.entries[found].epoch, following.start if following is not None else log_end

    def epoch_at(self, offset: int) -> int:
        """The epoch the record at ``offset`` was written in (0 before the first epoch)."""
        current = 0
        for entry in self.entries:
            if entry.start > offset:
                break
            current = entry.epoch
        return current

    def next_start(self, offset: int) -> int | None:
        """Where the first epoch starting after ``offset`` starts (None: no later epoch)."""
        return next((entry.start for entry in self.entries if entry.start > offset), None)

    def with_epoch(self, epoch: int, start: int) -> EpochHistory:
        """This history with ``epoch`` beginning at ``start``; a stale epoch is refused."""
        latest = self.latest
        if latest is not None and epoch <= latest.epoch:
            raise StaleEpochError(f"epoch {epoch} is not after the latest recorded epoch {latest.epoch}")
        if latest is not None and start < latest.start:
            raise EpochFileError(f"epoch {epoch} would start at {start}, before epoch "
                                 f"{latest.epoch} at {latest.start}")
        # an epoch that wrote nothing is replaced by the next one starting at the same offset
        kept = [entry for entry in self.entries if entry.start < start]
        return EpochHistory([*kept, Epoch(epoch, start)])

    def truncated(self, end: int) -> EpochHistory:
        """This history once the log is cut at ``end``: epochs starting at or after it go."""
        return EpochHistory([entry for entry in self.entries if entry.start < end])


class EpochFile:
    """The epochs file of a data directory."""

    def __init__(self, directory: str) -> None:
        self.path = os.path.join(directory, FILE_NAME)
        self.history = EpochHistory(_read(self.path))

    def begin(self, epoch: int, start: int) -> None:
        """Record, durably, that ``epoch`` starts at ``start``, before anything is appended in it."""
        self._save(self.history.with_epoch(epoch, start))

    def truncate(self, end: int) -> None:
        """Forget epochs that start at or after ``end`` (the log was cut there)."""
        history = self.history.truncated(end)
        if history.entries != self.history.entries:
            self._save(history)

    def _save(self, history: EpochHistory) -> None:
        text = "".join(f"{entry.epoch} {entry.start}\n" for entry in history.entries)
        replace_file(self.path, text.encode("ascii"), site=_SITE)
        self.history = history


def _read(path: str) -> list[Epoch]:
    try:
        with open(path, "rb") as file:
            text = file.read().decode("ascii")
    except FileNotFoundError:
        return []
    except UnicodeDecodeError:
        raise EpochFileError(f"{path} is not an epochs file; restore it or remove the node's data "
                             "directory so that it copies the log from the leader again") from None
    entries = []
    for number, line in enumerate(text.splitlines(), 1):
        fields = line.split()
        if len(fields) != 2 or not all(field.isdigit() for field in fields):
            raise EpochFileError(f"{path} line {number} is not '<epoch> <start offset>': {line!r}")
        entries.append(Epoch(int(fields[0]), int(fields[1])))
    return entries


LeaderLookup = Callable[[int], "tuple[int, int] | None"]
"""Asks the leader ``EpochHistory.end_of(epoch, its log end)``."""


def consistent_point(replica: EpochHistory, replica_end: int, ask_leader: LeaderLookup) -> int:
    """The offset up to which the replica's log is also the leader's: cut there and catch up.

    The replica names its latest epoch; the leader answers with the greatest epoch it has at or
    below that one and where that epoch ends in its log. If the replica has that epoch too, the
    two agree up to the smaller of the two ends. Otherwise the replica's records after its own
    greatest epoch below the answer were never the leader's, and it asks again about that
    epoch. With nothing in common the answer is 0: the replica copies the whole log again.
    """
    entries = replica.entries
    index = len(entries) - 1
    while index >= 0:
        epoch = entries[index].epoch
        answer = ask_leader(epoch)
        if answer is None:
            return 0
        leader_epoch, leader_end = answer
        if leader_epoch > epoch:
            raise EpochFileError(f"the leader answered epoch {leader_epoch} to a question about epoch {epoch}")
        while index >= 0 and entries[index].epoch > leader_epoch:
            index -= 1
        if index >= 0 and entries[index].epoch == leader_epoch:
            own_end = entries[index + 1].start if index + 1 < len(entries) else replica_end
            return min(leader_end, own_end)
    return 0
