"""The native adapter's clients as core's client directory sees them: one per Telemetry stream.

Every running RocketMQ 5 client keeps one Telemetry stream open for its lifetime, so an open
stream is a connected client: opening and closing one is logged as a connect and a disconnect,
and a kick ends the stream (the client reopens it, authenticating again). What a client said in
its settings (type, group, subscriptions) comes from the adapter's ``ClientRegistry``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from rocketmq.grpc_protocol import definition_pb2 as pb

from core.clients import ClientView, log_connected, log_disconnected
from core.model import Principal
from core.traffic import ClientCounters, Traffic

from .clients import ClientRegistry

PROTOCOL = "native"


OUTBOX_LIMIT = 1024
"""Server commands (transaction checks) a stream may have waiting to be written."""


@dataclass(eq=False)
class TelemetryStream:
    """One open stream: who holds it, what it publishes, the commands the server has for it,
    and the event that ends it early."""

    client_id: str
    principal: Principal
    address: str
    connected_at_ms: int = field(default_factory=lambda: int(time.time() * 1000))
    kicked: asyncio.Event = field(default_factory=asyncio.Event)
    publishing: frozenset[str] = frozenset()
    """The topics a producer named in its settings (it is asked about their transactions)."""
    outbox: asyncio.Queue = field(default_factory=lambda: asyncio.Queue(OUTBOX_LIMIT))
    counters: ClientCounters = field(default_factory=lambda: ClientCounters(time.monotonic()))
    """The client's messages and rates while this stream is open, for the admin API."""

    @property
    def user(self) -> str:
        return self.principal.user


def peer_address(peer: str) -> str:
    """``host:port`` of a grpc peer string (``ipv4:127.0.0.1:5000``, ``ipv6:[::1]:5000``)."""
    scheme, _, address = peer.partition(":")
    return address if scheme in ("ipv4", "ipv6") and address else peer


class NativeClients:
    """The open Telemetry streams by client id; a ``core.clients.ClientSource``."""

    protocol = PROTOCOL

    def __init__(self, registry: ClientRegistry) -> None:
        self._registry = registry
        self._streams: dict[str, list[TelemetryStream]] = {}
        self.traffic = Traffic(counts_bytes=False)
        """What this protocol's clients did since start, for the metrics page (gRPC frames
        its own bytes, so they are not counted)."""

    def open(self, client_id: str, principal: Principal, peer: str) -> TelemetryStream:
        """Note a stream that opened (and log the connect)."""
        stream = TelemetryStream(client_id, principal, peer_address(peer))
        self._streams.setdefault(client_id, []).append(stream)
        self.traffic.connections_opened += 1
        log_connected(PROTOCOL, client_id, principal.user, stream.address)
        return stream

    def close(self, stream: TelemetryStream, reason: str) -> None:
        """Note a stream that ended (and log the disconnect with ``reason``)."""
        streams = self._streams.get(stream.client_id, [])
        if stream in streams:
            streams.remove(stream)
            if not streams:
                del self._streams[stream.client_id]
        log_disconnected(PROTOCOL, stream.client_id, stream.user, stream.address, reason)

    def published(self, client_id: str, user: str, count: int) -> None:
        """Count ``count`` messages ``client_id`` sent: the protocol's, and the client's if
        ``user`` (the caller) holds its stream (a client id is only what the caller says)."""
        self.traffic.messages_published += count
        if (stream := self._latest(client_id, user)) is not None:
            stream.counters.published += count

    def delivered(self, client_id: str, user: str, count: int) -> None:
        """Count ``count`` messages sent to ``client_id``, as ``published`` does."""
        self.traffic.messages_delivered += count
        if (stream := self._latest(client_id, user)) is not None:
            stream.counters.delivered += count

    def _latest(self, client_id: str, user: str) -> TelemetryStream | None:
        streams = self._streams.get(client_id)
        return streams[-1] if streams and streams[-1].user == user else None

    def publishers_of(self, topic: str) -> list[TelemetryStream]:
        """The open streams of producers that named ``topic`` in their settings."""
        return [stream for streams in self._streams.values() for stream in streams
                if topic in stream.publishing]

    def connected_count(self) -> int:
        return sum(len(streams) for streams in self._streams.values())

    def clients(self) -> Iterator[ClientView]:
        for client_id, streams in self._streams.items():
            known = self._registry.known(client_id)
            details = {} if known is None else {
                "client_type": pb.ClientType.Name(known.client_type), "group": known.group}
            subscriptions = () if known is None else tuple(sorted(known.subscriptions))
            for stream in streams:
                yield ClientView(PROTOCOL, client_id, stream.user, stream.address, True,
                                 stream.connected_at_ms, subscriptions, details, stream.counters)

    def counters(self) -> Iterator[ClientCounters]:
        """The counters of every open stream."""
        return (stream.counters for streams in self._streams.values() for stream in streams)

    def kick(self, client_id: str) -> bool:
        streams = self._streams.get(client_id, [])
        for stream in streams:
            stream.kicked.set()
        return bool(streams)
