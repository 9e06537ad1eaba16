"""MQTT over TCP and TLS (asyncio protocols), and starting every MQTT listener of the config."""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from core.untrusted import DenialLog, clip
from core.wrong_protocol import MQTT, WrongProtocol
from protocols import relayed_peers
from protocols.tls import certificate_user

from .frontend import MqttFrontend
from .options import MqttOptions
from .websocket import WebSocketListener, parse_origins, start_websocket_listener
from .wire import ConnectionHandler, Wire

log = logging.getLogger(__name__)

HIGH_WATER = 256 << 10
LOW_WATER = 64 << 10
LINGER_S = 2.0
"""How long a connection the server closes keeps reading (and dropping) what the client still
sends, so the client reads the last packet (a DISCONNECT with its reason) before the close: a
socket closed with unread input is reset, and a reset can discard what the client had not read."""
LINGER_BYTES = 8 << 20
"""A client that sends more than this while its connection lingers is cut off at once."""
BACKLOG = 4096
DEFAULT_TLS_TIMEOUT = 60.0
"""TLS handshake timeout when ``connect_timeout_s`` is 0."""


class TcpWire(asyncio.Protocol):
    """A `Wire` over an asyncio transport (plain TCP, or TLS once its handshake is done).
    A connection whose first bytes are another protocol's greeting (``wrong_protocol``) is
    logged as such and closed. Runs on the event loop."""

    def __init__(self, new_connection: Callable[[Wire], ConnectionHandler],
                 wrong_protocol: WrongProtocol | None = None,
                 certificate_login: bool = False) -> None:
        """``certificate_login``: a verified client certificate's CN is the user it logs in as."""
        self._new_connection = new_connection
        self._wrong_protocol = wrong_protocol
        self._certificate_login = certificate_login
        self.certificate_user: str | None = None
        """The user a verified client certificate names (with ``certificate_login``)."""
        self._transport: asyncio.Transport | None = None
        self._handler: ConnectionHandler | None = None
        self._lingering: asyncio.TimerHandle | None = None
        self._drained = 0
        self.peer = "?"

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        transport.set_write_buffer_limits(HIGH_WATER, LOW_WATER)
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.peer = relayed_peers.client_address(transport.get_extra_info("peername"))
        if self._certificate_login:
            self.certificate_user = certificate_user(transport.get_extra_info("ssl_object"))
        self._handler = self._new_connection(self)

    def data_received(self, data: bytes) -> None:
        if self._lingering is not None:
            self._drained += len(data)
            if self._drained > LINGER_BYTES:
                self.abort()
            return
        assert self._handler is not None and self._transport is not None
        if self._wrong_protocol is not None:
            checking, self._wrong_protocol = self._wrong_protocol, None  # the first bytes only
            if checking.caught(data, self.peer, self._transport.get_extra_info("sockname")[1]):
                self.close()
                return
        self._handler.data_received(data)

    def eof_received(self) -> bool:
        return False  # close the transport; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        if self._lingering is not None:
            self._lingering.cancel()
        if self._handler is not None:
            self._handler.connection_lost()

    def resume_writing(self) -> None:
        if self._handler is not None:
            self._handler.writable()

    # Wire
    def write(self, data: bytes) -> None:
        if self._transport is not None and not self._transport.is_closing() \
                and self._lingering is None:
            self._transport.write(data)

    def buffered(self) -> int:
        return self._transport.get_write_buffer_size() if self._transport is not None else 0

    def close(self) -> None:
        """Send what is queued, then half-close (TCP FIN; TLS has no half-close) and drop what
        the client still sends until it closes too, for at most `LINGER_S`; then close."""
        transport = self._transport
        if transport is None or transport.is_closing() or self._lingering is not None:
            return
        if transport.can_write_eof():
            transport.write_eof()
        transport.resume_reading()
        self._lingering = asyncio.get_running_loop().call_later(LINGER_S, self.abort)

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    def pause_reading(self) -> None:
        if self._transport is not None and self._lingering is None:
            self._transport.pause_reading()

    def resume_reading(self) -> None:
        if self._transport is not None:
            self._transport.resume_reading()


class TlsListener:
    """Accepts TLS connections itself, so that every handshake is bounded in time (the CONNECT
    timeout) and in number (``max_handshakes`` at once; more are closed at once) and a failed
    one is logged in one line per peer host a minute; a finished one becomes a `TcpWire`.
    Runs on the event loop."""

    def __init__(self, sock: socket.socket, context: ssl.SSLContext,
                 new_connection: Callable[[Wire], ConnectionHandler], *, timeout: float,
                 max_handshakes: int, denials: DenialLog,
                 wrong_protocol: WrongProtocol | None = None,
                 certificate_login: bool = False) -> None:
        self.port: int = sock.getsockname()[1]
        self._sock = sock
        self._context = context
        self._new_connection = new_connection
        self._timeout = timeout
        self._max_handshakes = max_handshakes
        self._denials = denials
        self._wrong_protocol = wrong_protocol
        self._certificate_login = certificate_login
        self._handshakes: set[asyncio.Task] = set()
        self._accepting = asyncio.get_running_loop().create_task(self._accept())

    async def _accept(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                sock, address = await loop.sock_accept(self._sock)
            except OSError as error:  # EMFILE and the like: the listener goes on
                log.warning("MQTT TLS listener cannot accept: %s", error)
                await asyncio.sleep(0.1)
                continue
            peer = f"{address[0]}:{address[1]}" if isinstance(address, tuple) else str(address)
            if len(self._handshakes) >= self._max_handshakes:
                self._denials.denied(address[0], "tls-busy", "TLS connection from %s closed at "
                                     "once: %d handshakes in progress (max_pending_connections)",
                                     peer, len(self._handshakes))
                sock.close()
                continue
            task = loop.create_task(self._handshake(sock, peer))
            self._handshakes.add(task)
            task.add_done_callback(self._handshakes.discard)

    async def _handshake(self, sock: socket.socket, peer: str) -> None:
        try:
            await asyncio.get_running_loop().connect_accepted_socket(
                lambda: TcpWire(self._new_connection, self._wrong_protocol,
                                self._certificate_login), sock,
                ssl=self._context,
                ssl_handshake_timeout=self._timeout)
        except (OSError, EOFError) as failed:  # ssl.SSLError, resets and timeouts are OSErrors
            self._denials.denied(peer.rpartition(":")[0], "tls", "TLS handshake from %s failed: %s",
                                 peer, clip(str(failed) or type(failed).__name__))
            sock.close()

    def close(self) -> None:
        """Stop accepting and abandon handshakes in progress."""
        self._accepting.cancel()
        for task in list(self._handshakes):
            task.cancel()
        self._sock.close()


@dataclass
class MqttListeners:
    """Every open MQTT listener: name -> bound port."""

    ports: dict[str, int] = field(default_factory=dict)
    _servers: list[asyncio.base_events.Server | TlsListener] = field(default_factory=list)
    _websockets: list[WebSocketListener] = field(default_factory=list)

    async def stop(self) -> None:
        """Stop accepting on every listener."""
        for server in self._servers:
            server.close()
        for websocket in self._websockets:
            await websocket.stop()


async def start_mqtt_listeners(frontend: MqttFrontend, options: MqttOptions,
                               advice: Mapping[str, str] | None = None,
                               tls: ssl.SSLContext | None = None,
                               certificate_login: bool = False) -> MqttListeners:
    """Open TCP and WebSocket listeners, plus TLS and WSS with the server context ``tls``.
    A client of another protocol on the TCP or TLS port is logged with the ``advice`` for its
    protocol (see ``WrongProtocol``). ``certificate_login``: a verified client certificate
    logs in as the user its CN names.

    A port of -1 is not opened. Raises OSError (port in use)."""
    listeners = MqttListeners()
    wrong_protocol = WrongProtocol(MQTT, frontend.denials, {} if advice is None else advice)
    loop = asyncio.get_running_loop()
    try:
        if options.port >= 0:
            server = await loop.create_server(lambda: TcpWire(frontend.new_connection,
                                                              wrong_protocol),
                                              options.host, options.port, backlog=BACKLOG,
                                              reuse_address=True)
            listeners._servers.append(server)
            listeners.ports["tcp"] = server.sockets[0].getsockname()[1]
        if options.tls_port >= 0 and tls is not None:
            sock = socket.create_server((options.host, options.tls_port), backlog=BACKLOG,
                                        family=_family(options.host))
            sock.setblocking(False)
            secure = TlsListener(sock, tls, frontend.new_connection,
                                 timeout=options.connect_timeout_s or DEFAULT_TLS_TIMEOUT,
                                 max_handshakes=options.max_pending_connections,
                                 denials=frontend.denials, wrong_protocol=wrong_protocol,
                                 certificate_login=certificate_login)
            listeners._servers.append(secure)
            listeners.ports["tls"] = secure.port
        for name, port, context in (("ws", options.ws_port, None), ("wss", options.wss_port, tls)):
            if port < 0 or (name == "wss" and context is None):
                continue
            websocket = await start_websocket_listener(
                frontend.new_connection, options.host, port, path=options.ws_path,
                ssl_context=context, allowed_origins=parse_origins(options.ws_allowed_origins),
                request_timeout=options.connect_timeout_s,
                certificate_login=certificate_login and context is not None)
            listeners._websockets.append(websocket)
            listeners.ports[name] = websocket.port
    except BaseException:
        await listeners.stop()
        raise
    return listeners


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET
