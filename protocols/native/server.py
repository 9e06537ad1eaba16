"""The native listener: a ``grpc.aio`` server speaking RocketMQ 5's MessagingService over a Broker.

    server = await start_native_server(broker, "127.0.0.1", 0)   # port 0: any free port
    ... server.port ...
    await server.stop(grace=5)

Start it on the event loop the Broker runs on. Garbage on the port (random bytes, an HTTP/1
request) makes grpc close that one connection; everyone else is served on.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import grpc.aio

from core.model import Principal
from core.service import Broker

from .auth import DEFAULT_MAX_SKEW_S, Authenticator
from .clients import ClientRegistry
from .connections import NativeClients
from .context import Edge
from .decoding import add_servicer
from .servicer import MessagingServicer
from .transaction_checks import TransactionChecks

ANONYMOUS = Principal("anonymous")
"""Who a call without credentials acts for when anonymous access is on and no one else is named."""

REQUEST_OVERHEAD_BYTES = 1 << 20
"""Room above the broker's message size limit for the rest of a request (properties, framing)."""


@dataclass
class NativeServer:
    """A running native listener."""

    server: grpc.aio.Server
    port: int
    """The port actually bound (useful after asking for port 0)."""
    edge: Edge

    @property
    def clients(self) -> NativeClients:
        """Connected clients (one per Telemetry stream), for core's client directory."""
        return self.edge.connections

    async def stop(self, grace: float | None = None) -> None:
        """Stop accepting calls; let running ones finish for ``grace`` seconds, then cancel them.

        Telemetry streams never finish on their own (clients keep them for their lifetime), so
        they are ended at once rather than holding the shutdown for the whole grace period.
        """
        stopping = asyncio.ensure_future(self.server.stop(grace))
        await asyncio.sleep(0)  # the server stops accepting new calls first
        self.edge.stopping.set()
        await stopping


async def start_native_server(broker: Broker, host: str = "127.0.0.1", port: int = 8081, *,
                              advertised_host: str | None = None, allow_anonymous: bool = False,
                              anonymous_principal: Principal | None = None,
                              signature_max_skew_s: float = DEFAULT_MAX_SKEW_S) -> NativeServer:
    """Bind ``host:port`` and serve the RocketMQ 5 gRPC API over ``broker``.

    Routes tell clients to use ``advertised_host`` (with the bound port) when given, else the
    address the client itself used. Calls without credentials are refused unless
    ``allow_anonymous``; they then act for ``anonymous_principal`` (default: a user named
    ``anonymous`` with no permissions of its own). Signed calls made more than
    ``signature_max_skew_s`` seconds from the broker's clock are refused. Runs on the broker's
    event loop.
    """
    anonymous = (anonymous_principal or ANONYMOUS) if allow_anonymous else None
    edge = Edge(broker=broker,
                auth=Authenticator(broker, anonymous, signature_max_skew_s),
                clients=ClientRegistry(), host=host, advertised_host=advertised_host)
    # A request may carry a message a little over the limit: let it through so the broker
    # answers MESSAGE_BODY_TOO_LARGE instead of the transport cutting the call.
    max_request = 2 * edge.config.max_message_bytes + REQUEST_OVERHEAD_BYTES
    server = grpc.aio.server(options=[
        ("grpc.max_receive_message_length", max_request),
        ("grpc.max_send_message_length", -1),
        ("grpc.so_reuseport", 0),
    ])
    add_servicer(MessagingServicer(edge), server)
    broker.set_transaction_checker(TransactionChecks(edge).ask)
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        edge.port = server.add_insecure_port(address)
    except RuntimeError as error:  # grpc's way of saying the bind failed
        raise OSError(f"cannot listen on {address} for the native gRPC API ({error}); "
                      "is the port in use or the host not local?") from error
    if edge.port == 0:
        raise OSError(f"cannot listen on {address} for the native gRPC API; is the port in use?")
    await server.start()
    return NativeServer(server, edge.port, edge)
