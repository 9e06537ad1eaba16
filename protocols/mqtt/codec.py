"""Sans-IO MQTT 3.1.1 (version 4) and 5.0 (version 5) codec: `encode(packet, version)` and an
incremental `Decoder` (`feed(bytes)`, `next_packet() -> Packet | None`).

Packet layout (spec 2.1):

    byte 0      packet type (high nibble) | flags (low nibble; fixed except for PUBLISH)
    bytes 1-4   remaining length, a varint of at most 4 bytes
    ...         variable header and payload, exactly `remaining length` bytes

The decoder reads the fixed header, waits for the whole packet, then parses it (pamqp's rule),
so "need more data" (None) is never confused with "bad" (an `MqttError` carrying its reason
code). It learns the protocol version from CONNECT unless given one; it reads no socket.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from .packets import (Auth, ConnAck, Connect, Disconnect, Packet, PingReq, PingResp, PubAck,
                      PubComp, Publish, PubRec, PubRel, SubAck, Subscribe, Subscription,
                      UnsubAck, Unsubscribe, Will)
from .properties import (MAX_VARINT, NO_PROPERTIES, WILL, Context, Properties, Reader, binary,
                         decode_properties, encode_properties, uint16, utf8, varint)
from .reason_codes import (REASON_CODES_BY_PACKET, ConnectReturnCode, MalformedPacket, MqttError,
                           PacketTooLarge, PacketType, ProtocolError, ReasonCode,
                           SubAckReturnCode, TopicNameInvalid, UnsupportedProtocolVersion)

__all__ = ["MAX_PACKET_SIZE", "Decoder", "MqttError", "encode"]

MQTT_311: Final = 4
MQTT_5: Final = 5
VERSIONS: Final = (MQTT_311, MQTT_5)
MAX_PACKET_SIZE: Final = 1 + 4 + MAX_VARINT
"""The largest packet the wire format can express (fixed header + remaining length)."""

_PROTOCOLS = {("MQTT", 4): MQTT_311, ("MQTT", 5): MQTT_5}
_KNOWN_NAMES = frozenset({"MQTT", "MQIsdp"})
_FIXED_FLAGS = {PacketType.PUBREL: 0b0010, PacketType.SUBSCRIBE: 0b0010,
                PacketType.UNSUBSCRIBE: 0b0010}
"""Fixed-header flags of every packet but PUBLISH; absent means 0 (spec 2.1.3)."""
_PACKET_TYPES: Final = tuple(PacketType(v) if v else None for v in range(16))
"""PacketType by its value (0 is reserved), without the enum's slower constructor."""
_SHORT_PUBLISH_FIRST: Final = frozenset(0x30 | flags for flags in range(16)
                                       if flags & 0b0110 != 0b0110
                                       and not (flags & 0b1000 and not flags & 0b0110))
"""First bytes of a PUBLISH whose flags are valid (QoS 0-2, DUP only above QoS 0)."""
_SHORT_ACKS: dict[PacketType, type[PubAck | PubRec | PubComp]] = {
    PacketType.PUBACK: PubAck, PacketType.PUBREC: PubRec, PacketType.PUBCOMP: PubComp}
"""Acknowledgements decoded without a `Reader` when they hold only a packet id."""
_V311_CONNACK = frozenset(ConnectReturnCode)
_V311_SUBACK = frozenset(SubAckReturnCode)


# ----------------------------------------------------------------------------- encoding


def encode(packet: Packet, version: int) -> bytes:
    """Return the wire bytes of `packet` for protocol version 4 (3.1.1) or 5 (5.0).

    Raises ValueError for a packet that the version cannot express (AUTH in 3.1.1, a
    password without a user name in 3.1.1, a QoS 0 PUBLISH with a packet id, ...).
    """
    if version not in VERSIONS:
        raise ValueError(f"unsupported MQTT version {version}")
    body = _ENCODERS[packet.type](packet, version)
    flags = _publish_flags(packet) if isinstance(packet, Publish) else _FIXED_FLAGS.get(packet.type, 0)
    return bytes([packet.type << 4 | flags]) + varint(len(body)) + body


def _props(props: Properties, context: Context, version: int) -> bytes:
    if version == MQTT_5:
        return encode_properties(props, context)
    if props:
        raise ValueError("MQTT 3.1.1 packets carry no properties")
    return b""


def _publish_flags(p: Publish) -> int:
    return p.dup << 3 | p.qos << 1 | p.retain


def _encode_connect(p: Connect, version: int) -> bytes:
    if version == MQTT_311 and p.password is not None and p.username is None:
        raise ValueError("MQTT 3.1.1 allows a password only with a user name")
    will = p.will
    flags = (p.clean_start << 1 | (will is not None) << 2 | (p.password is not None) << 6
             | (p.username is not None) << 7)
    out = [utf8("MQTT"), bytes([version])]
    if will is not None:
        flags |= will.qos << 3 | will.retain << 5
    out += [bytes([flags]), uint16(p.keep_alive), _props(p.properties, PacketType.CONNECT, version),
            utf8(p.client_id)]
    if will is not None:
        out += [_props(will.properties, WILL, version), utf8(will.topic), binary(will.payload)]
    if p.username is not None:
        out.append(utf8(p.username))
    if p.password is not None:
        out.append(binary(p.password))
    return b"".join(out)


def _encode_connack(p: ConnAck, version: int) -> bytes:
    return bytes([p.session_present, p.reason_code]) + _props(p.properties, p.type, version)


def _encode_publish(p: Publish, version: int) -> bytes:
    if (p.packet_id is None) != (p.qos == 0):
        raise ValueError("a PUBLISH has a packet id exactly when its QoS is above 0")
    pid = b"" if p.packet_id is None else uint16(p.packet_id)
    return utf8(p.topic) + pid + _props(p.properties, p.type, version) + p.payload


def _encode_reason_tail(code: int, props: Properties, ptype: PacketType, version: int) -> bytes:
    """MQTT 5's optional reason code and properties: omitted while they are the defaults."""
    if version == MQTT_311:
        return _props(props, ptype, version)
    if not props:
        return b"" if code == 0 else bytes([code])
    return bytes([code]) + encode_properties(props, ptype)


def _encode_pub_ack(p: PubAck | PubRec | PubRel | PubComp, version: int) -> bytes:
    if version == MQTT_311 and p.reason_code:
        raise ValueError("MQTT 3.1.1 acknowledgements carry no reason code")
    return uint16(p.packet_id) + _encode_reason_tail(p.reason_code, p.properties, p.type, version)


def _subscription_options(s: Subscription, version: int) -> int:
    if version == MQTT_311:
        return s.qos
    return s.qos | s.no_local << 2 | s.retain_as_published << 3 | s.retain_handling << 4


def _encode_subscribe(p: Subscribe, version: int) -> bytes:
    out = [uint16(p.packet_id), _props(p.properties, p.type, version)]
    out += [utf8(s.topic_filter) + bytes([_subscription_options(s, version)])
            for s in p.subscriptions]
    return b"".join(out)


def _encode_suback(p: SubAck, version: int) -> bytes:
    return uint16(p.packet_id) + _props(p.properties, p.type, version) + bytes(p.reason_codes)


def _encode_unsubscribe(p: Unsubscribe, version: int) -> bytes:
    filters = b"".join(utf8(f) for f in p.topic_filters)
    return uint16(p.packet_id) + _props(p.properties, p.type, version) + filters


def _encode_unsuback(p: UnsubAck, version: int) -> bytes:
    if version == MQTT_311 and p.reason_codes:
        raise ValueError("MQTT 3.1.1 UNSUBACK carries no reason codes")
    return uint16(p.packet_id) + _props(p.properties, p.type, version) + bytes(p.reason_codes)


def _encode_empty(p: PingReq | PingResp, version: int) -> bytes:
    return b""


def _encode_disconnect(p: Disconnect | Auth, version: int) -> bytes:
    if version == MQTT_311 and (p.reason_code or p.type is PacketType.AUTH):
        raise ValueError(f"MQTT 3.1.1 has no AUTH and no DISCONNECT reason: {p}")
    return _encode_reason_tail(p.reason_code, p.properties, p.type, version)


_ENCODERS: dict[PacketType, Callable[[Any, int], bytes]] = {
    PacketType.CONNECT: _encode_connect,
    PacketType.CONNACK: _encode_connack,
    PacketType.PUBLISH: _encode_publish,
    PacketType.PUBACK: _encode_pub_ack,
    PacketType.PUBREC: _encode_pub_ack,
    PacketType.PUBREL: _encode_pub_ack,
    PacketType.PUBCOMP: _encode_pub_ack,
    PacketType.SUBSCRIBE: _encode_subscribe,
    PacketType.SUBACK: _encode_suback,
    PacketType.UNSUBSCRIBE: _encode_unsubscribe,
    PacketType.UNSUBACK: _encode_unsuback,
    PacketType.PINGREQ: _encode_empty,
    PacketType.PINGRESP: _encode_empty,
    PacketType.DISCONNECT: _encode_disconnect,
    PacketType.AUTH: _encode_disconnect,
}


# ----------------------------------------------------------------------------- decoding


def _read_protocol(r: Reader) -> int:
    """Read CONNECT's protocol name and level; return the version they name."""
    name, level = r.utf8(), r.byte()
    if (name, level) in _PROTOCOLS:
        return _PROTOCOLS[name, level]
    if name in _KNOWN_NAMES:
        raise UnsupportedProtocolVersion(f"protocol {name} level {level} is not supported")
    raise MalformedPacket(f"unknown protocol name {name[:16]!r}")


def _packet_id(r: Reader) -> int:
    pid = r.uint16()
    if pid == 0:
        raise ProtocolError("packet identifier 0")
    return pid


def _read_props(r: Reader, context: Context, version: int) -> Properties:
    return decode_properties(r, context) if version == MQTT_5 else NO_PROPERTIES


def _reason(value: int, ptype: PacketType) -> ReasonCode:
    if value not in REASON_CODES_BY_PACKET[ptype]:
        raise ProtocolError(f"reason code {value:#04x} is not allowed in {ptype.name}")
    return ReasonCode(value)


def _topic_name(topic: str) -> str:
    if "+" in topic or "#" in topic:
        raise TopicNameInvalid(f"wildcard in topic name {topic[:64]!r}")
    return topic


def _decode_connect(r: Reader, flags: int, version: int) -> Connect:
    version = _read_protocol(r)
    bits = r.byte()
    will_flag, will_qos, will_retain = bool(bits & 0x04), bits >> 3 & 3, bool(bits & 0x20)
    has_password, has_username = bool(bits & 0x40), bool(bits & 0x80)
    if bits & 0x01:
        raise MalformedPacket("CONNECT reserved flag is set")
    if will_qos == 3 or (not will_flag and (will_qos or will_retain)):
        raise MalformedPacket("will QoS/retain inconsistent with the will flag")
    if version == MQTT_311 and has_password and not has_username:
        raise MalformedPacket("MQTT 3.1.1 password without user name")
    keep_alive = r.uint16()
    props = _read_props(r, PacketType.CONNECT, version)
    client_id = r.utf8()
    will = None
    if will_flag:
        will_props = _read_props(r, WILL, version)
        topic = _topic_name(r.utf8())
        if not topic:
            raise ProtocolError("empty will topic")
        will = Will(topic, r.binary(), will_qos, will_retain, will_props)
    username = r.utf8() if has_username else None
    password = r.binary() if has_password else None
    return Connect(client_id, bool(bits & 0x02), keep_alive, username, password, will, props)


def _decode_connack(r: Reader, flags: int, version: int) -> ConnAck:
    ack_flags, value = r.byte(), r.byte()
    if ack_flags & 0xFE:
        raise MalformedPacket("CONNACK reserved flags are set")
    if version == MQTT_311:
        if value not in _V311_CONNACK:
            raise ProtocolError(f"unknown CONNACK return code {value}")
        return ConnAck(bool(ack_flags), ConnectReturnCode(value))
    code = _reason(value, PacketType.CONNACK)
    return ConnAck(bool(ack_flags), code, decode_properties(r, PacketType.CONNACK))


def _decode_publish(r: Reader, flags: int, version: int) -> Publish:
    qos = flags >> 1 & 3
    topic = _topic_name(r.utf8())
    packet_id = _packet_id(r) if qos else None
    props = _read_props(r, PacketType.PUBLISH, version)
    if not topic and props.topic_alias is None:
        raise ProtocolError("empty topic name without a topic alias")
    return Publish(topic, r.rest(), qos, bool(flags & 1), bool(flags & 8), packet_id, props)


def _decode_reason_tail(r: Reader, ptype: PacketType, version: int) -> dict[str, Any]:
    """MQTT 5's optional reason code then properties, absent when the packet ends early."""
    if version == MQTT_311 or not r.remaining():
        return {}
    code = _reason(r.byte(), ptype)
    props = decode_properties(r, ptype) if r.remaining() else NO_PROPERTIES
    return {"reason_code": code, "properties": props}


def _pub_ack_decoder(cls: type[PubAck | PubRec | PubRel | PubComp]) -> Callable[..., Packet]:
    def decode(r: Reader, flags: int, version: int) -> Packet:
        return cls(_packet_id(r), **_decode_reason_tail(r, cls.type, version))
    return decode


def _decode_subscription(r: Reader, version: int) -> Subscription:
    topic_filter, options = r.utf8(), r.byte()
    qos, retain_handling = options & 3, options >> 4 & 3
    reserved = 0xFC if version == MQTT_311 else 0xC0
    if options & reserved or qos == 3:
        raise MalformedPacket("subscription options: reserved bits set or QoS 3")
    if retain_handling == 3:
        raise ProtocolError("retain handling 3")
    return Subscription(topic_filter, qos, bool(options & 4), bool(options & 8), retain_handling)


def _decode_subscribe(r: Reader, flags: int, version: int) -> Subscribe:
    packet_id = _packet_id(r)
    props = _read_props(r, PacketType.SUBSCRIBE, version)
    subs: list[Subscription] = []
    while r.remaining():
        subs.append(_decode_subscription(r, version))
    if not subs:
        raise ProtocolError("SUBSCRIBE without topic filters")
    return Subscribe(packet_id, tuple(subs), props)


def _decode_suback(r: Reader, flags: int, version: int) -> SubAck:
    packet_id = _packet_id(r)
    props = _read_props(r, PacketType.SUBACK, version)
    raw = r.rest()
    if version == MQTT_311:
        if not set(raw) <= _V311_SUBACK:
            raise ProtocolError("unknown SUBACK return code")
        return SubAck(packet_id, tuple(SubAckReturnCode(c) for c in raw))
    return SubAck(packet_id, tuple(_reason(c, PacketType.SUBACK) for c in raw), props)


def _decode_unsubscribe(r: Reader, flags: int, version: int) -> Unsubscribe:
    packet_id = _packet_id(r)
    props = _read_props(r, PacketType.UNSUBSCRIBE, version)
    filters: list[str] = []
    while r.remaining():
        filters.append(r.utf8())
    if not filters:
        raise ProtocolError("UNSUBSCRIBE without topic filters")
    return Unsubscribe(packet_id, tuple(filters), props)


def _decode_unsuback(r: Reader, flags: int, version: int) -> UnsubAck:
    packet_id = _packet_id(r)
    if version == MQTT_311:
        return UnsubAck(packet_id)
    props = decode_properties(r, PacketType.UNSUBACK)
    codes = tuple(_reason(c, PacketType.UNSUBACK) for c in r.rest())
    return UnsubAck(packet_id, codes, props)


def _empty_decoder(cls: type[PingReq | PingResp]) -> Callable[..., Packet]:
    def decode(r: Reader, flags: int, version: int) -> Packet:
        return cls()
    return decode


def _tail_decoder(cls: type[Disconnect | Auth]) -> Callable[..., Packet]:
    def decode(r: Reader, flags: int, version: int) -> Packet:
        return cls(**_decode_reason_tail(r, cls.type, version))
    return decode


_DECODERS: dict[PacketType, Callable[[Reader, int, int], Packet]] = {
    PacketType.CONNECT: _decode_connect,
    PacketType.CONNACK: _decode_connack,
    PacketType.PUBLISH: _decode_publish,
    PacketType.PUBACK: _pub_ack_decoder(PubAck),
    PacketType.PUBREC: _pub_ack_decoder(PubRec),
    PacketType.PUBREL: _pub_ack_decoder(PubRel),
    PacketType.PUBCOMP: _pub_ack_decoder(PubComp),
    PacketType.SUBSCRIBE: _decode_subscribe,
    PacketType.SUBACK: _decode_suback,
    PacketType.UNSUBSCRIBE: _decode_unsubscribe,
    PacketType.UNSUBACK: _decode_unsuback,
    PacketType.PINGREQ: _empty_decoder(PingReq),
    PacketType.PINGRESP: _empty_decoder(PingResp),
    PacketType.DISCONNECT: _tail_decoder(Disconnect),
    PacketType.AUTH: _tail_decoder(Auth),
}


class Decoder:
    """Incremental MQTT decoder: `feed()` bytes as they arrive, then call `next_packet()`
    until it returns None (a whole packet is not buffered yet).

    With `version=None` it is a server-side decoder: the first packet must be CONNECT, whose
    protocol level sets `version` for every later packet. An `MqttError` is final: the
    connection must close, every later `next_packet()` raises it again, and what was buffered
    is dropped.

    Every packet costs time linear in its size. `max_packet_size` (which the owner may change
    between packets) refuses a packet as soon as its fixed header announces more, before any of
    it is buffered beyond what already arrived; `max_user_properties` (None: any number) stops
    reading a property block at the first user property beyond it.
    """

    def __init__(self, version: int | None = None, max_packet_size: int = MAX_PACKET_SIZE,
                 max_user_properties: int | None = None) -> None:
        if version not in (None, *VERSIONS):
            raise ValueError(f"unsupported MQTT version {version}")
        self.version = version
        self.max_packet_size = max_packet_size
        self.max_user_properties = max_user_properties
        self._buffer = bytearray()
        self._error: MqttError | None = None

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Append received bytes to the buffer."""
        self._buffer += data

    def next_packet(self) -> Packet | None:
        """Return the next whole packet, or None if more bytes are needed."""
        if self._error is not None:
            raise self._error
        try:
            return self._next_packet()
        except MqttError as exc:
            self._error = exc
            self._buffer = bytearray()
            raise

    def _next_packet(self) -> Packet | None:
        buf = self._buffer
        if len(buf) > 2 and buf[0] in _SHORT_PUBLISH_FIRST and buf[1] < 0x80 and self.version:
            # A valid PUBLISH under 128 bytes (most telemetry): its first byte and one-byte
            # length need none of the checks below.
            end = 2 + buf[1]
            if end > self.max_packet_size or len(buf) < end:
                return self._next_packet_checked()
            return self._publish(buf[0] & 0x0F, 2, end)
        if len(buf) > 3 and buf[0] == 0x40 and buf[1] == 2 and self.version:  # a bare PUBACK
            packet_id = buf[2] << 8 | buf[3]
            if packet_id:
                del buf[:4]
                return PubAck(packet_id)
        return self._next_packet_checked()

    def _next_packet_checked(self) -> Packet | None:
        if not self._buffer:
            return None
        ptype, flags = self._check_first_byte(self._buffer[0])
        header = self._remaining_length()
        if header is None:
            return None
        offset, length = header
        if offset + length > self.max_packet_size:
            if self.version is None:  # a CONNECT: its answer can be in the client's version
                self.version = _peek_version(self._buffer, offset)
            raise PacketTooLarge(f"{offset + length}-byte packet exceeds {self.max_packet_size}")
        if len(self._buffer) < offset + length:
            return None
        if ptype is PacketType.PUBLISH:
            return self._publish(flags, offset, offset + length)
        if length == 2 and ptype in _SHORT_ACKS:  # a bare PUBACK/PUBREC/PUBCOMP: the hot path
            buf = self._buffer
            packet_id = buf[offset] << 8 | buf[offset + 1]
            if packet_id == 0:
                raise ProtocolError("packet identifier 0")
            del buf[:offset + 2]
            return _SHORT_ACKS[ptype](packet_id)
        body = bytes(self._buffer[offset : offset + length])
        del self._buffer[: offset + length]
        return self._parse(ptype, flags, body)

    def _publish(self, flags: int, start: int, end: int) -> Publish:
        """PUBLISH, the hot path: parsed straight from the buffer (same checks as `Reader`)."""
        buf = self._buffer
        if end - start < 2:
            raise MalformedPacket("packet ends inside a field")
        pos = start + 2 + (buf[start] << 8 | buf[start + 1])
        if pos > end:
            raise MalformedPacket("packet ends inside a field")
        try:
            topic = buf[start + 2:pos].decode()
        except UnicodeDecodeError as exc:
            raise MalformedPacket(f"invalid UTF-8: {exc.reason}") from None
        if "\x00" in topic:
            raise MalformedPacket("U+0000 in a UTF-8 string")
        _topic_name(topic)
        qos = flags >> 1 & 3
        packet_id = None
        if qos:
            if pos + 2 > end:
                raise MalformedPacket("packet ends inside a field")
            packet_id = buf[pos] << 8 | buf[pos + 1]
            if packet_id == 0:
                raise ProtocolError("packet identifier 0")
            pos += 2
        props = NO_PROPERTIES
        if self.version == MQTT_5:
            if pos < end and buf[pos] == 0:
                pos += 1
            else:
                reader = Reader(bytes(buf[pos:end]), self.max_user_properties)
                props = decode_properties(reader, PacketType.PUBLISH)
                pos = end - reader.remaining()
            if not topic and props.topic_alias is None:
                raise ProtocolError("empty topic name without a topic alias")
        elif not topic:
            raise ProtocolError("empty topic name without a topic alias")
        payload = bytes(buf[pos:end])
        del buf[:end]
        return Publish(topic, payload, qos, bool(flags & 1), bool(flags & 8), packet_id, props)

    def _check_first_byte(self, first: int) -> tuple[PacketType, int]:
        value, flags = first >> 4, first & 0x0F
        if value == 0 or (value == PacketType.AUTH and self.version == MQTT_311):
            raise MalformedPacket(f"reserved packet type {value}")
        ptype = _PACKET_TYPES[value]
        if self.version is None and ptype is not PacketType.CONNECT:
            raise ProtocolError(f"expected CONNECT first, got {ptype.name}")
        if ptype is PacketType.PUBLISH:
            if flags & 0b0110 == 0b0110:
                raise MalformedPacket("PUBLISH with QoS 3")
            if flags & 0b1000 and not flags & 0b0110:
                raise MalformedPacket("DUP set on a QoS 0 PUBLISH")
        elif flags != _FIXED_FLAGS.get(ptype, 0):
            raise MalformedPacket(f"{ptype.name} fixed-header flags {flags:#06b}")
        return ptype, flags

    def _remaining_length(self) -> tuple[int, int] | None:
        """Return (header size, remaining length), or None if the varint is incomplete."""
        value = 0
        for i in range(1, 5):
            if i >= len(self._buffer):
                return None
            b = self._buffer[i]
            value |= (b & 0x7F) << 7 * (i - 1)
            if not b & 0x80:
                return i + 1, value
        raise MalformedPacket("remaining length longer than 4 bytes")

    def _parse(self, ptype: PacketType, flags: int, body: bytes) -> Packet:
        reader = Reader(body, self.max_user_properties)
        version = _read_protocol(Reader(body)) if ptype is PacketType.CONNECT else self.version
        assert version is not None, "_check_first_byte lets only CONNECT through without one"
        if self.version is None:
            self.version = version
        packet = _DECODERS[ptype](reader, flags, version)
        if reader.remaining():
            raise MalformedPacket(f"{reader.remaining()} bytes after the end of {ptype.name}")
        return packet


def _peek_version(buffer: bytearray, offset: int) -> int | None:
    """The protocol version a CONNECT starting ``offset`` bytes into ``buffer`` names, if its
    protocol name and level have arrived and are ones this codec speaks."""
    start = offset + 2
    name = bytes(buffer[start:start + 4])
    if len(buffer) <= start + 4 or buffer[offset:start] != b"\x00\x04":
        return None
    return _PROTOCOLS.get((name.decode("ascii", "replace"), buffer[start + 4]))
