"""Hypothesis against every conversion of stored properties to a protocol: whatever a message
holds (an older version let native senders write any ``amqp.*``/``mqtt.*``/``sluice.*`` name,
with poison values: decimal bombs, NaN, deep nesting, lone surrogates in JSON, numbers past 64
bits), the AMQP content header marshals and decodes, the MQTT PUBLISH encodes, the native
Message builds and the neutral view (``core.interop``) is made, none raising; and the AMQP
header conversion looks at no more values than its bound.
"""
from __future__ import annotations

import json
import struct

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pamqp.commands import Basic
from pamqp.header import ContentHeader
from rocketmq.grpc_protocol import definition_pb2 as pb

from core import interop
from core.model import Delivery, MessageType
from protocols.amqp.field_values import MAX_ENTRIES, Conversion, field_table
from protocols.amqp.mapping import origin, properties_payload
from protocols.mqtt.codec import MQTT_5, MQTT_311
from protocols.native.convert import delivered
from tests.fuzz.forged_properties import FORGED_NAMES, POISON_VALUES
from tests.unit.mqtt.test_mapping_hostile import publish_bytes

STORED_TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)
"""What the store can hold: any UTF-8 text (it refuses lone surrogates on write)."""
ANY_TEXT = st.text(max_size=20)
"""Text inside JSON, where ``\\ud800`` escapes can put lone surrogates."""
DECIMAL_TEXT = st.one_of(
    st.decimals(allow_nan=True, allow_infinity=True).map(str),
    st.builds(lambda d, e: f"{d}E{e}", st.integers(-(1 << 40), 1 << 40),
              st.integers(-(1 << 70), 1 << 70)),
    ANY_TEXT)
LEAVES = st.one_of(
    st.none(), st.booleans(), st.integers(-(1 << 80), 1 << 80), st.floats(), ANY_TEXT,
    st.builds(lambda t: {"$decimal": t}, DECIMAL_TEXT),
    st.builds(lambda t: {"$bytes": t}, ANY_TEXT),
    st.builds(lambda t: {"$time": t}, st.integers(-(1 << 70), 1 << 70) | ANY_TEXT),
    st.integers(1, 80).map(lambda n: json.loads("[" * n + "]" * n)))  # past MAX_DEPTH
JSON_VALUES = st.recursive(
    LEAVES, lambda inner: st.one_of(
        st.lists(inner, max_size=5), st.dictionaries(ANY_TEXT, inner, max_size=5),
        st.builds(lambda t: {"$table": t}, st.dictionaries(ANY_TEXT, inner, max_size=3))),
    max_leaves=30)
STORED_JSON = JSON_VALUES.map(lambda v: json.dumps(v))  # ensure_ascii: surrogates as escapes
NAMES = st.one_of(st.sampled_from(FORGED_NAMES + ("amqp.headers", "amqp.content_type",
                                                  "amqp.type", "amqp.expiration",
                                                  "mqtt.content_type", "mqtt.response_topic",
                                                  "sluice.subject")),
                  STORED_TEXT)
VALUES = st.one_of(STORED_JSON, st.sampled_from(POISON_VALUES), STORED_TEXT)
STORED = st.dictionaries(NAMES, VALUES, max_size=10)
AMQP_STORED = STORED.map(lambda s: {**s, "amqp.exchange": s.get("amqp.exchange", "amq.topic")})
BORN = st.integers(-(1 << 63), (1 << 63) - 1)
TOPIC_NAMES = st.from_regex(r"[a-zA-Z0-9_%|.-]{0,19}[a-zA-Z0-9_%|-]", fullmatch=True)
"""Core topic names (``core.model.check_name``)."""
SETTINGS = settings(max_examples=250, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def amqp_delivery(stored: dict[str, str], born_ms: int) -> Basic.Properties:
    """What an AMQP consumer decodes for ``stored``; the exchange and key are short strings."""
    exchange, key = origin("topic", stored)
    assert len(exchange.encode()) <= 255 and len(key.encode()) <= 255
    header = ContentHeader()
    header.unmarshal(struct.pack(">HxxQ", Basic.frame_id, 0) + properties_payload(stored, born_ms))
    return header.properties


@SETTINGS
@given(AMQP_STORED | STORED, BORN)
def test_any_stored_properties_become_an_amqp_content_header(stored, born_ms):
    amqp_delivery(stored, born_ms)


@SETTINGS
@given(JSON_VALUES)
def test_any_stored_header_table_is_converted_within_its_bound(value):
    conversion = Conversion()
    table = field_table(json.loads(json.dumps({"h": value})), conversion)
    assert conversion.visited <= MAX_ENTRIES
    Basic.Properties(headers=table).marshal()


@SETTINGS
@given(st.lists(st.integers(0, 50), min_size=1, max_size=MAX_ENTRIES // 16), st.integers(1, 40))
def test_a_table_past_the_entry_bound_is_cut_at_it(widths, copies):
    table = {f"h{i}": list(range(width)) for i, width in enumerate(widths * copies)}
    conversion = Conversion()
    field_table(table, conversion)
    assert conversion.visited <= MAX_ENTRIES


@SETTINGS
@given(AMQP_STORED | STORED, TOPIC_NAMES, BORN)
def test_any_stored_properties_become_an_mqtt_publish(stored, topic_name, born_ms):
    for version in (MQTT_311, MQTT_5):
        publish_bytes(topic_name, stored, version)
    interop.common(stored, born_ms)


@SETTINGS
@given(AMQP_STORED | STORED, BORN)
def test_any_stored_message_becomes_a_native_message(stored, born_ms):
    message = Delivery("t", 0, 0, "id", b"body", "", (), stored, born_ms, born_ms)
    got = delivered(message, pb.Resource(name="t"), MessageType.NORMAL, "host", 0)
    assert got.SerializeToString() and dict(got.user_properties).items() <= stored.items()
