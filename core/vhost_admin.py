"""What administrators see and do with virtual hosts, as ``rabbitmqctl`` and RabbitMQ's
management API show it: virtual hosts and permissions, exchanges, queues with their counts and
rates, bindings, AMQP connections and channels; purge and delete queues.

Core knows the virtual hosts (``VirtualHosts``), the permissions (``VhostPermissions``) and the
queues' consumption state (``NamedQueues``); what only the protocol adapter knows (consumers,
channels, open connections) comes from a ``LiveVhosts`` the composition root attaches. Callers
(the admin API) decide who may call what. Runs on the event loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from .errors import NotFound, PreconditionFailed
from .exchanges import DEFAULT_EXCHANGE
from .named_queues import NamedQueues
from .queue_features import features, levels
from .untrusted import clip
from .vhost_permissions import VhostPermission, VhostPermissions
from .vhosts import QueueSettings, VirtualHosts, named_queue

RATE_WINDOW_S = 5.0
"""Rates are averaged over at least this long (RabbitMQ samples every 5 s)."""


class LiveVhosts(Protocol):
    """What the AMQP front end knows live (``protocols.amqp.frontend.AmqpFrontend``)."""

    def consumer_count(self, queue: str) -> int:
        """Consumers of the named queue ``queue``."""

    def deleted(self, queue: str) -> None:
        """The named queue ``queue`` is gone: cancel its consumers, forget its state."""

    def close_vhost(self, vhost: str) -> int:
        """Close every connection to ``vhost`` (320); how many."""

    def connections(self) -> list[dict[str, Any]]:
        """Every open connection: id, user, peer, vhost, channels, ..."""

    def channels(self) -> list[dict[str, Any]]:
        """Every open channel: connection, number, user, vhost, consumers, unacked, ..."""


@dataclass
class _Sample:
    at: float
    counts: dict[str, tuple[int, int, int]]
    """Named queue -> (published, delivered, settled) totals."""


class VhostAdmin:
    """The administration of virtual hosts and their queues."""

    def __init__(self, vhosts: VirtualHosts, permissions: VhostPermissions,
                 queues: NamedQueues) -> None:
        self.vhosts = vhosts
        self.permissions = permissions
        self.queues = queues
        self.live: LiveVhosts | None = None
        """Set by the composition root once the AMQP front end runs."""
        self._samples: list[_Sample] = []

    # --- virtual hosts ---

    def list_vhosts(self, shown: Callable[[str], bool] = lambda _: True) -> list[dict[str, Any]]:
        """The virtual hosts ``shown`` accepts, with their counts (nothing is counted for the
        others)."""
        rows = []
        for name in self.vhosts.names():
            if not shown(name):
                continue
            host = self.vhosts.get(name)
            ready = sum(self.queues.ready(level) for q in host.queues.values()
                        for level in _levels(name, q))
            rows.append({"name": name, "exchanges": len(host.graph.exchanges()),
                         "queues": len(host.queues), "messages_ready": ready})
        return rows

    async def add_vhost(self, name: str) -> dict[str, Any]:
        """Create ``name`` (AlreadyExists, InvalidArgument)."""
        await self.vhosts.create(name)
        return {"name": name, "exchanges": len(self.vhosts.get(name).graph.exchanges()),
                "queues": 0, "messages_ready": 0}

    async def delete_vhost(self, name: str) -> None:
        """Close its connections, delete it with everything in it and its permissions."""
        self.vhosts.get(name)
        if self.live is not None:
            self.live.close_vhost(name)
        for queue in await self.vhosts.delete(name):
            self._forget(queue)
        await self.permissions.vhost_deleted(name)

    # --- permissions ---

    async def permit(self, user: str, vhost: str, configure: str, write: str,
                     read: str) -> VhostPermission:
        """Set ``user``'s permission on ``vhost`` (NotFound, UserNotFound, InvalidArgument)."""
        self.vhosts.get(vhost)
        permission = VhostPermission(user, vhost, configure, write, read)
        await self.permissions.set(permission)
        return permission

    async def unpermit(self, user: str, vhost: str) -> None:
        """Remove ``user``'s permission on ``vhost``; NotFound if there is none."""
        if not await self.permissions.clear(user, vhost):
            raise NotFound(f"user {clip(user)} has no permission on vhost {clip(vhost)}")

    # --- listing ---

    def _hosts(self, vhost: str | None) -> list[str]:
        if vhost is None:
            return self.vhosts.names()
        self.vhosts.get(vhost)
        return [vhost]

    def exchanges(self, vhost: str | None = None) -> list[dict[str, Any]]:
        return [{"vhost": name, "name": e.name, "type": e.kind, "durable": e.durable,
                 "auto_delete": e.auto_delete, "internal": e.internal,
                 "arguments": e.arguments}
                for name in self._hosts(vhost) for e in self.vhosts.get(name).graph.exchanges()]

    def bindings(self, vhost: str | None = None) -> list[dict[str, Any]]:
        rows = []
        for name in self._hosts(vhost):
            host = self.vhosts.get(name)
            rows += [{"vhost": name, "source": DEFAULT_EXCHANGE, "destination": queue,
                      "destination_type": "queue", "routing_key": queue, "arguments": {}}
                     for queue in sorted(host.queues)]  # the default exchange's, implicit
            rows += [{"vhost": name, "source": b.source, "destination": b.destination.name,
                      "destination_type": "exchange" if b.destination.is_exchange else "queue",
                      "routing_key": b.routing_key, "arguments": dict(b.arguments)}
                     for b in host.graph.bindings()]
        return rows

    def queues_of(self, vhost: str | None = None) -> list[dict[str, Any]]:
        """Every queue with messages ready and unacknowledged, consumers, totals and rates."""
        rates = self._rates()
        rows = []
        for name in self._hosts(vhost):
            for queue in sorted(self.vhosts.get(name).queues.values(), key=lambda q: q.name):
                rows.append(self._queue_row(name, queue, rates))
        return rows

    def queue(self, vhost: str, name: str) -> dict[str, Any]:
        return self._queue_row(vhost, self.vhosts.get(vhost).queue(name), self._rates())

    def _queue_row(self, vhost: str, queue: QueueSettings,
                   rates: dict[str, tuple[float, ...]]) -> dict[str, Any]:
        named = named_queue(vhost, queue.name, queue.incarnation)
        queues = _levels(vhost, queue)
        published, delivered, settled = self._totals(queues)
        publish_rate, deliver_rate, ack_rate = rates.get(named, (0.0, 0.0, 0.0))
        return {"vhost": vhost, "name": queue.name, "durable": queue.durable,
                "auto_delete": queue.auto_delete, "exclusive": queue.owner is not None,
                "arguments": queue.arguments,
                "messages_ready": sum(self.queues.ready(level) for level in queues),
                "messages_unacknowledged": sum(self.queues.unsettled(level) for level in queues),
                "consumers": self.live.consumer_count(named) if self.live else 0,
                "published": published, "delivered": delivered, "acked": settled,
                "publish_rate": publish_rate, "deliver_rate": deliver_rate,
                "ack_rate": ack_rate}

    def connections(self) -> list[dict[str, Any]]:
        return self.live.connections() if self.live else []

    def channels(self) -> list[dict[str, Any]]:
        return self.live.channels() if self.live else []

    # --- operations ---

    def purge(self, vhost: str, name: str) -> int:
        """Settle every ready message of queue ``name``; how many (NotFound)."""
        queue = self.vhosts.get(vhost).queue(name)
        return sum(self.queues.purge(level) for level in _levels(vhost, queue))

    async def delete_queue(self, vhost: str, name: str, *, if_unused: bool = False,
                           if_empty: bool = False) -> int:
        """Delete queue ``name`` (its consumers are cancelled); the messages it had ready."""
        queue = self.vhosts.get(vhost).queue(name)
        named = named_queue(vhost, name, queue.incarnation)
        ready = sum(self.queues.ready(level) for level in _levels(vhost, queue))
        if if_unused and self.live is not None and self.live.consumer_count(named):
            raise PreconditionFailed(f"queue {clip(name)} in vhost {clip(vhost)} in use")
        if if_empty and ready:
            raise PreconditionFailed(f"queue {clip(name)} in vhost {clip(vhost)} is not empty")
        self._forget(await self.vhosts.delete_queue(vhost, name))
        return ready

    def _forget(self, queue: str) -> None:
        if self.live is not None:
            self.live.deleted(queue)
        else:
            self.queues.forget(queue)

    # --- totals and rates ---

    def _totals(self, queues: tuple[str, ...]) -> tuple[int, int, int]:
        """(published, delivered, settled) of a queue's named queues: entries indexed into
        them (their end offsets), and pops and settles since the broker started."""
        named = self.queues
        return (sum(named.bounds(q)[1] for q in queues),
                sum(named.delivered.get(q, 0) for q in queues),
                sum(named.settled.get(q, 0) for q in queues))

    def _rates(self) -> dict[str, tuple[float, ...]]:
        """Per second, per named queue, since a sample at least ``RATE_WINDOW_S`` old (or the
        oldest one); a sample is kept at most every ``RATE_WINDOW_S``."""
        now = time.monotonic()
        counts = {named_queue(v, q.name, q.incarnation): self._totals(_levels(v, q))
                  for v in self.vhosts.names() for q in self.vhosts.get(v).queues.values()}
        samples = self._samples
        if not samples or now - samples[-1].at >= RATE_WINDOW_S:
            samples.append(_Sample(now, counts))
        while len(samples) > 2 and now - samples[1].at >= RATE_WINDOW_S:
            samples.pop(0)
        base = samples[0]
        elapsed = now - base.at
        if elapsed <= 0:
            return {}
        return {named: tuple(max(0, now_c - then_c) / elapsed
                             for now_c, then_c in zip(totals, base.counts.get(named, totals)))
                for named, totals in counts.items()}


def _levels(vhost: str, queue: QueueSettings) -> tuple[str, ...]:
    """The named queues of ``queue`` (one per priority level, its own last)."""
    return levels(named_queue(vhost, queue.name, queue.incarnation), features(queue.arguments).max_priority)
