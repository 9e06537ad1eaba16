"""The few MQTT 3.1.1 packets the MQTT benchmark's load generator and discard server need.

Standard library only, since it is imported by every spawned load process. Encoders build whole
packets as bytes, so the load path can pre-encode them once and only join and write them;
``split_packets`` walks a receive buffer and yields whole packets, and the load generator's
subscriber has its own inlined copy of that loop for speed.

The load generator's messages start their payload with a fixed header, so a subscriber can tell
whose message it got, which one, and when it was sent::

    offset  size  field
    0       1     publisher: the publisher's index in the run
    1       2     slot: the packet's position in the publisher's ring of pre-encoded packets
    3       4     base: the sequence number of the ring's slot 0 on this lap
    7       8     sent: time.monotonic_ns() just before the write that carried the message
    15      ...   filler up to the payload size

All big-endian. A message's sequence number (from 0, per publisher) is ``base + slot``. Base and
send time are the same for every message of one write, so ``Ring.take`` writes them into a
copy of a ring slice as byte columns (one strided slice assignment per byte, not per message).
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


PUBLISHER_AT, SLOT_AT, BASE_AT, SENT_AT, HEADER_SIZE = 0, 1, 3, 7, 15
"""Offsets of the load generator's payload header fields (see the module docstring), its size."""
MAX_RING = 65535
"""A ring's slot ``i`` is also its QoS 1 packet id ``i + 1``, so a ring has at most 65,535 slots."""


class Ring:
    """A publisher's pre-encoded PUBLISH packets, ``topics`` round-robin, all one size, which
    ``take`` copies out for given sequence numbers with their base and send time filled in."""

    def __init__(self, publisher: int, topics: tuple[str, ...], qos: int, payload_size: int,
                 slots: int = 1024) -> None:
        if payload_size < HEADER_SIZE:
            raise ValueError(f"payloads need at least {HEADER_SIZE} bytes for the header")
        heads = [publish_head(topic, qos, payload_size) for topic in topics]
        if len({len(head) for head in heads}) != 1:
            raise ValueError("a ring's topics must all encode to the same length")
        self.slots = min(MAX_RING, len(topics) * -(-slots // len(topics)))
        filler = bytes(i % 251 for i in range(payload_size - HEADER_SIZE))
        packets = [heads[slot % len(heads)] + (PACKET_IDS[slot + 1] if qos else b"")
                   + struct.pack(">BHIQ", publisher, slot, 0, 0) + filler for slot in range(self.slots)]
        self.packet_size = len(packets[0])
        self.payload_at = self.packet_size - payload_size
        self.packets = bytearray(b"".join(packets))

    def take(self, seq: int, count: int, sent_ns: int) -> bytes | bytearray:
        """The packets of sequence numbers ``seq`` .. ``seq + count - 1``, stamped ``sent_ns``."""
        chunks = []
        while count:
            slot = seq % self.slots
            n = min(count, self.slots - slot)
            chunk = self.packets[slot * self.packet_size:(slot + n) * self.packet_size]
            fields = (seq - slot).to_bytes(4, "big") + sent_ns.to_bytes(8, "big")
            if n < len(fields):  # fewer messages than field bytes: one slice per message is less work
                for at in range(self.payload_at + BASE_AT, len(chunk), self.packet_size):
                    chunk[at:at + len(fields)] = fields
            else:
                for k, byte in enumerate(fields, self.payload_at + BASE_AT):
                    chunk[k::self.packet_size] = bytes((byte,)) * n
            chunks.append(chunk)
            seq, count = seq + n, count - n
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)


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
