"""What the native adapter remembers about each connected client between its calls.

A RocketMQ 5 client states its type, group and subscriptions in the Telemetry ``settings``
command, but its Heartbeat carries only the group, and a consumer may subscribe to a topic after
its last settings. The registry keeps the union so every heartbeat tells core the client's full
subscription list. Entries of clients silent for ``FORGET_AFTER_S`` (crashed without saying
goodbye) are dropped. Runs on the event loop only; no locking.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from rocketmq.grpc_protocol import definition_pb2 as pb

from core.model import Subscription

FORGET_AFTER_S = 600.0
"""Live clients call at least every 10 s (heartbeats); ten minutes of silence means gone."""


@dataclass
class ClientInfo:
    """One client, keyed by its ``x-mq-client-id``."""

    client_id: str
    client_type: int = pb.ClientType.CLIENT_TYPE_UNSPECIFIED
    group: str = ""
    subscriptions: dict[str, Subscription] = field(default_factory=dict)
    """By topic."""
    last_seen: float = field(default_factory=time.monotonic)


class ClientRegistry:
    """Clients by id. Entries go on NotifyClientTermination or after long silence."""

    def __init__(self) -> None:
        self._clients: dict[str, ClientInfo] = {}

    def get(self, client_id: str) -> ClientInfo:
        """The entry for ``client_id``, created empty on first use."""
        info = self._clients.get(client_id)
        if info is None:
            info = self._clients[client_id] = ClientInfo(client_id)
        info.last_seen = time.monotonic()
        return info

    def known(self, client_id: str) -> ClientInfo | None:
        """The entry for ``client_id`` if there is one (does not mark it seen)."""
        return self._clients.get(client_id)

    def settle(self, client_id: str, client_type: int, group: str,
               subscriptions: list[Subscription]) -> ClientInfo:
        """Record what a settings command says; its subscriptions replace the known ones.
        (Settings are rare, so this is also when long-silent clients are forgotten.)"""
        cutoff = time.monotonic() - FORGET_AFTER_S
        for gone in [c for c, info in self._clients.items() if info.last_seen < cutoff]:
            del self._clients[gone]
        info = self.get(client_id)
        info.client_type = client_type
        if group:
            info.group = group
        info.subscriptions = {sub.topic: sub for sub in subscriptions}
        return info

    def learn(self, client_id: str, subscription: Subscription) -> bool:
        """Add or update one subscription; True if it was new or changed."""
        info = self.get(client_id)
        info.group = info.group or subscription.group
        if info.subscriptions.get(subscription.topic) == subscription:
            return False
        info.subscriptions[subscription.topic] = subscription
        return True

    def forget(self, client_id: str) -> None:
        """Drop a client that said it is terminating."""
        self._clients.pop(client_id, None)
