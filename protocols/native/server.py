"""The native listener: a ``grpc.aio`` server speaking RocketMQ 5's MessagingService over a Broker.

    server = await start_native_server(broker, "127.0.0.1", 0)   # port 0: any free port
    ... server.port ...
    await server.stop(grace=5)

Start it on the event loop the Broker runs on. Garbage on the port (random bytes, an HTTP/1
request) makes grpc close that one connection; everyone else is served on.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

import grpc
import grpc.aio

from core.model import Principal
from core.service import Broker
from core.untrusted import DenialLog
from protocols.tls import ServerTls

from .auth import DEFAULT_MAX_SKEW_S, Authenticator
from .clients import ClientRegistry
from .connections import NativeClients
from .context import Edge
from .decoding import add_servicer
from .mixed_front import MixedFront
from .servicer import MessagingServicer
from .transaction_checks import TransactionChecks

log = logging.getLogger(__name__)

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
    front: MixedFront | None = None
    """The public port's front in mixed mode (TLS and plaintext on one port)."""

    @property
    def clients(self) -> NativeClients:
        """Connected clients (one per Telemetry stream), for core's client directory."""
        return self.edge.connections

    async def stop(self, grace: float | None = None) -> None:
        """Stop accepting calls; let running ones finish for ``grace`` seconds, then cancel them.

        Telemetry streams never finish on their own (clients keep them for their lifetime), so
        they are ended at once rather than holding the shutdown for the whole grace period.
        """
        if self.front is not None:
            self.front.close()
        stopping = asyncio.ensure_future(self.server.stop(grace))
        await asyncio.sleep(0)  # the server stops accepting new calls first
        self.edge.stopping.set()
        await stopping


async def start_native_server(broker: Broker, host: str = "127.0.0.1", port: int = 8081, *,
                              advertised_host: str | None = None, allow_anonymous: bool = False,
                              anonymous_principal: Principal | None = None,
                              signature_max_skew_s: float = DEFAULT_MAX_SKEW_S,
                              tls: ServerTls | None = None, tls_mode: str = "on") -> NativeServer:
    """Bind ``host:port`` and serve the RocketMQ 5 gRPC API over ``broker``.

    Routes tell clients to use ``advertised_host`` (with the bound port) when given, else the
    address the client itself used. Calls without credentials are refused unless
    ``allow_anonymous``; they then act for ``anonymous_principal`` (default: a user named
    ``anonymous`` with no permissions of its own). Signed calls made more than
    ``signature_max_skew_s`` seconds from the broker's clock are refused. With ``tls``, the
    port serves TLS (``tls_mode`` "on"), TLS and plaintext (``"mixed"``, through a
    `MixedFront`) or plaintext ("off"). Runs on the broker's event loop.
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
    credentials = server_credentials(tls) if tls is not None and tls_mode != "off" else None
    front = None
    if credentials is not None and tls_mode == "mixed":
        front = MixedFront(_bind(server, "127.0.0.1:0", credentials),
                           _bind(server, "127.0.0.1:0", None), DenialLog(log))
        await server.start()
        try:
            await front.start(host, port)
        except BaseException:
            await server.stop(None)
            raise
        edge.port = front.port
    else:
        edge.port = _bind(server, address, credentials)
        await server.start()
    return NativeServer(server, edge.port, edge, front)


def _bind(server: grpc.aio.Server, address: str,
          credentials: grpc.ServerCredentials | None) -> int:
    """Add a port to ``server`` (TLS with ``credentials``); OSError if it cannot bind."""
    try:
        bound = (server.add_insecure_port(address) if credentials is None
                 else server.add_secure_port(address, credentials))
    except RuntimeError as error:  # grpc's way of saying the bind failed
        raise OSError(f"cannot listen on {address} for the native gRPC API ({error}); "
                      "is the port in use or the host not local?") from error
    if bound == 0:
        raise OSError(f"cannot listen on {address} for the native gRPC API; is the port in use?")
    return bound


def server_credentials(tls: ServerTls) -> grpc.ServerCredentials:
    """grpc credentials serving ``tls``'s certificate; grpc asks the fetcher before each new
    handshake, so a certificate reloaded since is served from then on (open connections keep
    theirs). The fetcher runs on a grpc thread."""
    cert, key, generation = tls.chain()
    served = [generation]

    def fetch() -> grpc.ServerCertificateConfiguration | None:
        cert, key, generation = tls.chain()
        if generation == served[0]:
            return None  # unchanged
        served[0] = generation
        return grpc.ssl_server_certificate_configuration([(key, cert)])

    return grpc.dynamic_ssl_server_credentials(
        grpc.ssl_server_certificate_configuration([(key, cert)]), fetch)
