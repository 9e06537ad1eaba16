"""Valid MQTT client streams and the mutations both fuzzers apply to them; WebSocket upgrades
and frames carrying them.

``mutate(seed, version)`` is a pure function of its arguments: the same seed gives the same
bytes, so a case the live fuzzer reports can be replayed and turned into a unit test.
Mutations: bit flips, interesting bytes, truncation, random tails, length-field lies (a
remaining length or a string length rewritten), splices of two streams, and repeats of a
slice (huge counts: thousands of user properties, filters or packets).
"""
from __future__ import annotations

import os
import random
from collections.abc import Callable

from protocols.mqtt.codec import MQTT_5, MQTT_311, encode
from protocols.mqtt.packets import (Auth, Connect, Disconnect, PingReq, PubAck, PubComp, Publish,
                                    PubRec, PubRel, Subscribe, Subscription, Unsubscribe, Will)
from protocols.mqtt.properties import Properties, varint

USER, PASSWORD = "sluice", b"sluice"
_PROPS = Properties(content_type="text/plain", response_topic="r/1", correlation_data=b"c",
                    user_properties=(("k", "v"), ("k", "w")), message_expiry_interval=60,
                    payload_format_indicator=1)


def connects(version: int, client_id: str = "fuzz") -> list[bytes]:
    """CONNECTs that a broker with the default user accepts: plain, with a will, persistent."""
    v5 = version == MQTT_5
    will_props = Properties(will_delay_interval=1, user_properties=(("w", "1"),)) if v5 else Properties()
    props = Properties(session_expiry_interval=30, receive_maximum=10, topic_alias_maximum=4,
                       user_properties=(("a", "b"),)) if v5 else Properties()
    return [encode(packet, version) for packet in (
        Connect(client_id, True, 30, USER, PASSWORD),
        Connect(client_id, True, 30, USER, PASSWORD, Will("fuzz/will", b"gone", 1, False, will_props)),
        Connect(client_id, False, 30, USER, PASSWORD, None, props),
    )]


def session_packets(version: int, topic: str = "fuzz/t") -> list[bytes]:
    """Packets a connected client sends, one of each kind."""
    v5 = version == MQTT_5
    props = _PROPS if v5 else Properties()
    packets = [
        Publish(topic, b"payload"), Publish(topic, b"x" * 300, 1, packet_id=1, properties=props),
        Publish(topic, b"q2", 2, True, packet_id=2), Publish(topic + "/r", b"", 0, True),
        Subscribe(3, (Subscription(topic + "/#", 1), Subscription("$share/g/" + topic, 2),
                      Subscription("+/+/x", 0))),
        Unsubscribe(4, (topic + "/#", "nope")),
        PubAck(5), PubRec(6), PubRel(7), PubComp(8), PingReq(),
    ]
    if v5:
        packets += [Publish("", b"alias", 0, properties=Properties(topic_alias=1)),
                    Publish(topic, b"set", 0, properties=Properties(topic_alias=1)),
                    Auth(), Disconnect(properties=Properties(reason_string="bye"))]
    else:
        packets.append(Disconnect())
    return [encode(p, version) for p in packets]


CORPUS: list[tuple[int, bytes]] = [
    (version, connect + b"".join(session_packets(version)))
    for version in (MQTT_311, MQTT_5) for connect in connects(version)
]
"""Whole client streams: a CONNECT, then one packet of each kind."""
INTERESTING = (0x00, 0x01, 0x7F, 0x80, 0xC0, 0xFE, 0xFF)
LENGTHS = (0, 1, 2, 127, 128, 16_383, 16_384, 65_535, 2_097_151, 2_097_152, 268_435_455)


def _bitflip(rng: random.Random, data: bytearray, other: bytes) -> bytearray:
    for _ in range(rng.randint(1, 4)):
        i = rng.randrange(len(data))
        data[i] ^= 1 << rng.randrange(8)
    return data


def _interesting_byte(rng: random.Random, data: bytearray, other: bytes) -> bytearray:
    data[rng.randrange(len(data))] = rng.choice(INTERESTING)
    return data


def _truncate(rng: random.Random, data: bytearray, other: bytes) -> bytearray:
    return data[:rng.randrange(len(data))]


def _random_tail(rng: random.Random, data: bytearray, other: bytes) -> bytearray:
    return data + bytes(rng.randrange(256) for _ in range(rng.randint(1, 64)))


def _length_lie(rng: random.Random, data: bytearray, other: bytes) -> bytearray:
    """Rewrite a remaining length (a varint after a first byte) or a two-byte length."""
    i = rng.randrange(len(data))
    if rng.random() < 0.5:
        lie = varint(rng.choice(LENGTHS)) if rng.random() < 0.8 else b"\xff\xff\xff\xff\x7f"
        return data[:i + 1] + lie + data[i + 2:]
    value = rng.choice((0, 1, 0x7FFF, 0xFFFF, rng.randrange(65_536)))
    return data[:i] + value.to_bytes(2, "big") + data[i + 2:]


def _splice(rng: random.Random, data: bytearray, other: bytes) -> bytearray:
    return data[:rng.randrange(len(data) + 1)] + other[rng.randrange(len(other) + 1):]


def _repeat(rng: random.Random, data: bytearray, other: bytes) -> bytearray:
    """Repeat a short slice many times: huge property, filter or packet counts."""
    start = rng.randrange(len(data))
    piece = data[start:start + rng.randint(1, 16)]
    return data[:start] + piece * rng.choice((2, 10, 100, 1000, 5000)) + data[start:]


MUTATIONS: dict[str, Callable[[random.Random, bytearray, bytes], bytearray]] = {
    "bit flip": _bitflip, "interesting byte": _interesting_byte, "truncation": _truncate,
    "random tail": _random_tail, "length lie": _length_lie, "splice": _splice, "repeat": _repeat,
}


def mutate(seed: int, version: int | None = None, *, base: bytes | None = None,
           max_size: int = 64 << 10) -> bytes:
    """Mutate ``base`` (default: a corpus stream of ``version``, any if None) one to four
    times, keeping at most ``max_size`` bytes."""
    rng = random.Random(seed)
    streams = [data for v, data in CORPUS if version is None or v == version]
    data = bytearray(base if base is not None else rng.choice(streams))
    other = rng.choice(streams)
    for _ in range(rng.randint(1, 4)):
        if not data:
            data = bytearray(rng.choice(streams))
        data = MUTATIONS[rng.choice(list(MUTATIONS))](rng, data, other)[:max_size]
    return bytes(data)


WS_UPGRADE = ("GET {path} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\n"
              "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
              "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: mqtt\r\n\r\n")
"""A valid MQTT-over-WebSocket upgrade request (RFC 6455 4.1)."""


def ws_frame(payload: bytes, opcode: int = 0x2, fin: bool = True) -> bytes:
    """A masked client frame (RFC 6455 5.2)."""
    head = bytes([(0x80 if fin else 0) | opcode])
    n = len(payload)
    if n < 126:
        head += bytes([0x80 | n])
    elif n < 65_536:
        head += bytes([0x80 | 126]) + n.to_bytes(2, "big")
    else:
        head += bytes([0x80 | 127]) + n.to_bytes(8, "big")
    mask = os.urandom(4)
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def hostile_websocket(seed: int, host: str, path: str = "/mqtt") -> bytes:
    """A mutated upgrade request, or a valid one followed by frames (of any opcode, final or
    not, possibly mutated themselves) carrying mutated MQTT streams."""
    rng = random.Random(seed)
    upgrade = WS_UPGRADE.format(host=host, path=path).encode()
    if rng.random() < 0.4:
        return mutate(seed, base=upgrade, max_size=16 << 10)
    frames = b"".join(ws_frame(mutate(seed + i), rng.choice((0x0, 0x1, 0x2, 0x8, 0x9, 0xA, 0x3)),
                               rng.random() < 0.8) for i in range(rng.randint(1, 3)))
    if rng.random() < 0.5:
        frames = mutate(seed, base=frames, max_size=64 << 10)
    return upgrade + frames
