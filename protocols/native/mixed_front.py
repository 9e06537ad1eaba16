"""TLS and plaintext gRPC on one port (``native.tls = "mixed"``), as RocketMQ's proxy serves
both in its TLS test mode.

grpcio cannot hand an accepted socket to its server, so the public port is this asyncio front:
it reads a connection's first bytes, and a TLS handshake (first byte 0x16) goes to the grpc
server's internal TLS port, an HTTP/2 preface (``PRI * HTTP/2.0``, first byte ``P``) to its
internal plaintext port; anything else is closed at once (logged once a minute per host).
From then on the front only copies bytes both ways: no parsing, big buffers, and each side's
reading paused while the other side's write buffer is full, so a slow peer holds back its
sender rather than the front's memory. The internal connection is recorded in
``relayed_peers``, so grpc names the client, not the front. Only this mode pays the hop;
TLS-only and plaintext-only ports are grpc's own listeners. Runs on the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import Final

from core.untrusted import DenialLog, clip
from protocols import relayed_peers

log = logging.getLogger(__name__)

TLS_HANDSHAKE: Final = 0x16
"""The first byte of a TLS record carrying a handshake (a ClientHello)."""
HTTP2_PREFACE: Final = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
"""What a plaintext HTTP/2 (gRPC) client sends first."""
FIRST_BYTES_TIMEOUT_S: Final = 10.0
"""A connection that sends nothing for this long is closed."""
HIGH_WATER: Final = 4 << 20
"""Bytes queued towards one side before the other side's reading pauses."""
LOW_WATER: Final = 1 << 20
SOCKET_BUFFER: Final = 4 << 20


def route(first: bytes) -> str | None:
    """Where a connection whose first bytes are ``first`` goes: "tls", "plain", or None
    (neither; close it). ``first`` is at least one byte; fewer than the preface's length is
    judged on what it has."""
    if first[0] == TLS_HANDSHAKE:
        return "tls"
    if HTTP2_PREFACE.startswith(first[:len(HTTP2_PREFACE)]):
        return "plain"
    return None


class _Side(asyncio.Protocol):
    """One end of a spliced connection; writes what it reads to ``other``."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.other: _Side | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        _tune(transport)

    def data_received(self, data: bytes) -> None:
        if self.other is not None and self.other.transport is not None:
            self.other.transport.write(data)

    def eof_received(self) -> bool:
        if self.other is not None and self.other.transport is not None \
                and self.other.transport.can_write_eof():
            self.other.transport.write_eof()
            return True  # half-close: the other way may still carry data
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if self.other is not None and self.other.transport is not None:
            self.other.transport.close()

    def pause_writing(self) -> None:
        if self.other is not None and self.other.transport is not None:
            self.other.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.other is not None and self.other.transport is not None:
            self.other.transport.resume_reading()


class _Client(_Side):
    """The client's end: waits for the first bytes, then splices to the chosen internal port."""

    def __init__(self, front: MixedFront) -> None:
        super().__init__()
        self._front = front
        self._first = b""
        self._timer: asyncio.TimerHandle | None = None
        self._peer: tuple | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._peer = transport.get_extra_info("peername")
        self._timer = asyncio.get_running_loop().call_later(FIRST_BYTES_TIMEOUT_S, transport.abort)

    def data_received(self, data: bytes) -> None:
        if self.other is not None:
            if self.other.transport is None:  # still connecting to grpc: sent on connecting
                self._first += data
            else:
                super().data_received(data)
            return
        assert self.transport is not None
        self._first += data
        where = route(self._first)
        if where is None:
            self._refuse()
        elif where == "tls" or len(self._first) >= len(HTTP2_PREFACE):
            if self._timer is not None:
                self._timer.cancel()
            self.transport.pause_reading()
            self.other = _Side()
            asyncio.get_running_loop().create_task(self._splice(where))

    def _refuse(self) -> None:
        assert self.transport is not None
        host = self._peer[0] if self._peer else "?"
        self._front.denials.denied(host, "mixed-front", "native connection from %s closed: "
                                   "neither TLS nor gRPC (first bytes %s)",
                                   relayed_peers.client_address(self._peer),
                                   clip(self._first[:16].hex()))
        self.transport.abort()

    async def _splice(self, where: str) -> None:
        assert self.transport is not None and self.other is not None
        loop = asyncio.get_running_loop()
        upstream = self.other
        upstream.other = self
        try:
            await loop.create_connection(lambda: upstream, "127.0.0.1", self._front.ports[where])
        except OSError as error:
            log.warning("native gRPC front cannot reach its %s port: %s", where, error)
            self.transport.abort()
            return
        assert upstream.transport is not None
        if self.transport.is_closing():  # the client left while we connected
            upstream.transport.close()
            return
        local = upstream.transport.get_extra_info("sockname")
        if self._peer is not None:
            relayed_peers.register((local[0], local[1]), relayed_peers.client(self._peer))
            self._front.relayed[id(self)] = (local[0], local[1])
        upstream.transport.write(self._first)
        self._first = b""
        self.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        local = self._front.relayed.pop(id(self), None)
        if local is not None:
            relayed_peers.forget(local)
        super().connection_lost(exc)


class MixedFront:
    """The public port of mixed mode; ``ports`` are grpc's internal TLS and plaintext ports."""

    def __init__(self, tls_port: int, plain_port: int, denials: DenialLog) -> None:
        self.ports = {"tls": tls_port, "plain": plain_port}
        self.denials = denials
        self.relayed: dict[int, tuple[str, int]] = {}
        self._server: asyncio.base_events.Server | None = None
        self.port = 0

    async def start(self, host: str, port: int) -> None:
        """Listen on ``host:port``; OSError if it cannot bind."""
        self._server = await asyncio.get_running_loop().create_server(
            lambda: _Client(self), host, port, backlog=4096, reuse_address=True)
        self.port = self._server.sockets[0].getsockname()[1]

    def close(self) -> None:
        """Stop accepting; spliced connections end with grpc's server."""
        if self._server is not None:
            self._server.close()


def _tune(transport: asyncio.BaseTransport) -> None:
    transport.set_write_buffer_limits(HIGH_WATER, LOW_WATER)  # type: ignore[attr-defined]
    sock = transport.get_extra_info("socket")
    if sock is None:
        return
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for option in (socket.SO_RCVBUF, socket.SO_SNDBUF):
        sock.setsockopt(socket.SOL_SOCKET, option, SOCKET_BUFFER)
