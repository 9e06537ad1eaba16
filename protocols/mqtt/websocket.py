"""MQTT over WebSocket (MQTT spec 6.0): an aiohttp server whose binary frames carry MQTT bytes.

Each accepted upgrade becomes a `WebSocketWire` handed to the front end's connection factory.
A browser page may open one only from the listener's own origin or one of ``allowed_origins``
(`origin_allowed`); clients that send no Origin header (devices, tools) are not browsers.
Frame boundaries mean nothing to MQTT: a packet may span frames and a frame may hold many
packets, so frames go to `data_received` as they are. Writes are coalesced: one writer task per
connection sends everything queued since its last send as one binary frame.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Callable, Iterable
from urllib.parse import urlsplit

from aiohttp import WSCloseCode, WSMsgType, hdrs, web
from aiohttp.http_exceptions import HttpProcessingError

from core.untrusted import DenialLog, clip
from protocols import relayed_peers
from protocols.tls import certificate_user
from protocols.mqtt.wire import ConnectionHandler, Wire

log = logging.getLogger(__name__)

SUBPROTOCOLS = ("mqtt", "mqttv3.1")
"""Accepted Sec-WebSocket-Protocol values, preferred first (MQTT 6.0: the server selects "mqtt")."""
MAX_MESSAGE_SIZE = 16 * 1024 * 1024
"""Largest WebSocket message accepted; MQTT packets can be large."""
HIGH_WATER = 64 * 1024
"""Queued bytes above which the wire counts as full."""
LOW_WATER = HIGH_WATER // 4
"""A full wire calls `ConnectionHandler.writable` once its queue is back down to this."""
CLOSE_TIMEOUT = 5.0
"""Seconds to wait for the client's close frame after sending ours."""
SHUTDOWN_TIMEOUT = 5.0
"""Seconds `WebSocketListener.stop` lets connections finish closing before cancelling them."""


class WebSocketWire:
    """A `Wire` over one server-side WebSocket. Runs on the event loop; never blocks."""

    def __init__(self, ws: web.WebSocketResponse, transport: asyncio.Transport, peer: str,
                 certificate_user: str | None = None) -> None:
        self.peer = peer
        self.certificate_user = certificate_user
        """The user a verified client certificate names, when certificates log in."""
        self._ws = ws
        self._transport = transport
        self._queue = bytearray()
        self._sending = 0
        self._full = False
        self._closing = False
        self._aborted = False
        self._close_code = WSCloseCode.OK
        self._wakeup = asyncio.Event()
        self._reading = asyncio.Event()
        self._reading.set()
        self.finished = asyncio.Event()
        """Set once `connection_lost` has been called."""

    def write(self, data: bytes) -> None:
        """Queue ``data``; the writer task sends it with whatever else is queued by then."""
        if self._closing:
            return
        self._queue += data
        self._full = self._full or self.buffered() > HIGH_WATER
        self._wakeup.set()

    def buffered(self) -> int:
        """Bytes queued or still being sent."""
        return len(self._queue) + self._sending

    def close(self) -> None:
        """Send what is queued, then close the WebSocket; stop delivering data at once."""
        self._closing = True
        self._wakeup.set()
        self._reading.set()

    def abort(self) -> None:
        """Drop what is queued and close the TCP connection at once."""
        self._closing = self._aborted = True
        self._queue.clear()
        self._transport.abort()
        self._reading.set()

    def pause_reading(self) -> None:
        """Stop reading frames (the client's TCP window fills) until `resume_reading`."""
        self._reading.clear()

    def resume_reading(self) -> None:
        """Read frames again."""
        self._reading.set()

    def shut_down(self) -> None:
        """Close with 1001 (going away): the server is stopping."""
        self._close_code = WSCloseCode.GOING_AWAY
        self.close()

    async def serve(self, handler: ConnectionHandler) -> None:
        """Feed ``handler`` until the connection ends, then call its `connection_lost` once."""
        writer = asyncio.create_task(self._write_loop(handler))
        try:
            await self._read_loop(handler)
            if self._closing and not self._aborted:
                await writer
        finally:
            writer.cancel()
            handler.connection_lost()
            self.finished.set()

    async def _read_loop(self, handler: ConnectionHandler) -> None:
        while not self._closing:
            await self._reading.wait()
            if self._closing:
                return
            msg = await self._ws.receive()
            if msg.type is WSMsgType.BINARY:
                if not self._closing:
                    handler.data_received(msg.data)
            elif msg.type is WSMsgType.TEXT:
                log.info("MQTT over WebSocket from %s: text frame (MQTT needs binary frames); closing", self.peer)
                await self._ws.close(code=WSCloseCode.UNSUPPORTED_DATA, message=b"MQTT needs binary frames")
                return
            else:
                if msg.type is WSMsgType.ERROR:
                    log.info("MQTT over WebSocket from %s: %s; closing", self.peer, msg.data)
                return

    async def _write_loop(self, handler: ConnectionHandler) -> None:
        try:
            while True:
                await self._wakeup.wait()
                self._wakeup.clear()
                while self._queue:
                    await self._send_queued(handler)
                if self._closing:
                    await self._ws.close(code=self._close_code)
                    return
        except ConnectionError as exc:
            log.info("MQTT over WebSocket to %s: write failed: %s", self.peer, exc)
            self._transport.abort()

    async def _send_queued(self, handler: ConnectionHandler) -> None:
        data = bytes(self._queue)
        self._queue.clear()
        self._sending = len(data)
        try:
            await self._ws.send_bytes(data)
        finally:
            self._sending = 0
        if self._full and self.buffered() <= LOW_WATER:
            self._full = False
            handler.writable()


def parse_origins(setting: str) -> frozenset[str]:
    """The Origins of a comma-separated ``ws_allowed_origins`` setting, normalised."""
    return frozenset(_normal(o) for o in setting.split(",") if o.strip())


def origin_allowed(origin: str | None, host: str | None, secure: bool,
                   allowed: frozenset[str]) -> bool:
    """Whether a WebSocket upgrade with this ``Origin`` header may proceed: no Origin (not a
    browser), ``*`` in ``allowed``, an Origin listed in ``allowed``, or the same origin (its
    host and port equal the ``Host`` header's). Never raises, whatever the headers hold."""
    if origin is None or "*" in allowed or _normal(origin) in allowed:
        return True
    if host is None:
        return False
    try:
        asked = urlsplit(origin)
        served = urlsplit(f"//{host}")
        default = 443 if asked.scheme in ("https", "wss") else 80
        mine = 443 if secure else 80
        return (asked.scheme in ("http", "https", "ws", "wss") and asked.hostname is not None
                and asked.hostname == served.hostname
                and (asked.port or default) == (served.port or mine))
    except ValueError:  # a port that is not a number, a bad IPv6 literal
        return False


def _normal(origin: str) -> str:
    return origin.strip().rstrip("/").lower()


class _RequestLog(logging.LoggerAdapter):
    """aiohttp's request-handling log: a malformed HTTP request is the peer's doing, so it is
    one clipped line (summarised per peer host) instead of an error with a traceback; any
    other error keeps its traceback."""

    def __init__(self, denials: DenialLog) -> None:
        super().__init__(log, {})
        self._denials = denials

    def exception(self, msg: object, *args: object, exc_info: object = True, **kw: object) -> None:
        error = exc_info if isinstance(exc_info, BaseException) else None
        if isinstance(error, HttpProcessingError):
            peer = str(args[0]) if args else "?"
            self._denials.denied(peer, "http", "MQTT over WebSocket: bad HTTP request from %s: %s",
                                 peer, clip(error.message))
            return
        super().exception(msg, *args, exc_info=exc_info, **kw)  # type: ignore[arg-type]


class WebSocketListener:
    """A running MQTT-over-WebSocket server; `port` is the bound port. A connection that has
    not sent a whole HTTP request within ``request_timeout`` seconds (0: no limit; TLS
    handshake included) is closed: aiohttp itself waits for a first request for ever."""

    def __init__(self, new_connection: Callable[[Wire], ConnectionHandler], path: str,
                 allowed_origins: Iterable[str] = (), request_timeout: float = 0.0,
                 certificate_login: bool = False) -> None:
        self._new_connection = new_connection
        self._certificate_login = certificate_login
        self._path = path
        self._allowed_origins = frozenset(_normal(o) for o in allowed_origins)
        self._request_timeout = request_timeout
        self._denials = DenialLog(log)
        self._wires: set[WebSocketWire] = set()
        self._awaiting_request: dict[int, asyncio.TimerHandle] = {}
        """Connections that have not sent a whole request yet, by id of their handler."""
        self._server: asyncio.base_events.Server | None = None
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._on_request)
        self._runner = web.AppRunner(app, handle_signals=False, access_log=None,
                                     shutdown_timeout=SHUTDOWN_TIMEOUT,
                                     logger=_RequestLog(self._denials))
        self.port = 0

    async def _start(self, host: str, port: int, ssl_context: ssl.SSLContext | None) -> None:
        await self._runner.setup()
        loop = asyncio.get_running_loop()
        timeout = {"ssl_handshake_timeout": self._request_timeout} \
            if ssl_context is not None and self._request_timeout else {}
        self._server = await loop.create_server(self._accept, host, port, ssl=ssl_context,
                                                backlog=4096, reuse_address=True, **timeout)
        self.port = self._server.sockets[0].getsockname()[1]

    def _accept(self) -> asyncio.Protocol:
        """aiohttp's protocol for a new connection, closed unless its first request comes in
        time. Runs on the event loop."""
        server = self._runner.server
        assert server is not None
        handler = server()
        if self._request_timeout:
            key = id(handler)
            self._awaiting_request[key] = asyncio.get_running_loop().call_later(
                self._request_timeout, self._no_request, key, handler)
        return handler

    def _no_request(self, key: int, handler: asyncio.BaseProtocol) -> None:
        self._awaiting_request.pop(key, None)
        transport = getattr(handler, "transport", None)
        if transport is not None:
            transport.close()

    async def stop(self) -> None:
        """Stop accepting, close every connection with 1001 (going away), release the port.

        Waits up to `SHUTDOWN_TIMEOUT` for the clients' closing handshakes, then drops the rest.
        """
        if self._server is not None:
            self._server.close()
        for timer in self._awaiting_request.values():
            timer.cancel()
        for wire in self._wires:
            wire.shut_down()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.gather(*(wire.finished.wait() for wire in self._wires)),
                                   SHUTDOWN_TIMEOUT)
        await self._runner.cleanup()

    async def _on_request(self, request: web.Request) -> web.StreamResponse:
        timer = self._awaiting_request.pop(id(request.protocol), None)
        if timer is not None:
            timer.cancel()
        if request.path != self._path:
            return web.Response(status=404, text=f"MQTT over WebSocket is served on {self._path}\n")
        origin = request.headers.get(hdrs.ORIGIN)
        if not origin_allowed(origin, request.headers.get(hdrs.HOST), request.secure,
                              self._allowed_origins):
            peer = _peer(request)
            self._denials.denied(peer.rpartition(":")[0], "origin", "MQTT over WebSocket from %s: "
                                 "Origin %s refused", peer, clip(origin))
            return web.Response(status=403, text="this Origin may not open MQTT WebSocket "
                                                 "connections: add it to mqtt.ws_allowed_origins\n")
        offered = {p.strip() for h in request.headers.getall(hdrs.SEC_WEBSOCKET_PROTOCOL, ())
                   for p in h.split(",")}
        chosen = next((p for p in SUBPROTOCOLS if p in offered), None)
        peer = _peer(request)
        if chosen is None:
            log.info("MQTT over WebSocket from %s: no acceptable subprotocol in %s", peer, sorted(offered))
            return web.Response(status=400, text="MQTT over WebSocket needs the Sec-WebSocket-Protocol "
                                                 "header to offer \"mqtt\" (or \"mqttv3.1\")\n")
        ws = web.WebSocketResponse(protocols=(chosen,), max_msg_size=MAX_MESSAGE_SIZE, heartbeat=None,
                                   compress=False, timeout=CLOSE_TIMEOUT)
        try:
            await ws.prepare(request)
        except ValueError as bad:  # aiohttp decodes a non-ASCII Sec-WebSocket-Key with base64
            self._denials.denied(peer.rpartition(":")[0], "http", "MQTT over WebSocket from %s: "
                                 "bad upgrade request: %s", peer, clip(str(bad)))
            return web.Response(status=400, text="malformed WebSocket upgrade request\n")
        if request.transport is None:
            return ws
        user = (certificate_user(request.transport.get_extra_info("ssl_object"))
                if self._certificate_login else None)
        wire = WebSocketWire(ws, request.transport, peer, user)
        self._wires.add(wire)
        try:
            await wire.serve(self._new_connection(wire))
        finally:
            self._wires.discard(wire)
        return ws


def _peer(request: web.Request) -> str:
    peername = request.transport.get_extra_info("peername") if request.transport else None
    return relayed_peers.client_address(peername) if peername else str(request.remote)


async def start_websocket_listener(new_connection: Callable[[Wire], ConnectionHandler], host: str, port: int,
                                   *, path: str = "/mqtt", ssl_context: ssl.SSLContext | None = None,
                                   allowed_origins: Iterable[str] = (),
                                   request_timeout: float = 0.0,
                                   certificate_login: bool = False) -> WebSocketListener:
    """Serve MQTT over WebSocket on ``host:port`` (0 picks a free port) at ``path``; wss with
    ``ssl_context``. Browser pages of other origins than ``allowed_origins`` get 403; a
    connection without a whole request in ``request_timeout`` seconds is closed.
    ``certificate_login``: a verified client certificate logs in as the user its CN names."""
    listener = WebSocketListener(new_connection, path, allowed_origins, request_timeout,
                                 certificate_login)
    await listener._start(host, port, ssl_context)
    return listener
