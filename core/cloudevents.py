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
from dataclasses import dataclass
from typing import Any, Final

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

def from_structured(body: bytes) -> CloudEvent | None:
    """The event a structured-mode body holds, or None."""
    if len(body) > MAX_STRUCTURED_BYTES or not body.lstrip()[:1] == b"{":
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
    return None if attributes is None else CloudEvent(attributes, data)


def from_native(properties: Mapping[str, str], body: bytes) -> CloudEvent | None:
    """The event of a native send or an HTTP ingress (RocketMQ ``CE_`` properties, or
    Kafka-style ``ce_`` ones), binary or structured."""
    content_type = properties.get(NATIVE_CONTENT_TYPE)
    for prefix in (NATIVE_PREFIX, KAFKA_PREFIX):
        if any(name.startswith(prefix) for name in properties):
            named = {name: value for name, value in properties.items() if name != NATIVE_CONTENT_TYPE}
            event = from_prefixed(named, (prefix,), body, content_type)
            if event is not None:
                return event
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
            return CloudEvent(attributes, body)
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
