"""The AMQP listener: plain TCP over asyncio, each accepted socket a `Wire` to the front end."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable

from .adapter import AmqpAdapter, Wire
from .frontend import AmqpFrontend
from .options import AmqpOptions

HIGH_WATER = 256 << 10
LOW_WATER = 64 << 10
BACKLOG = 4096


class AmqpWire(asyncio.Protocol):
    """A `Wire` over an asyncio transport. Runs on the event loop."""

    def __init__(self, new_connection: Callable[[Wire], AmqpAdapter]) -> None:
        self._new_connection = new_connection
        self._transport: asyncio.Transport | None = None
        self._adapter: AmqpAdapter | None = None
        self.peer = "?"

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        transport.set_write_buffer_limits(HIGH_WATER, LOW_WATER)  # type: ignore[attr-defined]
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self._adapter = self._new_connection(self)

    def data_received(self, data: bytes) -> None:
        assert self._adapter is not None
        self._adapter.data_received(data)

    def eof_received(self) -> bool:
        return False  # close the transport; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        if self._adapter is not None:
            self._adapter.connection_lost()

    def pause_writing(self) -> None:
        if self._adapter is not None:
            self._adapter.pause_writing()

    def resume_writing(self) -> None:
        if self._adapter is not None:
            self._adapter.resume_writing()

    # Wire
    def write(self, data: bytes) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(data)

    def close(self) -> None:
        """Send what is queued, then close."""
        if self._transport is not None:
            self._transport.close()

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    def pause_reading(self) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.pause_reading()

    def resume_reading(self) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.resume_reading()


class AmqpListener:
    """The open AMQP listener and its bound port."""

    def __init__(self, server: asyncio.base_events.Server) -> None:
        self._server = server
        self.port: int = server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Stop accepting."""
        self._server.close()


async def start_amqp_listener(frontend: AmqpFrontend, options: AmqpOptions) -> AmqpListener:
    """Open the TCP listener of ``options``. Raises OSError when the port is taken."""
    server = await asyncio.get_running_loop().create_server(
        lambda: AmqpWire(frontend.new_connection), options.host, options.port,
        backlog=BACKLOG, reuse_address=True)
    return AmqpListener(server)
