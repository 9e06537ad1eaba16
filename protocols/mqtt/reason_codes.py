"""MQTT wire code tables: packet types, MQTT 5 reason codes, MQTT 3.1.1 return codes, and the
errors that carry them.

Every table here is literal data taken from the MQTT 3.1.1 and 5.0 specifications (sections
2.1.2 "MQTT Control Packet type", 2.4 "Reason Code" and 3.2.2.3 "Connect Return code"); code
elsewhere looks values up here instead of repeating them in `if` chains.
"""

from __future__ import annotations

from enum import IntEnum


class PacketType(IntEnum):
    """The control packet type: the high nibble of a packet's first byte."""

    CONNECT = 1
    CONNACK = 2
    PUBLISH = 3
    PUBACK = 4
    PUBREC = 5
    PUBREL = 6
    PUBCOMP = 7
    SUBSCRIBE = 8
    SUBACK = 9
    UNSUBSCRIBE = 10
    UNSUBACK = 11
    PINGREQ = 12
    PINGRESP = 13
    DISCONNECT = 14
    AUTH = 15


class ReasonCode(IntEnum):
    """MQTT 5.0 reason codes (spec 2.4). Several names share a value (0x00 is Success,
    NormalDisconnection and GrantedQoS0); a decoded value shows the first of them."""

    Success = 0x00
    NormalDisconnection = 0x00
    GrantedQoS0 = 0x00
    GrantedQoS1 = 0x01
    GrantedQoS2 = 0x02
    DisconnectWithWillMessage = 0x04
    NoMatchingSubscribers = 0x10
    NoSubscriptionExisted = 0x11
    ContinueAuthentication = 0x18
    ReAuthenticate = 0x19
    UnspecifiedError = 0x80
    MalformedPacket = 0x81
    ProtocolError = 0x82
    ImplementationSpecificError = 0x83
    UnsupportedProtocolVersion = 0x84
    ClientIdentifierNotValid = 0x85
    BadUserNameOrPassword = 0x86
    NotAuthorized = 0x87
    ServerUnavailable = 0x88
    ServerBusy = 0x89
    Banned = 0x8A
    ServerShuttingDown = 0x8B
    BadAuthenticationMethod = 0x8C
    KeepAliveTimeout = 0x8D
    SessionTakenOver = 0x8E
    TopicFilterInvalid = 0x8F
    TopicNameInvalid = 0x90
    PacketIdentifierInUse = 0x91
    PacketIdentifierNotFound = 0x92
    ReceiveMaximumExceeded = 0x93
    TopicAliasInvalid = 0x94
    PacketTooLarge = 0x95
    MessageRateTooHigh = 0x96
    QuotaExceeded = 0x97
    AdministrativeAction = 0x98
    PayloadFormatInvalid = 0x99
    RetainNotSupported = 0x9A
    QoSNotSupported = 0x9B
    UseAnotherServer = 0x9C
    ServerMoved = 0x9D
    SharedSubscriptionsNotSupported = 0x9E
    ConnectionRateExceeded = 0x9F
    MaximumConnectTime = 0xA0
    SubscriptionIdentifiersNotSupported = 0xA1
    WildcardSubscriptionsNotSupported = 0xA2


class ConnectReturnCode(IntEnum):
    """MQTT 3.1.1 CONNACK return codes (spec 3.1.1, 3.2.2.3)."""

    Accepted = 0
    UnacceptableProtocolVersion = 1
    IdentifierRejected = 2
    ServerUnavailable = 3
    BadUserNameOrPassword = 4
    NotAuthorized = 5


class SubAckReturnCode(IntEnum):
    """MQTT 3.1.1 SUBACK return codes (spec 3.1.1, 3.9.3): the granted QoS, or Failure."""

    MaximumQoS0 = 0x00
    MaximumQoS1 = 0x01
    MaximumQoS2 = 0x02
    Failure = 0x80


def _codes(*values: int) -> frozenset[ReasonCode]:
    return frozenset(ReasonCode(v) for v in values)


_PUBLISH_ACK = _codes(0x00, 0x10, 0x80, 0x83, 0x87, 0x90, 0x91, 0x97, 0x99)

REASON_CODES_BY_PACKET: dict[PacketType, frozenset[ReasonCode]] = {
    PacketType.CONNACK: _codes(0x00, *range(0x80, 0x8B), 0x8C, 0x90, 0x95, 0x97, 0x99, 0x9A,
                               0x9B, 0x9C, 0x9D, 0x9F),
    PacketType.PUBACK: _PUBLISH_ACK,
    PacketType.PUBREC: _PUBLISH_ACK,
    PacketType.PUBREL: _codes(0x00, 0x92),
    PacketType.PUBCOMP: _codes(0x00, 0x92),
    PacketType.SUBACK: _codes(0x00, 0x01, 0x02, 0x80, 0x83, 0x87, 0x8F, 0x91, 0x97, 0x9E, 0xA1,
                              0xA2),
    PacketType.UNSUBACK: _codes(0x00, 0x11, 0x80, 0x83, 0x87, 0x8F, 0x91),
    PacketType.DISCONNECT: _codes(0x00, 0x04, 0x80, 0x81, 0x82, 0x83, 0x87, 0x89, 0x8B,
                                  *range(0x8D, 0xA3)),
    PacketType.AUTH: _codes(0x00, 0x18, 0x19),
}
"""Which MQTT 5 reason codes each packet may carry (spec 3.x "Reason Code" tables)."""

V311_CONNACK_FOR: dict[ReasonCode, ConnectReturnCode] = {
    ReasonCode.Success: ConnectReturnCode.Accepted,
    ReasonCode.UnsupportedProtocolVersion: ConnectReturnCode.UnacceptableProtocolVersion,
    ReasonCode.ClientIdentifierNotValid: ConnectReturnCode.IdentifierRejected,
    ReasonCode.ServerUnavailable: ConnectReturnCode.ServerUnavailable,
    ReasonCode.BadUserNameOrPassword: ConnectReturnCode.BadUserNameOrPassword,
    ReasonCode.NotAuthorized: ConnectReturnCode.NotAuthorized,
}
"""The MQTT 3.1.1 CONNACK return code for an MQTT 5 reason code; absent means "just close"."""


class MqttError(Exception):
    """Input that breaks the MQTT specification. It carries the MQTT 5 reason code to send
    (in CONNACK before a session exists, DISCONNECT after) and closes the connection."""

    reason_code: ReasonCode = ReasonCode.UnspecifiedError

    def __init__(self, message: str, reason_code: ReasonCode | None = None) -> None:
        super().__init__(message)
        if reason_code is not None:
            self.reason_code = reason_code

    @property
    def v311_return_code(self) -> ConnectReturnCode | None:
        """The CONNACK return code an MQTT 3.1.1 server sends before closing, or None when
        MQTT 3.1.1 just closes the network connection."""
        return V311_CONNACK_FOR.get(self.reason_code)


class MalformedPacket(MqttError):
    """The bytes cannot be parsed as the specification says (0x81)."""

    reason_code = ReasonCode.MalformedPacket


class ProtocolError(MqttError):
    """The packet parses but contains something the specification forbids (0x82)."""

    reason_code = ReasonCode.ProtocolError


class PacketTooLarge(MqttError):
    """The packet is larger than the receiver's maximum packet size (0x95)."""

    reason_code = ReasonCode.PacketTooLarge


class UnsupportedProtocolVersion(MqttError):
    """CONNECT asks for a protocol level this codec does not speak (0x84)."""

    reason_code = ReasonCode.UnsupportedProtocolVersion


class TopicNameInvalid(MqttError):
    """A PUBLISH topic name contains a wildcard (0x90)."""

    reason_code = ReasonCode.TopicNameInvalid
