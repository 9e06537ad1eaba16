"""Backpressure for one MQTT connection, as a small object (uvicorn's ``flow_control.py``).

Reading from the client pauses while its CONNECT is answered (nothing is read before the
CONNACK, 3.1.4) and while more than ``max_unstored`` of its messages are read but not yet
stored, so a fast publisher waits for the store instead of filling memory; it resumes once
half of those are stored. Writing is congested while more than ``max_buffered`` bytes wait to
be sent: sessions then hold QoS 1/2 messages back and drop QoS 0 ones.

Runs on the event loop; not thread-safe.
"""

from __future__ import annotations

from .wire import Wire

MAX_UNSTORED = 1024
"""Messages of one connection read but not yet stored (durable, under ``sync`` flush) before
reading from it pauses: what keeps a QoS 0 publisher, which waits for no PUBACK, from running
ahead of the disk. As many as the Receive Maximum a QoS 1/2 publisher is given by default."""


class FlowControl:
    """When to stop reading from one wire, and whether writing to it is congested."""

    def __init__(self, wire: Wire, max_buffered: int, max_unstored: int = MAX_UNSTORED) -> None:
        self._wire = wire
        self._max_buffered = max_buffered
        self._max_unstored = max_unstored
        self.unstored = 0
        """Messages read from this client and not yet stored."""
        self._full = False
        """Reading is paused because too many messages are unstored."""

    def connect_received(self) -> None:
        """A CONNECT is being answered: read nothing more until `connect_answered`."""
        self._wire.pause_reading()

    def connect_answered(self) -> None:
        """The CONNACK is out: read again, unless the store is behind."""
        if not self._full:
            self._wire.resume_reading()

    def storing(self, count: int) -> None:
        """``count`` more messages are on their way to the store."""
        self.unstored += count
        if self.unstored > self._max_unstored and not self._full:
            self._full = True
            self._wire.pause_reading()

    def stored(self, count: int) -> None:
        """``count`` messages were stored (or refused)."""
        self.unstored -= count
        if self._full and self.unstored <= self._max_unstored // 2:
            self._full = False
            self._wire.resume_reading()

    def congested(self, unsent: int) -> bool:
        """Whether ``unsent`` bytes not yet handed to the wire, plus what the wire holds,
        exceed ``max_buffered``."""
        return unsent + self._wire.buffered() > self._max_buffered
