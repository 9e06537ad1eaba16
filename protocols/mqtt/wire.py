"""The seam between a byte transport (TCP, TLS, WebSocket) and the MQTT connection handler.

A listener wraps each accepted connection in a `Wire` and asks the front end for a
`ConnectionHandler`; from then on it calls `data_received` with whatever bytes arrive and
`connection_lost` exactly once when the transport is gone. The handler writes through the wire.
TCP and TLS wires are thin shims over asyncio transports; the WebSocket wire frames bytes as
binary messages. Everything runs on the event loop.
"""

from __future__ import annotations

from typing import Protocol


class Wire(Protocol):
    """A byte pipe to one client."""

    peer: str
    """Printable remote address, for logs."""

    def write(self, data: bytes) -> None:
        """Queue ``data`` for sending; never blocks."""

    def buffered(self) -> int:
        """Bytes written but not yet handed to the network: the slow-consumer measure."""

    def close(self) -> None:
        """Send what is queued, then close."""

    def abort(self) -> None:
        """Close at once, dropping what is queued."""

    def pause_reading(self) -> None:
        """Stop calling ``data_received`` until ``resume_reading``."""

    def resume_reading(self) -> None:
        """Undo ``pause_reading``."""


class ConnectionHandler(Protocol):
    """What the MQTT front end gives each new wire."""

    def data_received(self, data: bytes) -> None:
        """Bytes from the client, in order, in chunks of any size."""

    def connection_lost(self) -> None:
        """The transport is closed (by either side); called once, after the last data."""

    def writable(self) -> None:
        """The wire's send buffer fell below its low-water mark after being full."""
