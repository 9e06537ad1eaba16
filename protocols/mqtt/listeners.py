"""MQTT over TCP and TLS (asyncio protocols), and starting every MQTT listener of the config."""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field

from .frontend import MqttFrontend
from .options import MqttOptions
from .tls import server_ssl_context
from .websocket import WebSocketListener, start_websocket_listener
from .wire import ConnectionHandler, Wire

log = logging.getLogger(__name__)

HIGH_WATER = 256 << 10
LOW_WATER = 64 << 10


class TcpWire(asyncio.Protocol):
    """A `Wire` over an asyncio transport (plain TCP or TLS)."""

    def __init__(self, new_connection: Callable[[Wire], ConnectionHandler]) -> None:
        self._new_connection = new_connection
        self._transport: asyncio.Transport | None = None
        self._handler: ConnectionHandler | None = None
        self.peer = "?"

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        transport.set_write_buffer_limits(HIGH_WATER, LOW_WATER)
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self._handler = self._new_connection(self)

    def data_received(self, data: bytes) -> None:
        assert self._handler is not None
        self._handler.data_received(data)

    def eof_received(self) -> bool:
        return False  # close the transport; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        if self._handler is not None:
            self._handler.connection_lost()

    def resume_writing(self) -> None:
        if self._handler is not None:
            self._handler.writable()

    # Wire
    def write(self, data: bytes) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(data)

    def buffered(self) -> int:
        return self._transport.get_write_buffer_size() if self._transport is not None else 0

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    def pause_reading(self) -> None:
        if self._transport is not None:
            self._transport.pause_reading()

    def resume_reading(self) -> None:
        if self._transport is not None:
            self._transport.resume_reading()


@dataclass
class MqttListeners:
    """Every open MQTT listener: name -> bound port."""

    ports: dict[str, int] = field(default_factory=dict)
    _servers: list[asyncio.base_events.Server] = field(default_factory=list)
    _websockets: list[WebSocketListener] = field(default_factory=list)

    async def stop(self) -> None:
        """Stop accepting on every listener."""
        for server in self._servers:
            server.close()
        for websocket in self._websockets:
            await websocket.stop()


async def start_mqtt_listeners(frontend: MqttFrontend, options: MqttOptions) -> MqttListeners:
    """Open TCP and WebSocket listeners, plus TLS and WSS when a certificate is configured.

    A port of -1 is not opened. Raises OSError (port in use) or ValueError (bad certificate)."""
    listeners = MqttListeners()
    loop = asyncio.get_running_loop()
    tls: ssl.SSLContext | None = None
    if options.tls_cert or options.tls_key:
        if not (options.tls_cert and options.tls_key):
            raise ValueError("mqtt.tls_cert and mqtt.tls_key must be set together")
        tls = server_ssl_context(options.tls_cert, options.tls_key)
    try:
        for name, port, context in (("tcp", options.port, None), ("tls", options.tls_port, tls)):
            if port < 0 or (name == "tls" and context is None):
                continue
            server = await loop.create_server(lambda: TcpWire(frontend.new_connection), options.host,
                                              port, ssl=context, backlog=4096, reuse_address=True)
            listeners._servers.append(server)
            listeners.ports[name] = server.sockets[0].getsockname()[1]
        for name, port, context in (("ws", options.ws_port, None), ("wss", options.wss_port, tls)):
            if port < 0 or (name == "wss" and context is None):
                continue
            websocket = await start_websocket_listener(frontend.new_connection, options.host, port,
                                                       path=options.ws_path, ssl_context=context)
            listeners._websockets.append(websocket)
            listeners.ports[name] = websocket.port
    except BaseException:
        await listeners.stop()
        raise
    return listeners
