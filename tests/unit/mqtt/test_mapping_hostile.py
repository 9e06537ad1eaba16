"""Stored messages with hostile properties become MQTT deliveries without raising.

A native sender may store any ``mqtt.*`` property; ``from_stored`` must turn every such message
into a PUBLISH that encodes, in both versions, with bad values ignored and passed on as user
properties where they fit. Also: the first-level escaping of MQTT topics into core names.
"""
from __future__ import annotations

import json
import logging

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.model import SUBJECT_PROPERTY, TopicConfig
from core.subjects import topic_of_subject
from protocols.mqtt.codec import MQTT_5, MQTT_311, Decoder, encode
from protocols.mqtt.mapping import (CLIENT_PROPERTY, CONTENT_TYPE_PROPERTY, CORRELATION_PROPERTY,
                                    EXPIRY_PROPERTY, PAYLOAD_FORMAT_PROPERTY, QOS_PROPERTY,
                                    RESPONSE_TOPIC_PROPERTY, RETAIN_PROPERTY,
                                    USER_PROPERTIES_PROPERTY, from_stored,
                                    to_outgoing)
from protocols.mqtt.packets import Publish
from protocols.mqtt.properties import NO_PROPERTIES, Properties

MQTT_NAMES = [SUBJECT_PROPERTY, QOS_PROPERTY, RETAIN_PROPERTY, CLIENT_PROPERTY, EXPIRY_PROPERTY,
              CONTENT_TYPE_PROPERTY, RESPONSE_TOPIC_PROPERTY, CORRELATION_PROPERTY,
              PAYLOAD_FORMAT_PROPERTY, USER_PROPERTIES_PROPERTY]
NOW_MS = 1_700_000_000_000


def publish_bytes(topic_name: str, properties: dict[str, str], version: int) -> Publish:
    """What a subscriber of ``topic_name`` is sent for the stored message: the PUBLISH must
    encode (and decode back) with both versions (3.1.1 carries no properties)."""
    inbound = from_stored(topic_name, b"body", properties)
    packet = Publish(inbound.topic, inbound.payload, inbound.qos, inbound.retain, False,
                     7 if inbound.qos else None,
                     inbound.properties_at(NOW_MS, (3,)) if version == MQTT_5 else NO_PROPERTIES)
    decoder = Decoder(version)
    decoder.feed(encode(packet, version))
    decoded = decoder.next_packet()
    assert isinstance(decoded, Publish) and decoded.topic == inbound.topic
    return decoded


# one case per bad value the issue names, plus their neighbours
POISON = [
    (QOS_PROPERTY, "x"), (QOS_PROPERTY, "3"), (QOS_PROPERTY, "-1"), (QOS_PROPERTY, " 1"),
    (RETAIN_PROPERTY, "yes"), (EXPIRY_PROPERTY, "soon"), (EXPIRY_PROPERTY, "-5"),
    (EXPIRY_PROPERTY, "9" * 40), (EXPIRY_PROPERTY, "１２"),
    (USER_PROPERTIES_PROPERTY, "not json"), (USER_PROPERTIES_PROPERTY, '{"a": "b"}'),
    (USER_PROPERTIES_PROPERTY, "[[1, 2]]"), (USER_PROPERTIES_PROPERTY, '[["a"]]'),
    (USER_PROPERTIES_PROPERTY, '[["a", "\\u0000"]]'), (USER_PROPERTIES_PROPERTY, '[["\\ud800", "x"]]'),
    (USER_PROPERTIES_PROPERTY, "[" * 50_000), (CORRELATION_PROPERTY, "!!not base64!!"),
    (CORRELATION_PROPERTY, "QQ"), (PAYLOAD_FORMAT_PROPERTY, "7"), (PAYLOAD_FORMAT_PROPERTY, "300"),
    (CONTENT_TYPE_PROPERTY, "a\x00b"), (CONTENT_TYPE_PROPERTY, "x" * 70_000),
    (RESPONSE_TOPIC_PROPERTY, "replies/+"), (RESPONSE_TOPIC_PROPERTY, ""),
    (SUBJECT_PROPERTY, "devices/#"), (SUBJECT_PROPERTY, "devices/\x00"),
    (SUBJECT_PROPERTY, "d/" + "x" * 70_000),
]


@pytest.mark.parametrize("name, value", POISON, ids=[f"{n}={v[:12]!r}" for n, v in POISON])
@pytest.mark.parametrize("version", [MQTT_311, MQTT_5])
def test_each_bad_mqtt_property_is_ignored_and_the_message_still_delivered(name, value, version):
    """The message is delivered with its body, on its topic name (a bad subject) or subject,
    with the bad value not applied; MQTT 5 gets it as a user property when it fits one."""
    properties = {SUBJECT_PROPERTY: "devices/d1/cmd", name: value}
    decoded = publish_bytes("devices", properties, version)
    assert decoded.payload == b"body"
    assert decoded.topic == ("devices" if name == SUBJECT_PROPERTY else "devices/d1/cmd")
    if name == QOS_PROPERTY:
        assert decoded.qos == 1  # what a message without an MQTT QoS gets
    if version == MQTT_5:
        fits = "\x00" not in value and len(value.encode("utf-8", "replace")) <= 0xFFFF \
            and "\ud800" not in value
        assert ((name, value) in decoded.properties.user_properties) is fits


def test_valid_properties_still_apply():
    outgoing = to_outgoing("devices", "devices/d1/t", b"p", 2, True, "c1",
                           Properties(payload_format_indicator=1, message_expiry_interval=30,
                                      content_type="text/plain", response_topic="r/1",
                                      correlation_data=b"\x00\xff",
                                      user_properties=(("a", "1"), ("a", "2"))), NOW_MS)
    inbound = from_stored(outgoing.topic, b"p", outgoing.properties)
    assert (inbound.topic, inbound.qos, inbound.retain, inbound.publisher) == ("devices/d1/t", 2, True, "c1")
    assert inbound.expiry_at_ms == NOW_MS + 30_000
    props = inbound.properties
    assert (props.payload_format_indicator, props.content_type, props.response_topic,
            props.correlation_data, props.user_properties) == (
        1, "text/plain", "r/1", b"\x00\xff", (("a", "1"), ("a", "2")))


def test_a_far_expiry_is_capped_to_what_mqtt_can_say():
    inbound = from_stored("t", b"", {EXPIRY_PROPERTY: "9" * 16})
    assert inbound.properties_at(NOW_MS, ()).message_expiry_interval == 0xFFFFFFFF


def test_bad_values_are_logged_once_with_clipped_values(caplog):
    with caplog.at_level(logging.INFO, logger="protocols.mqtt.mapping"):
        for _ in range(100):
            from_stored("poison-log", b"", {QOS_PROPERTY: "q" * 60_000})
    lines = [r.getMessage() for r in caplog.records if "poison-log" in r.getMessage()]
    assert len(lines) == 1 and len(lines[0]) < 400


HOSTILE_TEXT = st.one_of(st.text(max_size=40), st.sampled_from(["x", "", "1", "-1", "[", "[[]]",
                                                                 "\x00", "\ud800", "a/+", "#"]),
                         st.builds(json.dumps, st.recursive(
                             st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                             lambda inner: st.lists(inner, max_size=3)
                             | st.dictionaries(st.text(max_size=4), inner, max_size=3),
                             max_leaves=10)))


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(st.sampled_from(MQTT_NAMES) | st.text(max_size=10), HOSTILE_TEXT, max_size=12),
       st.sampled_from(["devices", "%00", "a%2Fb"]))
def test_from_stored_is_total_and_always_encodes(properties, topic_name):
    """Whatever properties were stored, the subscriber's PUBLISH encodes in both versions."""
    for version in (MQTT_311, MQTT_5):
        publish_bytes(topic_name, properties, version)


@pytest.mark.parametrize("mqtt_topic, core_name", [
    ("devices/d1", "devices"), (".", "%2E"), ("..", "%2E%2E"), ("./x", "%2E"), ("../x/y", "%2E%2E"),
    ("...", "%2E%2E%2E"), (".a/b", ".a"), ("a.b/c", "a.b"), ("/x", "%00"), ("$SYS/x", "%24SYS"),
    ("%/x", "%25"),
])
def test_first_levels_map_to_valid_distinct_core_names(mqtt_topic, core_name):
    """Levels of dots only are escaped (core refuses them as names); every name is valid."""
    assert topic_of_subject(mqtt_topic) == core_name
    TopicConfig(core_name)
