"""Live members of consumer groups and how a group's queues are split among them.

A member is known by its heartbeats; one silent for longer than the heartbeat timeout is
evicted, and the queues it owned go to the others at their next assignment query. Queues are
split as RocketMQ's ``AllocateMessageQueueAveragely`` does: members sorted by client id, each
takes a contiguous run, the first ``queues % members`` take one more.

Runs on the event loop; not thread-safe.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .model import Member


@dataclass
class _Client:
    last_seen_ms: int
    topics: set[str] = field(default_factory=set)
    """Topics the client subscribes to; empty means unknown (assume all)."""
    assigned: dict[str, tuple[int, ...]] = field(default_factory=dict)
    """Queues last handed out per topic (set by ``assign``)."""


def split_queues(queue_count: int, members: list[str], client_id: str) -> tuple[int, ...]:
    """The queues ``client_id`` owns when ``members`` (sorted) share ``queue_count`` queues."""
    if client_id not in members:
        return ()
    index, count = members.index(client_id), len(members)
    size, extra = divmod(queue_count, count)
    start = index * size + min(index, extra)
    return tuple(range(start, start + size + (1 if index < extra else 0)))


class Membership:
    """Clients per group, with their last heartbeat."""

    def __init__(self, timeout_ms: int) -> None:
        self.timeout_ms = timeout_ms
        self._groups: dict[str, dict[str, _Client]] = {}

    def heartbeat(self, group: str, client_id: str, now_ms: int, topics: set[str] | None = None) -> None:
        """Record that ``client_id`` is alive in ``group`` (and, if given, what it subscribes to)."""
        client = self._groups.setdefault(group, {}).get(client_id)
        if client is None:
            client = self._groups[group][client_id] = _Client(now_ms)
        client.last_seen_ms = now_ms
        if topics:
            client.topics = set(topics)

    def leave(self, group: str, client_id: str) -> bool:
        """Remove a client that said goodbye; return whether it was a member."""
        clients = self._groups.get(group, {})
        return clients.pop(client_id, None) is not None

    def expire(self, now_ms: int) -> list[tuple[str, str]]:
        """Evict members silent for longer than the timeout; return (group, client) evicted."""
        evicted = []
        for group, clients in self._groups.items():
            for client_id in [c for c, client in clients.items()
                              if now_ms - client.last_seen_ms > self.timeout_ms]:
                del clients[client_id]
                evicted.append((group, client_id))
        return evicted

    def members(self, group: str, topic: str | None = None) -> list[str]:
        """Live client ids of ``group`` (subscribing to ``topic``, if given), sorted."""
        clients = self._groups.get(group, {})
        return sorted(c for c, client in clients.items()
                      if topic is None or not client.topics or topic in client.topics)

    def assign(self, group: str, topic: str, client_id: str, queue_count: int, now_ms: int) -> tuple[int, ...]:
        """The queues of ``topic`` that ``client_id`` owns now; registers the client if new."""
        clients = self._groups.setdefault(group, {})
        if client_id not in clients:
            clients[client_id] = _Client(now_ms)
        owned = split_queues(queue_count, self.members(group, topic), client_id)
        clients[client_id].assigned[topic] = owned
        return owned

    def assigned(self, group: str, client_id: str, topic: str) -> tuple[int, ...] | None:
        """Queues last assigned to the client for ``topic``, or None if it never asked."""
        client = self._groups.get(group, {}).get(client_id)
        return None if client is None else client.assigned.get(topic)

    def describe(self, group: str) -> tuple[Member, ...]:
        """The group's live members with the queues they were last assigned."""
        clients = self._groups.get(group, {})
        return tuple(
            Member(client_id, client.last_seen_ms,
                   tuple((topic, q) for topic, queues in sorted(client.assigned.items()) for q in queues))
            for client_id, client in sorted(clients.items()))

    def drop_group(self, group: str) -> None:
        """Forget every member of a deleted group."""
        self._groups.pop(group, None)
