"""MQTT 3.1.1 and 5.0 control packets as dataclasses, one per packet type: frozen, except the
ones made for every message (PUBLISH and its acknowledgements), which are slotted and not
frozen because a frozen dataclass costs about a microsecond more to build. Treat all as values.

A packet holds what both versions carry; fields that exist only in MQTT 5 (properties, most
reason codes) keep their defaults when a packet is encoded or decoded as MQTT 3.1.1. The codec
(`codec.py`) turns these into bytes and back; nothing here knows about sockets or sessions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .properties import NO_PROPERTIES, Properties
from .reason_codes import PacketType, ReasonCode


@dataclass(frozen=True)
class Will:
    """The will message inside CONNECT, published when the connection ends abnormally."""

    topic: str
    payload: bytes = b""
    qos: int = 0
    retain: bool = False
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True)
class Connect:
    """CONNECT: the first packet a client sends. `clean_start` is 3.1.1's clean session."""

    type: ClassVar[PacketType] = PacketType.CONNECT
    client_id: str = ""
    clean_start: bool = True
    keep_alive: int = 0
    username: str | None = None
    password: bytes | None = None
    will: Will | None = None
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True)
class ConnAck:
    """CONNACK. `reason_code` is a ReasonCode in MQTT 5 and a ConnectReturnCode in 3.1.1."""

    type: ClassVar[PacketType] = PacketType.CONNACK
    session_present: bool = False
    reason_code: int = ReasonCode.Success
    properties: Properties = NO_PROPERTIES


@dataclass(slots=True)
class Publish:
    """PUBLISH. `packet_id` is None exactly when `qos` is 0."""

    type: ClassVar[PacketType] = PacketType.PUBLISH
    topic: str
    payload: bytes = b""
    qos: int = 0
    retain: bool = False
    dup: bool = False
    packet_id: int | None = None
    properties: Properties = NO_PROPERTIES


@dataclass(slots=True)
class _PublishAck:
    """The QoS 1/2 acknowledgements: a packet id and, in MQTT 5, a reason code."""

    packet_id: int
    reason_code: ReasonCode = ReasonCode.Success
    properties: Properties = NO_PROPERTIES


@dataclass(slots=True)
class PubAck(_PublishAck):
    """PUBACK: answers a QoS 1 PUBLISH."""

    type: ClassVar[PacketType] = PacketType.PUBACK


@dataclass(slots=True)
class PubRec(_PublishAck):
    """PUBREC: first answer to a QoS 2 PUBLISH."""

    type: ClassVar[PacketType] = PacketType.PUBREC


@dataclass(slots=True)
class PubRel(_PublishAck):
    """PUBREL: answers PUBREC."""

    type: ClassVar[PacketType] = PacketType.PUBREL


@dataclass(slots=True)
class PubComp(_PublishAck):
    """PUBCOMP: answers PUBREL, ending a QoS 2 exchange."""

    type: ClassVar[PacketType] = PacketType.PUBCOMP


@dataclass(frozen=True)
class Subscription:
    """One topic filter of SUBSCRIBE with its options (no_local, retain_as_published and
    retain_handling exist only in MQTT 5)."""

    topic_filter: str
    qos: int = 0
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0


@dataclass(frozen=True)
class Subscribe:
    """SUBSCRIBE: one or more topic filters."""

    type: ClassVar[PacketType] = PacketType.SUBSCRIBE
    packet_id: int
    subscriptions: tuple[Subscription, ...]
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True)
class SubAck:
    """SUBACK: one reason code (3.1.1: return code) per requested filter, in order."""

    type: ClassVar[PacketType] = PacketType.SUBACK
    packet_id: int
    reason_codes: tuple[int, ...]
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True)
class Unsubscribe:
    """UNSUBSCRIBE: one or more topic filters."""

    type: ClassVar[PacketType] = PacketType.UNSUBSCRIBE
    packet_id: int
    topic_filters: tuple[str, ...]
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True)
class UnsubAck:
    """UNSUBACK: in MQTT 5 one reason code per filter; in 3.1.1 none."""

    type: ClassVar[PacketType] = PacketType.UNSUBACK
    packet_id: int
    reason_codes: tuple[ReasonCode, ...] = ()
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True)
class PingReq:
    """PINGREQ: keep-alive probe from the client."""

    type: ClassVar[PacketType] = PacketType.PINGREQ


@dataclass(frozen=True)
class PingResp:
    """PINGRESP: the server's answer to PINGREQ."""

    type: ClassVar[PacketType] = PacketType.PINGRESP


@dataclass(frozen=True)
class Disconnect:
    """DISCONNECT: the last packet; in MQTT 5 either side may send it, with a reason."""

    type: ClassVar[PacketType] = PacketType.DISCONNECT
    reason_code: ReasonCode = ReasonCode.NormalDisconnection
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True)
class Auth:
    """AUTH (MQTT 5 only): one step of an extended authentication exchange."""

    type: ClassVar[PacketType] = PacketType.AUTH
    reason_code: ReasonCode = ReasonCode.Success
    properties: Properties = NO_PROPERTIES


Packet = (Connect | ConnAck | Publish | PubAck | PubRec | PubRel | PubComp | Subscribe | SubAck
          | Unsubscribe | UnsubAck | PingReq | PingResp | Disconnect | Auth)
"""Any MQTT control packet."""
