"""Resource alarms for AMQP connections, as RabbitMQ raises them: while the store cannot write
(disk full, I/O errors) or core's memory alarm is on (resident memory above
``core.memory_high_watermark``), every connection that publishes is blocked: it is sent
connection.blocked (when it announced the ``connection.blocked`` capability) and the broker
stops reading from it, so its publishes wait in the client and the network, not in the broker.
A connection that has not published yet is blocked at its first publish. Consumers go on.
Once every alarm is off again, blocked connections get connection.unblocked and are read again.
Runs on the event loop.
"""

from __future__ import annotations

import logging
from typing import Final, Protocol

log = logging.getLogger(__name__)

LOW_ON_DISK: Final = "low on disk"
"""The reason connection.blocked carries (RabbitMQ's text for its disk alarm)."""
LOW_ON_MEMORY: Final = "low on memory"
"""The same for the memory alarm."""


class Blockable(Protocol):
    """A connection the alarm blocks and unblocks (``adapter.AmqpAdapter``)."""

    def alarm_changed(self) -> None: ...


class Alarms:
    """The broker-wide alarm and the connections it concerns."""

    def __init__(self) -> None:
        self.reason: str | None = None
        """Why publishing connections are blocked; None while they are not."""
        self._disk = False
        self._memory = False
        self._connections: dict[Blockable, None] = {}

    def store_health(self, failure: str | None) -> None:
        """Core's store watch: ``failure`` says why the store cannot write, None that it can."""
        if (failure is not None) != self._disk:
            self._disk = failure is not None
            if failure is not None:
                log.warning("AMQP publishers are blocked: the store cannot write (%s)", failure)
            self._changed()

    def memory(self, on: bool) -> None:
        """Core's memory alarm went on or off."""
        if on != self._memory:
            self._memory = on
            self._changed()

    def _changed(self) -> None:
        """Tell the connections when publishers go from unblocked to blocked or back; while
        one alarm stays on, the other's clearing changes nothing."""
        reason = LOW_ON_MEMORY if self._memory else LOW_ON_DISK if self._disk else None
        blocked = self.reason is not None
        self.reason = reason
        if (reason is not None) == blocked:
            return
        if reason is None:
            log.info("AMQP publishers are unblocked: no resource alarm is on")
        for connection in list(self._connections):
            connection.alarm_changed()

    def add(self, connection: Blockable) -> None:
        self._connections[connection] = None

    def remove(self, connection: Blockable) -> None:
        self._connections.pop(connection, None)
