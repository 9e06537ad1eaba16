"""The ``[amqp]`` settings: the listener, what connection.tune offers and the limits the AMQP
front end holds clients to."""

from __future__ import annotations

import resource
from dataclasses import dataclass
from typing import Final

from .connection import Options

DESCRIPTOR_RESERVE: Final = 512
"""Descriptors ``max_connections = 0`` leaves to everything but AMQP sockets."""
MIN_AUTO_CONNECTIONS: Final = 16


@dataclass(frozen=True)
class AmqpOptions:
    """The AMQP 0-9-1 listeners and their limits; a port of -1 is not opened (0 picks a free
    port). The TLS listener serves the certificate of every TLS listener (``[tls]`` cert and
    key, ``--tls-cert`` / ``--tls-key``) and opens only with one."""

    host: str = "127.0.0.1"
    """Address the AMQP listeners bind."""
    port: int = 5672
    """AMQP 0-9-1 port."""
    tls_port: int = 5671
    """AMQP over TLS (``amqps://``)."""
    heartbeat_s: int = 60
    """Heartbeat interval offered in connection.tune (0: none unless the client asks)."""
    frame_max: int = 131_072
    """Largest frame offered in connection.tune."""
    channel_max: int = 2047
    """Most channels one connection may open."""
    connect_timeout_s: float = 10.0
    """A connection that has not finished its handshake within this many seconds is closed."""
    max_connections: int = 0
    """Open AMQP connections at once; 0: the process's descriptor limit less a reserve."""
    max_message_size: int = 16 << 20
    """Largest message body accepted (RabbitMQ 4's default); a larger publish is a 406. Core's
    ``max_message_bytes`` applies too: the smaller of the two is what clients are held to."""
    guest_from_loopback: bool = True
    """As RabbitMQ: user ``guest`` (password ``guest``) exists and may log in only from a
    loopback address. False: no guest user is created and ``guest`` is like any user."""

    def connection_options(self, max_body: int | None = None) -> Options:
        """What each sans-IO `ServerConnection` is built with; ``max_body``: the largest body
        the broker stores (core's ``max_message_bytes``), when smaller than ours."""
        largest = self.max_message_size if max_body is None else min(max_body,
                                                                        self.max_message_size)
        return Options(channel_max=self.channel_max, frame_max=self.frame_max,
                       heartbeat=self.heartbeat_s, max_message_size=largest,
                       handshake_timeout=self.connect_timeout_s)

    def connection_limit(self) -> int:
        """``max_connections``, or for 0 the soft descriptor limit less a reserve (or half of
        a small limit), so AMQP sockets cannot take the descriptors the store needs."""
        if self.max_connections > 0:
            return self.max_connections
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft == resource.RLIM_INFINITY:
            soft = 1 << 20
        return max(MIN_AUTO_CONNECTIONS, soft - min(DESCRIPTOR_RESERVE, soft // 2))
