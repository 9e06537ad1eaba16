"""A fake `Wire` for driving a protocol adapter without sockets, the way uvicorn's protocol tests
use a mock transport: it keeps what the adapter writes and how the adapter steers it. Shared by
the MQTT and AMQP adapter tests."""
from __future__ import annotations

import asyncio


class FakeWire:
    """A `Wire` that keeps what is written to it and how the adapter steers it."""

    def __init__(self, peer: str) -> None:
        self.peer = peer
        self.written = bytearray()
        self.closed = False
        self.aborted = False
        self.reading = True
        self.backlog = 0
        """Bytes the network has not taken yet (what `buffered` reports)."""
        self._changed = asyncio.Event()

    def write(self, data: bytes) -> None:
        assert not self.closed, "written after close"
        self.written += data
        self._changed.set()

    def buffered(self) -> int:
        return self.backlog

    def close(self) -> None:
        self.closed = True
        self._changed.set()

    def abort(self) -> None:
        self.aborted = self.closed = True
        self._changed.set()

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    async def changed(self) -> None:
        """Return once something was written or the wire closed."""
        await self._changed.wait()
        self._changed.clear()
