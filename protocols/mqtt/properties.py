"""MQTT data types (spec 1.5) and the MQTT 5 property table and property block codec (2.2.2).

Data types, big-endian:
    byte             1 byte
    two-byte int     2 bytes
    four-byte int    4 bytes
    varint           1-4 bytes, 7 bits each, least significant first, high bit = "more follows"
    UTF-8 string     two-byte length + that many bytes of UTF-8 (no U+0000, no surrogates)
    binary           two-byte length + that many bytes
    string pair      two UTF-8 strings (name, value)

A property block is a varint length, then that many bytes of (varint identifier, value). Only
User Property may repeat anywhere, and Subscription Identifier in PUBLISH. An unknown identifier
or a property outside its packets is a Malformed Packet; a duplicate or a forbidden value (a
Receive Maximum of 0, ...) is a Protocol Error (spec 2.2.2.2 and each property's rules).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass, fields
from enum import Enum
from typing import Any, Final, Literal

from .reason_codes import MalformedPacket, MqttError, PacketType, ProtocolError, ReasonCode

MAX_VARINT: Final = 268_435_455
WILL: Final = "will"
"""Property context of the will properties inside CONNECT's payload."""

Context = PacketType | Literal["will"]


class DataType(Enum):
    """The wire type of a property value."""

    BYTE = "byte"
    TWO_BYTE_INT = "two-byte int"
    FOUR_BYTE_INT = "four-byte int"
    VARINT = "varint"
    UTF8 = "UTF-8 string"
    BINARY = "binary"
    STRING_PAIR = "string pair"


class Reader:
    """Reads MQTT data types from one whole packet body; reading past its end is malformed.
    ``max_user_properties`` (None: any number) caps the user properties of every property
    block read from it."""

    def __init__(self, data: bytes | memoryview, max_user_properties: int | None = None) -> None:
        self.data = memoryview(data)
        self.pos = 0
        self.max_user_properties = max_user_properties

    def remaining(self) -> int:
        """How many bytes are left unread."""
        return len(self.data) - self.pos

    def take(self, n: int) -> bytes:
        """Return the next `n` bytes."""
        if n > self.remaining():
            raise MalformedPacket("packet ends inside a field")
        self.pos += n
        return bytes(self.data[self.pos - n : self.pos])

    def byte(self) -> int:
        """Return one unsigned byte."""
        return self.take(1)[0]

    def uint16(self) -> int:
        """Return a two-byte big-endian integer."""
        return int.from_bytes(self.take(2), "big")

    def uint32(self) -> int:
        """Return a four-byte big-endian integer."""
        return int.from_bytes(self.take(4), "big")

    def varint(self) -> int:
        """Return a variable byte integer of at most four bytes."""
        value = 0
        for shift in range(0, 28, 7):
            b = self.byte()
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                return value
        raise MalformedPacket("variable byte integer longer than 4 bytes")

    def binary(self) -> bytes:
        """Return two-byte-length-prefixed binary data."""
        return self.take(self.uint16())

    def utf8(self) -> str:
        """Return a UTF-8 string; invalid UTF-8 or U+0000 is malformed."""
        raw = self.binary()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise MalformedPacket(f"invalid UTF-8: {exc.reason}") from None
        if "\x00" in text:
            raise MalformedPacket("U+0000 in a UTF-8 string")
        return text

    def string_pair(self) -> tuple[str, str]:
        """Return a (name, value) UTF-8 string pair."""
        return self.utf8(), self.utf8()

    def rest(self) -> bytes:
        """Return every byte left."""
        return self.take(self.remaining())


def varint(value: int) -> bytes:
    """Encode a variable byte integer (0 to 268,435,455)."""
    if not 0 <= value <= MAX_VARINT:
        raise ValueError(f"{value} does not fit a variable byte integer")
    out = bytearray()
    while True:
        value, digit = value >> 7, value & 0x7F
        out.append(digit | (0x80 if value else 0))
        if not value:
            return bytes(out)


def binary(data: bytes) -> bytes:
    """Encode two-byte-length-prefixed binary data."""
    if len(data) > 0xFFFF:
        raise ValueError("binary data longer than 65,535 bytes")
    return struct.pack("!H", len(data)) + data


def utf8(text: str) -> bytes:
    """Encode a UTF-8 string; U+0000 and unencodable text are refused."""
    if "\x00" in text:
        raise ValueError("U+0000 is not allowed in an MQTT string")
    return binary(text.encode("utf-8"))


def uint16(value: int) -> bytes:
    """Encode a two-byte big-endian integer."""
    return struct.pack("!H", value)


_READ: dict[DataType, Callable[[Reader], Any]] = {
    DataType.BYTE: Reader.byte,
    DataType.TWO_BYTE_INT: Reader.uint16,
    DataType.FOUR_BYTE_INT: Reader.uint32,
    DataType.VARINT: Reader.varint,
    DataType.UTF8: Reader.utf8,
    DataType.BINARY: Reader.binary,
    DataType.STRING_PAIR: Reader.string_pair,
}
_WRITE: dict[DataType, Callable[[Any], bytes]] = {
    DataType.BYTE: lambda v: struct.pack("!B", v),
    DataType.TWO_BYTE_INT: uint16,
    DataType.FOUR_BYTE_INT: lambda v: struct.pack("!I", v),
    DataType.VARINT: varint,
    DataType.UTF8: utf8,
    DataType.BINARY: binary,
    DataType.STRING_PAIR: lambda v: utf8(v[0]) + utf8(v[1]),
}


@dataclass(frozen=True)
class PropertySpec:
    """One row of the property table: identifier, `Properties` field, type, where allowed,
    where it may repeat, and the valid values when the type allows more."""

    identifier: int
    name: str
    type: DataType
    packets: frozenset[Context]
    repeatable_in: frozenset[Context] = frozenset()
    valid: range | None = None


_P = PacketType
_ALL: frozenset[Context] = frozenset([*PacketType, WILL]) - {_P.PINGREQ, _P.PINGRESP}
_MESSAGE: frozenset[Context] = frozenset({_P.PUBLISH, WILL})
_BOOL = range(2)
_NONZERO_16 = range(1, 0x10000)


def _in(*where: Context) -> frozenset[Context]:
    return frozenset(where)


PROPERTIES: dict[int, PropertySpec] = {s.identifier: s for s in [
    PropertySpec(0x01, "payload_format_indicator", DataType.BYTE, _MESSAGE, valid=_BOOL),
    PropertySpec(0x02, "message_expiry_interval", DataType.FOUR_BYTE_INT, _MESSAGE),
    PropertySpec(0x03, "content_type", DataType.UTF8, _MESSAGE),
    PropertySpec(0x08, "response_topic", DataType.UTF8, _MESSAGE),
    PropertySpec(0x09, "correlation_data", DataType.BINARY, _MESSAGE),
    PropertySpec(0x0B, "subscription_identifiers", DataType.VARINT, _in(_P.PUBLISH, _P.SUBSCRIBE),
                 repeatable_in=_in(_P.PUBLISH), valid=range(1, MAX_VARINT + 1)),
    PropertySpec(0x11, "session_expiry_interval", DataType.FOUR_BYTE_INT,
                 _in(_P.CONNECT, _P.CONNACK, _P.DISCONNECT)),
    PropertySpec(0x12, "assigned_client_identifier", DataType.UTF8, _in(_P.CONNACK)),
    PropertySpec(0x13, "server_keep_alive", DataType.TWO_BYTE_INT, _in(_P.CONNACK)),
    PropertySpec(0x15, "authentication_method", DataType.UTF8, _in(_P.CONNECT, _P.CONNACK, _P.AUTH)),
    PropertySpec(0x16, "authentication_data", DataType.BINARY, _in(_P.CONNECT, _P.CONNACK, _P.AUTH)),
    PropertySpec(0x17, "request_problem_information", DataType.BYTE, _in(_P.CONNECT), valid=_BOOL),
    PropertySpec(0x18, "will_delay_interval", DataType.FOUR_BYTE_INT, _in(WILL)),
    PropertySpec(0x19, "request_response_information", DataType.BYTE, _in(_P.CONNECT), valid=_BOOL),
    PropertySpec(0x1A, "response_information", DataType.UTF8, _in(_P.CONNACK)),
    PropertySpec(0x1C, "server_reference", DataType.UTF8, _in(_P.CONNACK, _P.DISCONNECT)),
    PropertySpec(0x1F, "reason_string", DataType.UTF8,
                 _ALL - {_P.CONNECT, _P.PUBLISH, WILL, _P.SUBSCRIBE, _P.UNSUBSCRIBE}),
    PropertySpec(0x21, "receive_maximum", DataType.TWO_BYTE_INT, _in(_P.CONNECT, _P.CONNACK),
                 valid=_NONZERO_16),
    PropertySpec(0x22, "topic_alias_maximum", DataType.TWO_BYTE_INT, _in(_P.CONNECT, _P.CONNACK)),
    PropertySpec(0x23, "topic_alias", DataType.TWO_BYTE_INT, _in(_P.PUBLISH), valid=_NONZERO_16),
    PropertySpec(0x24, "maximum_qos", DataType.BYTE, _in(_P.CONNACK), valid=_BOOL),
    PropertySpec(0x25, "retain_available", DataType.BYTE, _in(_P.CONNACK), valid=_BOOL),
    PropertySpec(0x26, "user_properties", DataType.STRING_PAIR, _ALL, repeatable_in=_ALL),
    PropertySpec(0x27, "maximum_packet_size", DataType.FOUR_BYTE_INT, _in(_P.CONNECT, _P.CONNACK),
                 valid=range(1, 2**32)),
    PropertySpec(0x28, "wildcard_subscription_available", DataType.BYTE, _in(_P.CONNACK),
                 valid=_BOOL),
    PropertySpec(0x29, "subscription_identifier_available", DataType.BYTE, _in(_P.CONNACK),
                 valid=_BOOL),
    PropertySpec(0x2A, "shared_subscription_available", DataType.BYTE, _in(_P.CONNACK),
                 valid=_BOOL),
]}
"""The MQTT 5 properties (spec 2.2.2.2), keyed by identifier."""

_LISTS = frozenset({"subscription_identifiers", "user_properties"})


@dataclass(frozen=True)
class Properties:
    """An MQTT 5 property block. None (or an empty tuple) means absent. User properties keep
    their wire order; Subscription Identifier may repeat in PUBLISH, hence a tuple."""

    payload_format_indicator: int | None = None
    message_expiry_interval: int | None = None
    content_type: str | None = None
    response_topic: str | None = None
    correlation_data: bytes | None = None
    subscription_identifiers: tuple[int, ...] = ()
    session_expiry_interval: int | None = None
    assigned_client_identifier: str | None = None
    server_keep_alive: int | None = None
    authentication_method: str | None = None
    authentication_data: bytes | None = None
    request_problem_information: int | None = None
    will_delay_interval: int | None = None
    request_response_information: int | None = None
    response_information: str | None = None
    server_reference: str | None = None
    reason_string: str | None = None
    receive_maximum: int | None = None
    topic_alias_maximum: int | None = None
    topic_alias: int | None = None
    maximum_qos: int | None = None
    retain_available: int | None = None
    user_properties: tuple[tuple[str, str], ...] = ()
    maximum_packet_size: int | None = None
    wildcard_subscription_available: int | None = None
    subscription_identifier_available: int | None = None
    shared_subscription_available: int | None = None

    def __bool__(self) -> bool:
        return self is not NO_PROPERTIES and bool(self._present())

    def __repr__(self) -> str:
        return f"Properties({', '.join(f'{k}={v!r}' for k, v in self._present().items())})"

    def _present(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)
                if getattr(self, f.name) not in (None, ())}


NO_PROPERTIES: Final = Properties()


def _label(context: Context) -> str:
    return context.name if isinstance(context, PacketType) else "will properties"


def encode_properties(props: Properties, context: Context) -> bytes:
    """Encode a property block (its varint length first) for a packet of type `context`."""
    body = bytearray()
    for spec in PROPERTIES.values():
        value = getattr(props, spec.name)
        values = value if spec.name in _LISTS else () if value is None else (value,)
        if values and context not in spec.packets:
            raise ValueError(f"{spec.name} is not allowed in {_label(context)}")
        if len(values) > 1 and context not in spec.repeatable_in:
            raise ValueError(f"{spec.name} may appear only once in {_label(context)}")
        for item in values:
            body += varint(spec.identifier) + _WRITE[spec.type](item)
    return varint(len(body)) + bytes(body)


class TooManyProperties(MqttError):
    """More user properties than the receiver accepts in one packet (0x97 Quota exceeded: the
    spec has no code of its own for this, and 0x97 is "an implementation or administrative
    imposed limit has been exceeded", allowed in CONNACK and DISCONNECT)."""

    reason_code = ReasonCode.QuotaExceeded


def decode_properties(reader: Reader, context: Context) -> Properties:
    """Read a property block for a packet of type `context` from `reader`.

    Linear in the block's length: repeated properties are collected in lists and become
    tuples once. Reading stops at the first user property beyond the reader's
    ``max_user_properties`` (`TooManyProperties`), so a hostile block costs no more than that."""
    max_user_properties = reader.max_user_properties
    length = reader.varint()
    if length > reader.remaining():
        raise MalformedPacket("property length runs past the packet")
    block = Reader(reader.take(length))
    found: dict[str, Any] = {}
    repeated: dict[str, list[Any]] = {}
    while block.remaining():
        spec = PROPERTIES.get(block.varint())
        if spec is None:
            raise MalformedPacket("unknown property identifier")
        if context not in spec.packets:
            raise MalformedPacket(f"{spec.name} is not allowed in {_label(context)}")
        value = _READ[spec.type](block)
        if spec.valid is not None and value not in spec.valid:
            raise ProtocolError(f"{spec.name} may not be {value}")
        if spec.name in _LISTS:
            items = repeated.setdefault(spec.name, [])
            if items and context not in spec.repeatable_in:
                raise ProtocolError(f"{spec.name} may appear only once in {_label(context)}")
            items.append(value)
            if (max_user_properties is not None and spec.name == "user_properties"
                    and len(items) > max_user_properties):
                raise TooManyProperties(f"more than {max_user_properties} user properties in "
                                        f"{_label(context)}")
        elif spec.name in found:
            raise ProtocolError(f"{spec.name} appears twice")
        else:
            found[spec.name] = value
    for name, items in repeated.items():
        found[name] = tuple(items)
    return Properties(**found)
