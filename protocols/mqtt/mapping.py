"""How MQTT messages map onto core's: topics, properties, QoS (DESIGN.md, cross-protocol contract).

- The native topic is the MQTT topic's first level, escaped into a valid topic name:
  ``devices/d1/telemetry`` is stored in topic ``devices``; characters outside a topic name's
  alphabet (and ``%`` itself) become ``%XX`` per UTF-8 byte, an empty first level becomes
  ``%00`` (NUL never occurs in an MQTT topic, so the mapping stays reversible).
- The full MQTT topic travels as the core subject property; the QoS, retain flag and MQTT 5
  properties with no core counterpart travel as ``mqtt.*`` properties. Payload bytes never change.
- A message that did not come from MQTT (a native send) is delivered on its subject, or on its
  topic name when it has none, at QoS 1 (it was stored durably).
"""

from __future__ import annotations

import base64
import functools
import json
import time
from dataclasses import dataclass, replace
from typing import Final, Mapping

from core.model import SUBJECT_PROPERTY, OutgoingMessage

from .properties import NO_PROPERTIES, Properties

QOS_PROPERTY: Final = "mqtt.qos"
RETAIN_PROPERTY: Final = "mqtt.retain"
CLIENT_PROPERTY: Final = "mqtt.client"
"""The publishing client id (for the No Local subscription option)."""
EXPIRY_PROPERTY: Final = "mqtt.expiry_at"
"""Absolute expiry time in ms since the epoch (MQTT 5 Message Expiry Interval)."""
CONTENT_TYPE_PROPERTY: Final = "mqtt.content_type"
RESPONSE_TOPIC_PROPERTY: Final = "mqtt.response_topic"
CORRELATION_PROPERTY: Final = "mqtt.correlation_data"
"""Base64 of the binary correlation data."""
PAYLOAD_FORMAT_PROPERTY: Final = "mqtt.payload_format"
USER_PROPERTIES_PROPERTY: Final = "mqtt.user_properties"
"""JSON list of [name, value] pairs, in wire order (names may repeat)."""
NATIVE_QOS: Final = 1

_NAME_CHARS: Final = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.|")


@functools.lru_cache(maxsize=65_536)
def native_topic(mqtt_topic: str) -> str:
    """The core topic an MQTT topic is stored in: its first level, escaped."""
    first = mqtt_topic.split("/", 1)[0]
    if not first:
        return "%00"
    if all(c in _NAME_CHARS for c in first):
        return first
    return "".join(c if c in _NAME_CHARS else "".join(f"%{b:02X}" for b in c.encode())
                   for c in first)


def to_outgoing(topic: str, payload: bytes, qos: int, retain: bool, client_id: str,
                properties: Properties, now_ms: int) -> OutgoingMessage:
    """The core message for an MQTT PUBLISH."""
    props = {SUBJECT_PROPERTY: topic, QOS_PROPERTY: str(qos), CLIENT_PROPERTY: client_id}
    if retain:
        props[RETAIN_PROPERTY] = "1"
    if properties is not NO_PROPERTIES:
        if properties.message_expiry_interval is not None:
            props[EXPIRY_PROPERTY] = str(now_ms + properties.message_expiry_interval * 1000)
        if properties.content_type is not None:
            props[CONTENT_TYPE_PROPERTY] = properties.content_type
        if properties.response_topic is not None:
            props[RESPONSE_TOPIC_PROPERTY] = properties.response_topic
        if properties.correlation_data is not None:
            props[CORRELATION_PROPERTY] = base64.b64encode(properties.correlation_data).decode()
        if properties.payload_format_indicator is not None:
            props[PAYLOAD_FORMAT_PROPERTY] = str(properties.payload_format_indicator)
        if properties.user_properties:
            props[USER_PROPERTIES_PROPERTY] = json.dumps(properties.user_properties,
                                                         separators=(",", ":"))
    return OutgoingMessage(native_topic(topic), payload, properties=props, born_ts=now_ms)


@dataclass(slots=True)
class Inbound:
    """A stored message as an MQTT subscriber sees it, before per-subscription options."""

    topic: str
    payload: bytes
    qos: int
    retain: bool
    publisher: str
    expiry_at_ms: int | None
    properties: Properties

    def expired(self, now_ms: int) -> bool:
        return self.expiry_at_ms is not None and now_ms >= self.expiry_at_ms

    def properties_at(self, now_ms: int, subscription_ids: tuple[int, ...]) -> Properties:
        """The PUBLISH properties: remaining expiry in whole seconds, subscription ids."""
        props = self.properties
        if self.expiry_at_ms is None and not subscription_ids:
            return props
        remaining = None
        if self.expiry_at_ms is not None:
            remaining = max(1, -(-(self.expiry_at_ms - now_ms) // 1000))
        return replace(props, message_expiry_interval=remaining,
                       subscription_identifiers=subscription_ids)


def from_stored(topic_name: str, body: bytes, properties: Mapping[str, str]) -> Inbound:
    """What an MQTT subscriber gets for a stored message of core topic ``topic_name``."""
    get = properties.get
    expiry = get(EXPIRY_PROPERTY)
    mqtt_props = NO_PROPERTIES
    if CONTENT_TYPE_PROPERTY in properties or RESPONSE_TOPIC_PROPERTY in properties \
            or CORRELATION_PROPERTY in properties or PAYLOAD_FORMAT_PROPERTY in properties \
            or USER_PROPERTIES_PROPERTY in properties:
        correlation = get(CORRELATION_PROPERTY)
        payload_format = get(PAYLOAD_FORMAT_PROPERTY)
        users = get(USER_PROPERTIES_PROPERTY)
        mqtt_props = Properties(
            payload_format_indicator=int(payload_format) if payload_format else None,
            content_type=get(CONTENT_TYPE_PROPERTY),
            response_topic=get(RESPONSE_TOPIC_PROPERTY),
            correlation_data=base64.b64decode(correlation) if correlation else None,
            user_properties=tuple((k, v) for k, v in json.loads(users)) if users else ())
    qos = get(QOS_PROPERTY)
    return Inbound(get(SUBJECT_PROPERTY) or topic_name, body,
                   int(qos) if qos else NATIVE_QOS, get(RETAIN_PROPERTY) == "1",
                   get(CLIENT_PROPERTY, ""), int(expiry) if expiry else None, mqtt_props)


def now_ms() -> int:
    return int(time.time() * 1000)
