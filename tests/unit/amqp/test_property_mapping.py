"""Properties across protocols (DESIGN.md, cross-protocol contract): what the MQTT adapter
stores comes out of the AMQP one as AMQP properties and headers, and what the AMQP adapter
stores comes out of the MQTT one as MQTT 5 properties, each through the real mapping modules."""
from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st
from pamqp.commands import Basic

from core.clock import now_ms
from protocols.amqp.mapping import to_outgoing as amqp_outgoing
from protocols.amqp.mapping import origin, to_properties
from protocols.mqtt.mapping import from_stored
from protocols.mqtt.mapping import to_outgoing as mqtt_outgoing
from protocols.mqtt.properties import NO_PROPERTIES, Properties

BORN = 1_700_000_000_123


def mqtt_stored(qos: int = 1, properties: Properties = NO_PROPERTIES,
                client: str = "sensor-1", born: int = BORN) -> dict[str, str]:
    return dict(mqtt_outgoing("devices", "devices/d1/telemetry", b"p", qos, False, client,
                              properties, born).properties)


def amqp_stored(properties: Basic.Properties, key: str = "devices.d1.telemetry") -> dict[str, str]:
    return dict(amqp_outgoing("devices", "devices/d1/telemetry", "amq.topic", key, properties,
                              b"p", ()).properties)


def test_an_mqtt5_publish_as_amqp_properties():
    stored = mqtt_stored(1, Properties(
        message_expiry_interval=3600, content_type="application/json",
        response_topic="devices/d1/replies", correlation_data=b"req-7",
        payload_format_indicator=1,
        user_properties=(("site", "berlin"), ("unit", "C"), ("site", "paris"))))
    got = to_properties(stored, BORN)
    assert got.delivery_mode == 2
    assert got.content_type == "application/json"
    assert got.correlation_id == "req-7"
    assert got.reply_to == "devices.d1.replies"
    assert got.timestamp == datetime.fromtimestamp(BORN // 1000, UTC)
    assert got.expiration == "0", "expired long ago"
    assert got.headers == {"site": ["berlin", "paris"], "unit": "C", "x-mqtt-publish-qos": 1,
                           "mqtt.client_id": "sensor-1", "mqtt.payload_format": "1"}


def test_expiry_is_what_remains_in_ms_and_qos0_is_transient():
    born = now_ms()
    got = to_properties(mqtt_stored(0, Properties(message_expiry_interval=60), born=born), born)
    assert got.delivery_mode == 1 and got.headers["x-mqtt-publish-qos"] == 0
    assert 55_000 <= int(got.expiration) <= 60_000


def test_binary_correlation_data_survives_as_a_header():
    got = to_properties(mqtt_stored(2, Properties(correlation_data=b"\xff\x00")), BORN)
    assert got.correlation_id is None
    assert got.headers["mqtt.correlation_data"] == bytearray(b"\xff\x00")


def test_a_native_send_is_persistent_with_its_own_properties_as_headers():
    got = to_properties({"sluice.subject": "devices/n1/telemetry", "site": "oslo"}, BORN)
    assert (got.delivery_mode, got.headers) == (2, {"site": "oslo"})


def test_an_amqp_publish_as_mqtt5_properties():
    stored = amqp_stored(Basic.Properties(
        delivery_mode=2, expiration="60000", content_type="text/plain", correlation_id="c-9",
        reply_to="devices.d1.replies", message_id="m-1", app_id="shop",
        timestamp=datetime(2024, 5, 1, tzinfo=UTC),
        headers={"tenant": "acme", "n": 3, "ok": True, "raw": bytearray(b"xy")}))
    inbound = from_stored("devices", b"p", stored, BORN)
    assert (inbound.topic, inbound.qos, inbound.retain) == ("devices/d1/telemetry", 1, False)
    assert inbound.expiry_at_ms == BORN + 60_000
    props = inbound.properties
    assert (props.content_type, props.correlation_data, props.response_topic) == \
        ("text/plain", b"c-9", "devices/d1/replies")
    assert props.user_properties == (
        ("tenant", "acme"), ("n", "3"), ("ok", "true"), ("raw", "xy"),
        ("amqp.message_id", "m-1"), ("amqp.app_id", "shop"), ("amqp.timestamp", "1714521600"))


def test_a_transient_amqp_publish_is_qos0_and_has_no_properties_to_speak_of():
    inbound = from_stored("devices", b"p", amqp_stored(Basic.Properties()), BORN)
    assert (inbound.qos, inbound.expiry_at_ms, inbound.properties.user_properties) == (0, None, ())


NAMES = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
                min_size=1, max_size=8)
VALUES = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
                 max_size=8)


@given(st.lists(st.tuples(NAMES.filter(lambda n: n.partition(".")[0] not in
                                       ("mqtt", "x-mqtt-publish-qos")), VALUES), max_size=6))
def test_user_properties_become_headers_with_repeated_names_in_order(pairs):
    headers = to_properties(mqtt_stored(1, Properties(user_properties=tuple(pairs))),
                            BORN).headers
    for name in {n for n, _ in pairs}:
        values = [v for n, v in pairs if n == name]
        assert headers[name] == (values if len(values) > 1 else values[0])


@given(st.dictionaries(NAMES, VALUES, max_size=6))
def test_string_headers_become_user_properties_in_order(headers):
    inbound = from_stored("devices", b"p", amqp_stored(Basic.Properties(headers=headers)), BORN)
    assert list(inbound.properties.user_properties) == list(headers.items())


BOMB = '{"x": {"$decimal": "1e400000"}}'


def test_an_mqtt_user_property_named_like_an_amqp_property_stays_a_header():
    """User properties travel inside ``mqtt.user_properties``: one named ``amqp.headers`` or
    ``amqp.user_id`` is a plain header to AMQP consumers, never the AMQP property."""
    stored = mqtt_stored(1, Properties(user_properties=(
        ("amqp.headers", BOMB), ("amqp.user_id", "admin"), ("amqp.exchange", "billing"))))
    assert "amqp.headers" not in stored and "amqp.user_id" not in stored
    got = to_properties(stored, BORN)
    assert got.user_id is None
    assert got.headers["amqp.headers"] == BOMB and got.headers["amqp.user_id"] == "admin"
    assert origin("devices", stored) == ("amq.topic", "devices.d1.telemetry")
    got.marshal()


def test_an_amqp_header_named_like_an_mqtt_property_stays_a_user_property():
    stored = amqp_stored(Basic.Properties(delivery_mode=1, headers={
        "mqtt.qos": "2", "mqtt.retain": "1", "sluice.subject": "secret/x"}))
    assert stored["sluice.subject"] == "devices/d1/telemetry"
    inbound = from_stored("devices", b"p", stored, BORN)
    assert (inbound.topic, inbound.qos, inbound.retain) == ("devices/d1/telemetry", 0, False)
    assert inbound.properties.user_properties == (
        ("mqtt.qos", "2"), ("mqtt.retain", "1"), ("sluice.subject", "secret/x"))
