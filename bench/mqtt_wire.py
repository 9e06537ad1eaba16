"""The few MQTT 3.1.1 packets the MQTT benchmark's load generator and discard server need.

Standard library only, since it is imported by every spawned load process. Encoders build whole
packets as bytes, so the load path can pre-encode them once and only join and write them;
``split_packets`` walks a receive buffer and yields whole packets, and the load generator's
subscriber has its own inlined copy of that loop for speed.
"""
from __future__ import annotations

import struct
from collections.abc import Iterator

CONNECT, CONNACK, PUBLISH, PUBACK, SUBSCRIBE, SUBACK, PINGREQ, PINGRESP, DISCONNECT = 1, 2, 3, 4, 8, 9, 12, 13, 14

CONNACK_ACCEPTED = b"\x20\x02\x00\x00"
PINGRESP_PACKET = b"\xd0\x00"
DISCONNECT_PACKET = b"\xe0\x00"
PACKET_IDS = [struct.pack(">H", i) for i in range(65536)]
"""``PACKET_IDS[i]`` is packet identifier ``i`` as sent (0 is never used on the wire)."""


def varint(value: int) -> bytes:
    """``value`` as an MQTT remaining-length variable byte integer."""
    out = bytearray()
    while True:
        byte, value = value % 128, value // 128
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def utf8(text: str) -> bytes:
    data = text.encode()
    return struct.pack(">H", len(data)) + data


def _packet(first_byte: int, body: bytes) -> bytes:
    return bytes([first_byte]) + varint(len(body)) + body


USERNAME, PASSWORD = "bench", "bench-mqtt"
"""The default user ``bench/sluice_server.py`` makes Sluice create (given this password);
Mosquitto (anonymous allowed) ignores the credentials."""


def connect(client_id: str, keepalive: int = 0, clean: bool = True) -> bytes:
    """CONNECT, protocol level 4 (3.1.1), with ``USERNAME``/``PASSWORD``; keepalive 0 turns
    keep-alive off."""
    flags = (0x02 if clean else 0x00) | 0xC0
    return _packet(0x10, b"\x00\x04MQTT\x04" + bytes([flags]) + struct.pack(">H", keepalive)
                   + utf8(client_id) + utf8(USERNAME) + utf8(PASSWORD))


def subscribe(packet_id: int, filters: list[tuple[str, int]]) -> bytes:
    """SUBSCRIBE to each (topic filter, requested QoS)."""
    return _packet(0x82, PACKET_IDS[packet_id] + b"".join(utf8(f) + bytes([qos]) for f, qos in filters))


def suback(packet_id: int, granted: list[int]) -> bytes:
    return _packet(0x90, PACKET_IDS[packet_id] + bytes(granted))


def publish_head(topic: str, qos: int, payload_size: int) -> bytes:
    """A PUBLISH packet up to and including its topic name: QoS 0 packets are this plus the
    payload; QoS 1 ones are this, ``PACKET_IDS[id]``, then the payload."""
    body_size = 2 + len(topic.encode()) + (2 if qos else 0) + payload_size
    return bytes([0x30 | (qos << 1)]) + varint(body_size) + utf8(topic)


def publish(topic: str, payload: bytes, qos: int = 0, packet_id: int = 0) -> bytes:
    return publish_head(topic, qos, len(payload)) + (PACKET_IDS[packet_id] if qos else b"") + payload


def puback(packet_id: int) -> bytes:
    return b"\x40\x02" + PACKET_IDS[packet_id]


def split_packets(buffer: bytes | bytearray) -> tuple[list[tuple[int, int, memoryview]], int]:
    """The whole packets at the start of ``buffer`` as (type, flags, body), and how many bytes
    they took; a trailing partial packet is left for the next read."""
    view, packets, pos, size = memoryview(buffer), [], 0, len(buffer)
    while pos + 2 <= size:
        length, multiplier, index = 0, 1, pos + 1
        while True:
            if index >= size:
                return packets, pos
            byte = buffer[index]
            length += (byte & 0x7F) * multiplier
            multiplier *= 128
            index += 1
            if byte < 0x80:
                break
        end = index + length
        if end > size:
            break
        packets.append((buffer[pos] >> 4, buffer[pos] & 0x0F, view[index:end]))
        pos = end
    return packets, pos


def iter_publish(body: memoryview, qos: int) -> tuple[str, int, memoryview]:
    """(topic, packet id or 0, payload) of a PUBLISH body."""
    topic_size = int.from_bytes(body[:2], "big")
    topic = bytes(body[2:2 + topic_size]).decode()
    offset = 2 + topic_size
    packet_id = int.from_bytes(body[offset:offset + 2], "big") if qos else 0
    return topic, packet_id, body[offset + (2 if qos else 0):]


def subscribe_filters(body: memoryview) -> Iterator[tuple[str, int]]:
    """(topic filter, requested QoS) pairs of a SUBSCRIBE body (after its packet id)."""
    pos = 2
    while pos + 2 <= len(body):
        size = int.from_bytes(body[pos:pos + 2], "big")
        yield bytes(body[pos + 2:pos + 2 + size]).decode(), body[pos + 2 + size]
        pos += 3 + size
