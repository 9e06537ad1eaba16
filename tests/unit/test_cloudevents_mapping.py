"""CloudEvents in every protocol's stored form (core.cloudevents, the adapters' mappings):
any valid event, stored as each protocol's publish stores it, is read back by ``event_of`` as
the same event, and rendered for a consumer of each other protocol it is read back the same
again; hostile stored values never raise; what is not an event is not taken for one."""
from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pamqp.commands import Basic

from core import cloudevents
from core.cloudevents import CloudEvent, event_of
from core.interop import AMQP_HEADERS, MQTT_USER_PROPERTIES
from protocols.amqp import mapping as amqp
from protocols.mqtt import mapping as mqtt
from protocols.mqtt.properties import Properties
from protocols.native.convert import with_event_properties

SETTINGS = settings(max_examples=200, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])
BORN_MS = 1_714_566_615_000

text = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1, max_size=40)
names = st.from_regex(r"[a-z0-9]{1,20}", fullmatch=True).filter(
    lambda name: name not in cloudevents.REQUIRED + cloudevents.OPTIONAL)
content_types = st.sampled_from(["application/json", "text/plain", "application/octet-stream",
                                 "application/vnd.example+json"])


@st.composite
def events(draw: st.DrawFn) -> CloudEvent:
    """A valid binary-mode event: required attributes, some optional ones, extensions, and
    data that the JSON event format carries back byte for byte."""
    attributes = {"id": draw(text), "source": draw(text), "type": draw(text),
                  "specversion": "1.0"}
    for name in ("subject", "dataschema"):
        if draw(st.booleans()):
            attributes[name] = draw(text)
    if draw(st.booleans()):
        attributes["time"] = "2024-05-01T12:30:15Z"
    attributes.update(draw(st.dictionaries(names, text, max_size=4)))
    content_type = draw(content_types)
    attributes["datacontenttype"] = content_type
    if cloudevents.is_json(content_type):
        value = draw(st.recursive(st.none() | st.booleans() | st.integers() | text,
                                  lambda inner: st.lists(inner, max_size=3)
                                  | st.dictionaries(text, inner, max_size=3), max_leaves=6))
        data = json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()
    elif content_type.startswith("text/"):
        data = draw(text).encode()
    else:
        data = draw(st.binary(max_size=64))
    return CloudEvent(attributes, data)


# ------------------------------------------------------------- each protocol's stored form


def native_stored(event: CloudEvent) -> dict[str, str]:
    return {**cloudevents.native_properties(event), "sluice.subject": "evt/a/b"}


def mqtt5_stored(event: CloudEvent) -> dict[str, str]:
    properties = Properties(content_type=event.content_type,
                            user_properties=tuple(cloudevents.user_properties(event)))
    return dict(mqtt.to_outgoing("evt", "evt/a/b", event.data, 1, False, "c1", properties,
                                 BORN_MS).properties)


def amqp_stored(event: CloudEvent) -> dict[str, str]:
    properties = Basic.Properties(content_type=event.content_type,
                                  headers=cloudevents.amqp_headers(event), delivery_mode=2)
    return dict(amqp.to_outgoing("evt", "evt/a/b", "amq.topic", "evt.a.b", properties,
                                 event.data, ()).properties)


def same(got: CloudEvent | None, sent: CloudEvent, structured: bool = False) -> None:
    assert got is not None
    assert (dict(got.attributes), got.data, got.structured) == \
        (dict(sent.attributes), sent.data, structured)


STORED = {"native": native_stored, "mqtt5": mqtt5_stored, "amqp": amqp_stored}


@SETTINGS
@given(events(), st.sampled_from(sorted(STORED)))
def test_an_event_stored_by_any_protocol_is_read_back_the_same(event, writer):
    same(event_of(STORED[writer](event), event.data), event)


@SETTINGS
@given(events())
def test_a_structured_event_is_read_back_the_same_from_any_protocol(event):
    body = cloudevents.to_structured(event)
    mqtt311 = dict(mqtt.to_outgoing("evt", "evt/a", body, 1, False, "c", Properties(), 0)
                   .properties)
    amqp_structured = amqp_stored(CloudEvent({}, body))
    amqp_structured["amqp.content_type"] = cloudevents.STRUCTURED_TYPE
    for stored in ({}, mqtt311, amqp_structured):
        same(event_of(stored, body), event, structured=True)


# ------------------------------------------------- rendered for another protocol's consumer


def amqp_rendered(stored: dict[str, str], body: bytes) -> CloudEvent | None:
    properties = amqp.to_properties(stored, BORN_MS, body)
    headers = [(name, value) for name, value in (properties.headers or {}).items()
               if isinstance(value, str)]
    return cloudevents.from_amqp_headers(headers, properties.content_type, body)


def mqtt_rendered(stored: dict[str, str], body: bytes) -> CloudEvent | None:
    inbound = mqtt.from_stored("evt", body, stored, BORN_MS)
    props = inbound.properties
    return cloudevents.from_user_properties(props.user_properties, props.content_type, body)


def native_rendered(stored: dict[str, str], body: bytes) -> CloudEvent | None:
    return cloudevents.from_native(with_event_properties(stored, body), body)


RENDERED = {"native": native_rendered, "mqtt5": mqtt_rendered, "amqp": amqp_rendered}


@SETTINGS
@given(events(), st.sampled_from(sorted(STORED)), st.sampled_from(sorted(RENDERED)))
def test_an_event_reaches_another_protocol_in_its_binding_intact(event, writer, reader):
    if writer == reader:
        return  # same protocol, same form: nothing is rendered
    stored = STORED[writer](event)
    same(RENDERED[reader](stored, event.data), event)


@SETTINGS
@given(events())
def test_mqtt311_subscribers_get_a_binary_event_in_structured_mode(event):
    for stored in (mqtt5_stored(event), native_stored(event), amqp_stored(event)):
        inbound = mqtt.from_stored("evt", event.data, stored, BORN_MS)
        same(cloudevents.from_structured(inbound.structured_payload()), event, structured=True)


@SETTINGS
@given(events())
def test_the_attributes_are_rendered_once(event):
    headers = amqp.to_properties(mqtt5_stored(event), BORN_MS, event.data).headers
    assert not set(headers) & set(event.attributes)
    users = mqtt.from_stored("evt", event.data, amqp_stored(event), BORN_MS) \
        .properties.user_properties
    assert not any(name.startswith("ce-") for name, _ in users)
    native = with_event_properties(amqp_stored(event), event.data)
    assert "specversion" not in native[AMQP_HEADERS]
    native = with_event_properties(mqtt5_stored(event), event.data)
    assert "specversion" not in native[MQTT_USER_PROPERTIES]


# -------------------------------------------------------------------- hostile and non-events

stored_names = st.sampled_from(["mqtt.qos", "mqtt.user_properties", "mqtt.content_type",
                                "amqp.exchange", "amqp.headers", "amqp.content_type",
                                "CE_id", "CE_specversion", "CE_contenttype", "ce_type",
                                "sluice.subject"]) | st.text(max_size=12)
hostile_values = st.text(max_size=60) | st.sampled_from([
    '[["specversion","1.0"],["id",""]]', '{"ce-specversion":"1.0","ce-id":{"$bytes":"!!"}}',
    '{"$table":{"ce-specversion":"1.0"}}', "[[1,2]]", "[" * 5000, "1.0",
    cloudevents.STRUCTURED_TYPE])
hostile_bodies = st.binary(max_size=80) | st.sampled_from([
    b'{"specversion":"1.0"}', b'{"specversion":"1.0","id":"1","source":"s","type":"t",'
    b'"data_base64":"!!"}', b'[' * 5000 + b'"specversion"', b' {"specversion":1.0}'])


@SETTINGS
@given(st.dictionaries(stored_names, hostile_values, max_size=6), hostile_bodies)
def test_hostile_stored_values_never_raise(stored, body):
    event = event_of(stored, body)
    assert event is None or event.attributes["specversion"] == "1.0"
    amqp.to_properties(stored, BORN_MS, body).marshal()
    inbound = mqtt.from_stored("evt", body, stored, BORN_MS)
    inbound.structured_payload()
    if "amqp.exchange" in stored or "mqtt.qos" in stored:
        with_event_properties(stored, body)


@SETTINGS
@given(events(), st.sampled_from(sorted(STORED)), st.sampled_from(["id", "source", "type"]))
def test_an_event_missing_a_required_attribute_is_no_event(event, writer, missing):
    incomplete = CloudEvent({k: v for k, v in event.attributes.items() if k != missing},
                            event.data)
    stored = STORED[writer](incomplete)
    assert event_of(stored, event.data) is None
    if writer != "amqp":  # its CE names stay ordinary headers for AMQP
        headers = amqp.to_properties(stored, BORN_MS, event.data).headers
        assert not any(name.startswith("ce-") for name in headers)


@SETTINGS
@given(st.dictionaries(text, text, max_size=5), st.binary(max_size=64))
def test_ordinary_messages_are_no_events(user_properties, body):
    stored = dict(mqtt.to_outgoing("t", "t/x", body, 1, False, "c", Properties(
        user_properties=tuple(user_properties.items())), 0).properties)
    assert event_of(stored, body) is None
    assert event_of({}, json.dumps(user_properties).encode()) is None


def test_a_json_object_without_specversion_is_not_parsed():
    """Telemetry costs a substring test, not a parse: no marker, no event."""
    assert not cloudevents.may_be_structured(b'{"t": 21.5, "id": "1", "source": "s"}')
    assert cloudevents.may_be_structured(b' {"specversion": "1.0"}')
