"""Which followers are in sync: the leader's rule for shrinking and growing the in-sync set,
and the set confirms wait for while a change is being committed in etcd.

A follower stays in sync while it keeps up: it has acknowledged, within ``timeout_s``, everything
the leader had durable one acknowledgement earlier (Kafka's "last caught-up time"), or it holds
the leader's whole durable log. One that falls further behind is dropped, and so is one whose
etcd lease is gone (it is down) at once. A follower joins when
it holds everything confirmed so far and at least the start of the current epoch: adding it
cannot move the confirm offset back, and its log is the leader's (it truncated and caught up).

While a change is committed, confirms wait for the old set and the new one together (I3): a
dropped follower still holds confirms back until etcd has recorded that it left, and a joining
one holds them from the moment the leader decides to add it.
"""
from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass


@dataclass
class Progress:
    """What the leader knows of one follower's log."""

    durable: int
    caught_up_at: float
    """Monotonic time it last held everything the leader had durable one acknowledgement
    earlier (or when it connected in this epoch)."""
    target: int = 0
    """The leader's durable end at the follower's previous acknowledgement."""
    connected: bool = True

    def acknowledged(self, durable: int, leader_durable: int, now: float) -> None:
        self.durable = max(self.durable, durable)
        if self.durable >= self.target:
            self.caught_up_at = now
        self.target = leader_durable


def next_in_sync(current: Iterable[str], leader: str, followers: Mapping[str, Progress], *, leader_durable: int,
                 confirmed: int, epoch_start: int, epoch_began_at: float, now: float,
                 timeout_s: float, alive: Collection[str] | None = None) -> tuple[str, ...]:
    """The in-sync set the leader should record next (the leader first, then by name).
    ``alive``: the nodes whose etcd lease lives; one not among them and not connected is
    dropped at once instead of after ``timeout_s`` (it is down)."""
    members = set(current) | {leader}
    kept = {leader}
    for node in members - {leader}:
        progress = followers.get(node)
        if alive is not None and node not in alive and (progress is None or not progress.connected):
            continue
        if progress is None:  # not heard from in this epoch: it has until the timeout to connect
            if now - epoch_began_at <= timeout_s:
                kept.add(node)
        elif progress.durable >= leader_durable or now - progress.caught_up_at <= timeout_s:
            kept.add(node)
    for node, progress in followers.items():
        if node not in members and progress.connected and progress.durable >= max(confirmed, epoch_start):
            kept.add(node)
    return (leader, *sorted(kept - {leader}))


class InSyncGate:
    """The set confirms wait for: the recorded set, joined by the proposed one while it is
    being committed."""

    def __init__(self, recorded: Iterable[str]) -> None:
        self.recorded = tuple(recorded)
        self.proposed: tuple[str, ...] | None = None

    def members(self) -> tuple[str, ...]:
        if self.proposed is None:
            return self.recorded
        return self.recorded + tuple(node for node in self.proposed if node not in self.recorded)

    def propose(self, members: Iterable[str]) -> None:
        self.proposed = tuple(members)

    def committed(self, members: Iterable[str]) -> None:
        self.recorded, self.proposed = tuple(members), None

    def abandoned(self) -> None:
        self.proposed = None
