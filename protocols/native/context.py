"""The native adapter's dependencies (one object) and the per-call facts every handler needs."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import grpc.aio
from rocketmq.grpc_protocol import definition_pb2 as pb

from core.errors import InvalidArgument
from core.model import Principal
from core.service import Broker
from core.settings import CoreConfig
from protocols import relayed_peers

from .auth import CLIENT_ID_HEADER, Authenticator
from .clients import ClientRegistry
from .connections import NativeClients
from .convert import endpoints_for

DEADLINE_MARGIN_MS = 500
"""A long poll ends this long before the client's deadline, so the answer still reaches it."""


@dataclass
class Edge:
    """Everything the handlers share: the core facade, authentication, the client registry and
    the address clients are told to use. Lives on the server's event loop."""

    broker: Broker
    auth: Authenticator
    clients: ClientRegistry
    host: str
    port: int = 0
    advertised_host: str | None = None
    connections: NativeClients = field(init=False)
    """Open Telemetry streams: every running RocketMQ 5 client holds one."""
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when the server stops: Telemetry streams end instead of holding the shutdown."""

    def __post_init__(self) -> None:
        self.connections = NativeClients(self.clients)

    @property
    def config(self) -> CoreConfig:
        """The broker's core configuration (defaults if the broker exposes none)."""
        return getattr(self.broker, "config", None) or CoreConfig()

    def endpoints(self, requested: pb.Endpoints | None = None) -> pb.Endpoints:
        """Where clients should connect: the advertised host, else the address the client used,
        else the bound host (loopback when bound to every interface)."""
        if self.advertised_host:
            return endpoints_for(self.advertised_host, self.port)
        if requested is not None and requested.addresses:
            return requested
        host = "127.0.0.1" if self.host in ("", "0.0.0.0", "::", "[::]") else self.host
        return endpoints_for(host, self.port)

    def store_host(self) -> str:
        """``host:port`` of this broker as messages report it."""
        address = self.endpoints().addresses[0]
        return f"{address.host}:{address.port}"

    async def call(self, context: grpc.aio.ServicerContext) -> Call:
        """Authenticate the call; raises Unauthenticated."""
        metadata = tuple(context.invocation_metadata() or ())
        principal = await self.auth.principal(metadata, relayed_peers.grpc_peer(context.peer() or ""))
        client_id = next((str(value) for key, value in metadata
                          if key.lower() == CLIENT_ID_HEADER), "")
        return Call(principal, client_id, context, metadata)


@dataclass(frozen=True)
class Call:
    """One RPC: who it acts for and which client made it."""

    principal: Principal
    client_id: str
    context: grpc.aio.ServicerContext
    metadata: tuple = ()

    def header(self, name: str) -> str | None:
        """The value of request header ``name`` (lower case), if sent."""
        return next((str(value) for key, value in self.metadata if key.lower() == name), None)

    def require_client_id(self) -> str:
        """The caller's client id; raises InvalidArgument if the client sent none."""
        if not self.client_id:
            raise InvalidArgument(f"the {CLIENT_ID_HEADER} header is missing; consumers must "
                                  "identify themselves (the RocketMQ clients do so themselves)")
        return self.client_id

    def wait_ms(self, requested_ms: int, cap_ms: int) -> int:
        """How long a long poll may wait: what was asked, at most ``cap_ms``, and ending
        ``DEADLINE_MARGIN_MS`` before the client's deadline."""
        wait = min(max(0, requested_ms), cap_ms)
        remaining = self.context.time_remaining()
        if remaining is not None:
            wait = min(wait, max(0, int(remaining * 1000) - DEADLINE_MARGIN_MS))
        return wait
