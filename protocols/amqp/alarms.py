"""Resource alarms for AMQP connections, as RabbitMQ raises them: while the store cannot write
(disk full, I/O errors), every connection that publishes is blocked: it is sent
connection.blocked (when it announced the ``connection.blocked`` capability) and the broker
stops reading from it, so its publishes wait in the client and the network, not in the broker.
A connection that has not published yet is blocked at its first publish. Consumers go on.
Once the store writes again, blocked connections get connection.unblocked and are read again.
Sluice has no memory alarm. Runs on the event loop.
"""

from __future__ import annotations

import logging
from typing import Final, Protocol

log = logging.getLogger(__name__)

LOW_ON_DISK: Final = "low on disk"
"""The reason connection.blocked carries (RabbitMQ's text for its disk alarm)."""


class Blockable(Protocol):
    """A connection the alarm blocks and unblocks (``adapter.AmqpAdapter``)."""

    def alarm_changed(self) -> None: ...


class Alarms:
    """The broker-wide alarm and the connections it concerns."""

    def __init__(self) -> None:
        self.reason: str | None = None
        """Why publishing connections are blocked; None while they are not."""
        self._connections: dict[Blockable, None] = {}

    def store_health(self, failure: str | None) -> None:
        """Core's store watch: ``failure`` says why the store cannot write, None that it can."""
        reason = LOW_ON_DISK if failure is not None else None
        if reason == self.reason:
            return
        self.reason = reason
        if reason is not None:
            log.warning("AMQP publishers are blocked: the store cannot write (%s)", failure)
        else:
            log.info("AMQP publishers are unblocked: the store writes again")
        for connection in list(self._connections):
            connection.alarm_changed()

    def add(self, connection: Blockable) -> None:
        self._connections[connection] = None

    def remove(self, connection: Blockable) -> None:
        self._connections.pop(connection, None)
