"""CloudEvents 1.0 in the cross-protocol contract: recognising an event in any protocol's
stored form, in neutral terms every adapter renders in its own protocol's binding.

A message is stored as it arrived (DESIGN.md, cross-protocol contract); this module reads the
CloudEvents attributes back out of whichever form that was:

- native sends and HTTP ingress: RocketMQ binding properties ``CE_<attribute>`` (the data
  content type as ``CE_contenttype``), or Kafka-style ``ce_<attribute>`` properties;
- MQTT 5: the attribute names themselves as user properties, the data content type as the
  Content Type (binary mode);
- AMQP 0-9-1: headers ``ce-<attribute>`` (the RabbitMQ binding the official SDK speaks), or
  ``cloudEvents_<attribute>`` / ``cloudEvents:<attribute>`` (the AMQP 1.0 binding's names),
  the data content type as the ``content_type`` property (binary mode);
- any protocol, structured mode: a body that is one JSON event (``application/cloudevents+json``
  as the content type, or, where the protocol has none, as MQTT 3.1.1 has not, a JSON object
  holding ``specversion``).

An event is a ``CloudEvent``: its context attributes as text (``time`` in RFC 3339, as it
travelled) and its data as bytes. Nothing here raises on hostile stored values: what does not
form a valid event is not one.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Final

from .interop import (AMQP_CONTENT_TYPE, AMQP_EXCHANGE, AMQP_HEADERS, MQTT_CONTENT_TYPE,
                      MQTT_QOS, MQTT_USER_PROPERTIES, stored_headers, stored_user_properties)

SPECVERSION: Final = "1.0"
REQUIRED: Final = ("id", "source", "specversion", "type")
"""Attributes every event has."""
OPTIONAL: Final = ("datacontenttype", "dataschema", "subject", "time")
"""The spec's optional attributes; every other attribute is an extension."""
STRUCTURED_TYPE: Final = "application/cloudevents+json"
BATCH_TYPE: Final = "application/cloudevents-batch+json"
NATIVE_PREFIX: Final = "CE_"
"""RocketMQ binding: the stored (and native-delivered) property prefix."""
NATIVE_CONTENT_TYPE: Final = "CE_contenttype"
KAFKA_PREFIX: Final = "ce_"
AMQP_PREFIX: Final = "ce-"
AMQP_1_PREFIXES: Final = ("cloudEvents_", "cloudEvents:")
MAX_ATTRIBUTES: Final = 64
"""Attributes (extensions included) one event may carry; more and it is not taken as one."""
MAX_STRUCTURED_BYTES: Final = 1 << 20
"""Bodies longer than this are not parsed as structured events."""

_NAME = re.compile(r"[a-z0-9]{1,20}\Z")
_MARKER: Final = b'"specversion"'


def is_attribute_name(name: str) -> bool:
    """Whether ``name`` is a valid context attribute name (lower-case ASCII letters and
    digits, 1-20 characters; the spec's ``datacontenttype`` and ``specversion`` included)."""
    return _NAME.match(name) is not None


@dataclass(frozen=True, slots=True)
class CloudEvent:
    """One event: context attributes as text, in order, and the data as bytes."""

    attributes: Mapping[str, str]
    data: bytes = b""
    structured: bool = False
    """It arrived in structured mode (the stored body is the JSON envelope)."""
    carried: frozenset[str] = field(default=frozenset(), compare=False)
    """The names of the stored properties, user properties or headers its attributes were
    read from: a consumer of another protocol gets them once, in its own binding, not also
    as they were stored."""

    @property
    def id(self) -> str:
        return self.attributes["id"]

    @property
    def content_type(self) -> str | None:
        return self.attributes.get("datacontenttype")

    def extensions(self) -> dict[str, str]:
        """The attributes the spec does not define."""
        return {name: value for name, value in self.attributes.items()
                if name not in REQUIRED and name not in OPTIONAL}


def valid_attributes(pairs: Iterable[tuple[str, str]]) -> dict[str, str] | None:
    """The attributes of ``pairs`` as a dict when they form an event's context (every required
    attribute present and non-empty, specversion 1.0, valid names, at most MAX_ATTRIBUTES),
    else None. Names not valid as attribute names are left out, not fatal."""
    attributes: dict[str, str] = {}
    for name, value in pairs:
        if is_attribute_name(name) and isinstance(value, str):
            attributes[name] = value
            if len(attributes) > MAX_ATTRIBUTES:
                return None
    if any(not attributes.get(name) for name in REQUIRED):
        return None
    if attributes["specversion"] != SPECVERSION:
        return None
    return attributes


# --- structured mode (JSON event format) ---

def may_be_structured(body: bytes) -> bool:
    """Whether ``body`` may hold a structured-mode event: a JSON object naming a
    ``specversion`` member. A substring test, so that ordinary messages (JSON telemetry
    included) are told apart without parsing them."""
    return _MARKER in body and body.lstrip()[:1] == b"{"


def from_structured(body: bytes) -> CloudEvent | None:
    """The event a structured-mode body holds, or None."""
    if len(body) > MAX_STRUCTURED_BYTES or not may_be_structured(body):
        return None
    try:
        envelope = json.loads(body)
    except (ValueError, RecursionError):
        return None
    return from_envelope(envelope)


def from_envelope(envelope: Any) -> CloudEvent | None:
    """The event of a decoded JSON event object, or None."""
    if not isinstance(envelope, dict):
        return None
    pairs = [(name, _attribute_text(value)) for name, value in envelope.items()
             if name not in ("data", "data_base64")]
    attributes = valid_attributes((name, value) for name, value in pairs if value is not None)
    if attributes is None:
        return None
    if "data_base64" in envelope:
        try:
            data = base64.b64decode(envelope["data_base64"], validate=True)
        except (binascii.Error, ValueError, TypeError):
            return None
    elif "data" in envelope:
        data = _data_bytes(envelope["data"], attributes.get("datacontenttype"))
    else:
        data = b""
    return CloudEvent(attributes, data, structured=True)


def to_structured(event: CloudEvent) -> bytes:
    """The event in the JSON event format: data as JSON when the content type is JSON (or
    absent) and the data parses, as a string when it is text, else as ``data_base64``."""
    envelope: dict[str, Any] = dict(event.attributes)
    if event.data:
        content_type = event.content_type
        if is_json(content_type):
            try:
                envelope["data"] = json.loads(event.data)
            except (ValueError, RecursionError):
                envelope["data_base64"] = base64.b64encode(event.data).decode()
        elif content_type is not None and content_type.startswith("text/"):
            try:
                envelope["data"] = event.data.decode()
            except UnicodeDecodeError:
                envelope["data_base64"] = base64.b64encode(event.data).decode()
        else:
            envelope["data_base64"] = base64.b64encode(event.data).decode()
    return json.dumps(envelope, ensure_ascii=False, separators=(",", ":")).encode()


def is_json(content_type: str | None) -> bool:
    """Whether data of ``content_type`` is JSON (absent counts as JSON, as the format says)."""
    if content_type is None:
        return True
    media = content_type.partition(";")[0].strip().lower()
    return media == "application/json" or media.endswith("+json") or media == "text/json"


def _data_bytes(data: Any, content_type: str | None) -> bytes:
    if isinstance(data, str) and not is_json(content_type):
        return data.encode()
    return json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode()


def _attribute_text(value: Any) -> str | None:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (str, int)):
        return str(value)
    return None


# --- binary mode, per stored form ---

def from_prefixed(properties: Mapping[str, str], prefixes: Iterable[str], data: bytes,
                  content_type: str | None) -> CloudEvent | None:
    """A binary-mode event whose attributes are the ``properties`` named with one of
    ``prefixes`` (the prefix stripped), or None."""
    prefixes = tuple(prefixes)
    pairs = [(name[len(prefix):], value) for name, value in properties.items()
             for prefix in prefixes if name.startswith(prefix)]
    if content_type is not None:
        pairs.append(("datacontenttype", content_type))
    attributes = valid_attributes(pairs)
    if attributes is None:
        return None
    carried = frozenset(name for name in properties for prefix in prefixes
                        if name.startswith(prefix) and is_attribute_name(name[len(prefix):]))
    return CloudEvent(attributes, data, carried=carried)


def from_native(properties: Mapping[str, str], body: bytes) -> CloudEvent | None:
    """The event of a native send or an HTTP ingress (RocketMQ ``CE_`` properties, or
    Kafka-style ``ce_`` ones), binary or structured."""
    content_type = properties.get(NATIVE_CONTENT_TYPE)
    if content_type is not None and content_type.startswith(STRUCTURED_TYPE):
        return from_structured(body)
    for prefix in (NATIVE_PREFIX, KAFKA_PREFIX):
        if any(name.startswith(prefix) for name in properties):
            named = {name: value for name, value in properties.items() if name != NATIVE_CONTENT_TYPE}
            event = from_prefixed(named, (prefix,), body, content_type)
            if event is not None:
                return event if content_type is None else \
                    replace(event, carried=event.carried | {NATIVE_CONTENT_TYPE})
    return from_structured(body)


def native_properties(event: CloudEvent) -> dict[str, str]:
    """The event's attributes as RocketMQ binding properties (``CE_id``, ``CE_contenttype``)."""
    return {NATIVE_CONTENT_TYPE if name == "datacontenttype" else NATIVE_PREFIX + name: value
            for name, value in event.attributes.items()}


def from_user_properties(pairs: Iterable[tuple[str, str]], content_type: str | None,
                         body: bytes) -> CloudEvent | None:
    """The event of an MQTT publish: binary mode when its user properties name a
    ``specversion``, structured when its content type says so or, lacking one, its body is a
    JSON event."""
    pairs = list(pairs)
    if any(name == "specversion" for name, _ in pairs):
        with_type = pairs + ([("datacontenttype", content_type)] if content_type else [])
        attributes = valid_attributes(with_type)
        if attributes is not None:
            carried = frozenset(name for name, _ in pairs if name in attributes)
            return CloudEvent(attributes, body, carried=carried)
    if content_type is None or content_type.startswith(STRUCTURED_TYPE):
        return from_structured(body)
    return None


def from_amqp_headers(headers: Iterable[tuple[str, str]], content_type: str | None,
                      body: bytes) -> CloudEvent | None:
    """The event of an AMQP 0-9-1 publish: ``ce-`` headers (or the AMQP 1.0 binding's
    ``cloudEvents_``/``cloudEvents:``), else structured by content type."""
    table = dict(headers)
    if content_type is not None and content_type.startswith(STRUCTURED_TYPE):
        return from_structured(body)
    for prefixes in ((AMQP_PREFIX,), AMQP_1_PREFIXES):
        if any(name.startswith(prefixes) for name in table):
            event = from_prefixed(table, prefixes, body, content_type)
            if event is not None:
                return event
    return None


def user_properties(event: CloudEvent) -> list[tuple[str, str]]:
    """MQTT 5 binary mode: each attribute but ``datacontenttype`` (the Content Type property)
    as a user property of its own name."""
    return [(name, value) for name, value in event.attributes.items()
            if name != "datacontenttype"]


def amqp_headers(event: CloudEvent) -> dict[str, str]:
    """The RabbitMQ binding: each attribute but ``datacontenttype`` (the ``content_type``
    property) as a ``ce-<attribute>`` header."""
    return {AMQP_PREFIX + name: value for name, value in event.attributes.items()
            if name != "datacontenttype"}


# --- by writer ---

def event_of(stored: Mapping[str, str], body: bytes) -> CloudEvent | None:
    """The event a stored message is, or None, read the way its writer stores events: an
    AMQP publish (``amqp.exchange``), an MQTT publish (``mqtt.qos``), else a native send or
    an HTTP ingress. A message with no CloudEvents marker costs a few look-ups and one
    substring test of its body, never a parse."""
    if AMQP_EXCHANGE in stored:
        return amqp_event(stored, body)
    if MQTT_QOS in stored:
        return mqtt_event(stored, body)
    return from_native(stored, body)


def mqtt_event(stored: Mapping[str, str], body: bytes, structured: bool = True) -> CloudEvent | None:
    """The event of a stored MQTT publish; binary mode only unless ``structured``."""
    raw = stored.get(MQTT_USER_PROPERTIES)
    pairs = stored_user_properties(raw) if raw is not None and "specversion" in raw else ()
    if not pairs and not structured:
        return None
    event = from_user_properties(pairs, stored.get(MQTT_CONTENT_TYPE), body)
    return None if event is not None and event.structured and not structured else event


def amqp_event(stored: Mapping[str, str], body: bytes) -> CloudEvent | None:
    """The event of a stored AMQP publish: structured by its content type, else binary when
    a header names a ``specversion``."""
    content_type = stored.get(AMQP_CONTENT_TYPE)
    if content_type is not None and content_type.startswith(STRUCTURED_TYPE):
        return from_structured(body)
    raw = stored.get(AMQP_HEADERS)
    if raw is None or "specversion" not in raw:
        return None
    return from_amqp_headers(stored_headers(raw), content_type, body)
