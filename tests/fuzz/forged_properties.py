"""Forged namespaced properties and poison values, from every protocol, for both fuzzers.

Each protocol's own names travel in its own namespace (``amqp.*``, ``mqtt.*``, ``sluice.*``);
another protocol's sender may try to write them: a native send with ``amqp.headers`` (refused),
an MQTT 5 user property or an AMQP header named ``amqp.user_id`` or ``mqtt.qos`` (plain user
properties and headers). The values are the ones that broke conversions: a decimal with a huge
exponent, NaN, deep nesting, lone surrogates, numbers past 64 bits. Pure functions of a
``random.Random``: the same seed gives the same bytes.
"""
from __future__ import annotations

import random
from decimal import Decimal

from pamqp.commands import Basic, Channel

from protocols.amqp.frames import encode_content, encode_method
from protocols.mqtt.codec import MQTT_5, encode
from protocols.mqtt.packets import Connect, Publish
from protocols.mqtt.properties import Properties
from tests.fuzz.amqp_frames import handshake

FORGED_NAMES = ("amqp.headers", "amqp.user_id", "amqp.exchange", "amqp.routing_key",
                "amqp.delivery_mode", "amqp.timestamp", "amqp.priority", "mqtt.qos",
                "mqtt.retain", "mqtt.user_properties", "mqtt.correlation_data",
                "mqtt.expiry_at", "sluice.message_group", "sluice.lite", "sluice.timer.into",
                "sluice.timer.queue", "sluice.txn.topic", "sluice.dlq.origin_topic")
"""Names in the namespaces the broker writes, which no other protocol's sender may set."""
POISON_VALUES = (
    '{"x": {"$decimal": "1e400000"}}', '{"x": {"$decimal": "1e999999999999999999"}}',
    '{"x": {"$decimal": "NaN"}}', '{"x": {"$decimal": "-Infinity"}}', '{"x": NaN}',
    '{"x": 1e300}', '{"x": 1e400000}', '{"x": ' + "[" * 600 + "]" * 600 + "}",
    '{"x": "\\ud800"}', '{"\\udfff": 1}', '{"x": 123456789012345678901234567890}',
    '{"x": {"$time": -1}}', '{"x": {"$bytes": "!!"}}', '{"$table": 5}', "[" * 5000, "not json",
    "x", "7", "-1", "9" * 400, "é" * 300, '[["a", "\\ud800"]]', "%SYS%mqtt.retained\nfuzz",
)
"""Values that broke a conversion once, or could: as stored JSON and as plain text."""


def forged_properties(rng: random.Random, count: int = 3) -> dict[str, str]:
    """``count`` forged names, each with a poison value."""
    return {name: rng.choice(POISON_VALUES) for name in rng.sample(FORGED_NAMES, count)}


def own_properties(rng: random.Random, count: int = 3) -> dict[str, str]:
    """Names of the sender's own (no namespace), each with a poison value: stored and
    delivered to every protocol, where each conversion must stay bounded and not raise."""
    return {f"p{i}": rng.choice(POISON_VALUES) for i in range(count)}


def mqtt_publish(rng: random.Random, topic: str) -> bytes:
    """A valid MQTT 5 CONNECT and a QoS 1 PUBLISH to ``topic`` whose user properties carry
    forged names and poison values."""
    pairs = tuple(forged_properties(rng, rng.randint(1, 4)).items()) \
        + tuple(own_properties(rng, rng.randint(0, 2)).items())
    connect = Connect(f"forged-{rng.randrange(1 << 16)}", True, 30, "sluice", b"sluice")
    publish = Publish(topic, b"forged over mqtt", 1, packet_id=1,
                      properties=Properties(user_properties=pairs))
    return encode(connect, MQTT_5) + encode(publish, MQTT_5)


AMQP_VALUES = (Decimal("-2147483648E-255"), Decimal("2147483647"), Decimal("1E+9"),
               float("nan"), float("inf"), 3.0e38, -(1 << 63), (1 << 63) - 1, bytearray(b"\xff"),
               "\u0000", None, True, [[[[[[[[[[[]]]]]]]]]]])
"""Header values an AMQP publisher can send that another protocol must still take."""


def amqp_publish(rng: random.Random, routing_key: str) -> bytes:
    """A logged-in AMQP client's channel.open and a publish to ``amq.topic`` whose headers
    carry forged names and hostile values (pamqp encodes them all)."""
    headers: dict[str, object] = {name: rng.choice(POISON_VALUES)
                                  for name in rng.sample(FORGED_NAMES, rng.randint(1, 4))}
    headers.update({f"v{i}": rng.choice(AMQP_VALUES) for i in range(rng.randint(1, 4))})
    properties = Basic.Properties(headers=headers, delivery_mode=rng.choice((1, 2)))
    return (handshake() + encode_method(1, Channel.Open())
            + encode_content(1, Basic.Publish(exchange="amq.topic", routing_key=routing_key),
                             properties, b"forged over amqp", 131_072))
