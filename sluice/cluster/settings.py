"""The ``[cluster]`` section of the broker's configuration."""
from __future__ import annotations

from dataclasses import dataclass

DEFAULT_REPLICATION_PORT = 5679
"""The port followers fetch the commit log from (LavinMQ's clustering port)."""


@dataclass(frozen=True)
class ClusterConfig:
    """A replica group on etcd; without ``etcd`` the broker runs alone, as it always has."""

    etcd: str = ""
    """etcd client URLs, comma-separated (``http://127.0.0.1:2379,http://127.0.0.2:2379``)."""
    node_id: str = ""
    """This node's name in the group; unique, stable across restarts."""
    name: str = "sluice"
    """The group's name: its keys in etcd live under ``/sluice/<name>/``."""
    host: str = "127.0.0.1"
    """Where this node's replication port listens (``--host`` sets it with every listener's)."""
    replication_port: int = DEFAULT_REPLICATION_PORT
    """Where followers fetch the log from this node while it leads (and relay clients to it)."""
    secret: str = ""
    """Shared by the group's nodes; a peer without it gets nothing from the replication port."""
    tls: bool = True
    """TLS on the replication port when a certificate is configured (``tls.cert``): followers
    verify the leader against ``tls.client_ca``, else against the certificate itself (every
    node serving the same one). Every node of the group must agree."""
    min_insync: int = 2
    """Replicas (the leader included) that must hold a record on disk before it is confirmed;
    below that many in-sync replicas, publishes are refused."""
    lease_ttl_s: int = 5
    """The leader's etcd lease: a leader that cannot renew it within this time less
    ``lease_margin_ms`` stops confirming and steps down."""
    lease_margin_ms: int = 1_000
    """Safety margin: a leader stops confirming this long before its lease could expire."""
    replica_timeout_ms: int = 4_000
    """A follower that acknowledges nothing for this long while behind leaves the in-sync set."""

    @property
    def enabled(self) -> bool:
        return bool(self.etcd)

    @property
    def endpoints(self) -> list[str]:
        return [url.strip() for url in self.etcd.split(",") if url.strip()]
