"""What a `ServerConnection` reports to its adapter: one frozen dataclass per thing the client
did. The adapter reads them with `ServerConnection.next_event()` and answers through the
connection's methods (`accept`, `ack_publish`, ...); events never carry wire packets."""

from __future__ import annotations

from dataclasses import dataclass, field

from .packets import Subscription, Will
from .properties import NO_PROPERTIES, Properties
from .reason_codes import ReasonCode


@dataclass(frozen=True)
class ConnectRequested:
    """A CONNECT arrived; answer with `accept()` or `refuse()`. Nothing after it is read
    until then (spec 3.1.4: no processing before CONNACK)."""

    client_id: str
    clean_start: bool
    keep_alive: int
    username: str | None
    password: bytes | None
    will: Will | None
    properties: Properties
    version: int


@dataclass(slots=True)
class MessagePublished:
    """An application message from the client. QoS 1 and 2 need `ack_publish(packet_id)`.
    `topic` is resolved from a topic alias; `properties` no longer carry the alias."""

    topic: str
    payload: bytes
    qos: int
    retain: bool
    packet_id: int | None
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True)
class SubscribeRequested:
    """SUBSCRIBE; answer with `ack_subscribe(packet_id, granted)`."""

    packet_id: int
    subscriptions: tuple[Subscription, ...]
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True)
class UnsubscribeRequested:
    """UNSUBSCRIBE; answer with `ack_unsubscribe(packet_id, ...)`."""

    packet_id: int
    filters: tuple[str, ...]
    properties: Properties = NO_PROPERTIES


@dataclass(slots=True)
class PublishAcknowledged:
    """The client finished a message we sent: PUBACK (QoS 1), PUBCOMP (QoS 2), or in MQTT 5 a
    PUBACK/PUBREC with a failure `reason_code` (>= 0x80), which also ends the exchange."""

    packet_id: int
    reason_code: ReasonCode = ReasonCode.Success


@dataclass(frozen=True)
class PublishReceived:
    """PUBREC for an outbound QoS 2 message (only with ``adapter_releases``): persist that
    it arrived, then send `release(packet_id)`."""

    packet_id: int


@dataclass(frozen=True)
class ReleaseRequested:
    """PUBREL for an inbound QoS 2 message (only with ``adapter_releases``): persist that it
    is released, then send `complete(packet_id)`."""

    packet_id: int


@dataclass(frozen=True)
class ConnectionClosed:
    """The connection is over; the adapter writes out `data_to_send()` and closes the socket.
    `will_should_publish` is False only after a normal DISCONNECT from the client; it says the
    will (if the session has one) is due, not that there is one."""

    reason_code: ReasonCode
    will_should_publish: bool
    session_expiry_interval: int | None = None
    """MQTT 5: the new session expiry a DISCONNECT set, if it set one."""
    detail: str = field(default="", compare=False)
    """What was wrong, for a protocol error (for logs; not part of equality)."""


Event = (ConnectRequested | MessagePublished | SubscribeRequested | UnsubscribeRequested
         | PublishAcknowledged | PublishReceived | ReleaseRequested | ConnectionClosed)
"""Anything `ServerConnection.next_event()` returns."""
