"""The caps on what one MQTT peer can make the broker hold or parse (SECURITY.md lists them).

`Limits` is what a single connection enforces, before and after CONNECT; `connection_limit`
turns ``max_connections = 0`` into a number the process's descriptor limit can afford. Nothing
here does I/O or imports core; the settings come from `MqttOptions`.
"""

from __future__ import annotations

import resource
from dataclasses import dataclass
from typing import Final

from .codec import MAX_PACKET_SIZE
from .options import MqttOptions
from .topics import InvalidFilter

DESCRIPTOR_RESERVE: Final = 512
"""Descriptors ``max_connections = 0`` leaves to everything but MQTT sockets: the store's
segment and queue files, the metadata database, the other listeners and their clients."""
MIN_AUTO_CONNECTIONS: Final = 16


@dataclass(frozen=True)
class Limits:
    """What one connection accepts. ``connect_timeout`` 0 and None counts mean "no limit"."""

    max_packet_size: int = MAX_PACKET_SIZE
    """Largest packet once the client is authenticated (advertised in MQTT 5 CONNACK)."""
    max_connect_packet_size: int = MAX_PACKET_SIZE
    """Largest packet before the CONNECT is answered: the CONNECT itself, with its will."""
    connect_timeout: float = 0.0
    """Seconds a connection may take to send its whole CONNECT."""
    max_client_id_length: int | None = None
    """Longest client identifier, in UTF-8 bytes."""
    max_topic_length: int | None = None
    """Longest topic name or filter, in UTF-8 bytes."""
    max_topic_levels: int | None = None
    """Most ``/``-separated levels of a topic name or filter."""
    max_user_properties: int | None = None
    """Most MQTT 5 user properties in one packet (or in the will)."""

    @classmethod
    def from_options(cls, options: MqttOptions) -> Limits:
        """The limits the ``[mqtt]`` settings ask for."""
        return cls(max_packet_size=options.max_packet_size,
                   max_connect_packet_size=options.max_connect_packet_size,
                   connect_timeout=options.connect_timeout_s,
                   max_client_id_length=options.max_client_id_length,
                   max_topic_length=options.max_topic_length,
                   max_topic_levels=options.max_topic_levels,
                   max_user_properties=options.max_user_properties)

    def client_id_problem(self, client_id: str) -> str | None:
        """Why ``client_id`` is refused, or None."""
        if self.max_client_id_length is not None and \
                _utf8_length(client_id, self.max_client_id_length) > self.max_client_id_length:
            return f"client identifier longer than {self.max_client_id_length} bytes " \
                   f"(max_client_id_length)"
        return None

    def topic_problem(self, topic: str) -> str | None:
        """Why a topic name or filter is refused for its size, or None. Linear in ``topic``."""
        if self.max_topic_length is not None and \
                _utf8_length(topic, self.max_topic_length) > self.max_topic_length:
            return f"topic longer than {self.max_topic_length} bytes (max_topic_length)"
        if self.max_topic_levels is not None and topic.count("/") >= self.max_topic_levels:
            return f"topic with more than {self.max_topic_levels} levels (max_topic_levels)"
        return None

    def check_filter(self, topic_filter: str) -> None:
        """Raise InvalidFilter (SUBACK 0x8F) for a filter beyond the topic limits."""
        problem = self.topic_problem(topic_filter)
        if problem is not None:
            raise InvalidFilter(problem)


def _utf8_length(text: str, limit: int) -> int:
    """The UTF-8 length of ``text``, encoding it only when its length in characters cannot
    tell whether it is within ``limit`` (a character takes 1 to 4 bytes)."""
    if len(text) > limit or 4 * len(text) <= limit:
        return len(text)
    return len(text.encode("utf-8", "surrogatepass"))


def connection_limit(max_connections: int) -> int:
    """``max_connections``, or for 0 the process's soft descriptor limit less a reserve
    (`DESCRIPTOR_RESERVE`, or half the limit when it is small), so MQTT sockets can never take
    the descriptors the store needs."""
    if max_connections > 0:
        return max_connections
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 20
    return max(MIN_AUTO_CONNECTIONS, soft - min(DESCRIPTOR_RESERVE, soft // 2))
