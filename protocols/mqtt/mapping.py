"""How MQTT messages map onto core's: topics, properties, QoS (DESIGN.md, cross-protocol contract).

- The native topic is core's choice for the MQTT topic (``Broker.topic_of_subject``): its first
  level, escaped into a valid topic name (``devices/d1/telemetry`` is stored in topic
  ``devices``), unless a rule of the ``mqtt.topic_map`` setting names another (``core.topic_map``).
- The full MQTT topic travels as the core subject property; the QoS, retain flag and MQTT 5
  properties with no core counterpart travel as ``mqtt.*`` properties. Payload bytes never change.
- A message that did not come from MQTT (a native send) is delivered on its subject, or on its
  topic name when it has none, at QoS 1 (it was stored durably).
- A message published over AMQP is delivered with what MQTT has of its properties
  (``core.interop``): QoS 1 when persistent (delivery_mode 2) else 0, its expiration as message
  expiry, content type, correlation id, reply_to as response topic, headers as user properties
  in order, and its other AMQP properties as ``amqp.*`` user properties.
- CloudEvents (``core.cloudevents``): an event an AMQP publish or a native send carries is
  delivered in MQTT 5 binary mode, its attributes as user properties of their own names
  (instead of the headers or properties that carried them), ``datacontenttype`` as the
  Content Type; a structured one keeps its body, with Content Type
  ``application/cloudevents+json``. MQTT 3.1.1 has no properties: a subscriber on it gets a
  binary-mode event (an MQTT 5 publish's included) in structured mode, the one case where
  the payload is rewritten (``Inbound.structured_payload``).
- ``from_stored`` never raises, whatever a sender stored: an ``mqtt.*`` value MQTT itself would
  not have written (``mqtt.qos=x``, bad base64, a subject with wildcards) is ignored and passed
  on as a user property (its name, its value) when it can travel as one, else dropped; either
  way it is logged (once per topic and property per interval).
"""

from __future__ import annotations

import base64
import json
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Final, Mapping, TypeVar

from core import cloudevents, interop
from core.cloudevents import CloudEvent
from core.model import SUBJECT_PROPERTY, OutgoingMessage
from core.untrusted import DenialLog, clip

from .properties import NO_PROPERTIES, Properties

log = logging.getLogger(__name__)
T = TypeVar("T")

QOS_PROPERTY: Final = interop.MQTT_QOS
RETAIN_PROPERTY: Final = interop.MQTT_RETAIN
CLIENT_PROPERTY: Final = interop.MQTT_CLIENT
"""The publishing client id (for the No Local subscription option)."""
EXPIRY_PROPERTY: Final = interop.MQTT_EXPIRY_AT
"""Absolute expiry time in ms since the epoch (MQTT 5 Message Expiry Interval)."""
CONTENT_TYPE_PROPERTY: Final = interop.MQTT_CONTENT_TYPE
RESPONSE_TOPIC_PROPERTY: Final = interop.MQTT_RESPONSE_TOPIC
CORRELATION_PROPERTY: Final = interop.MQTT_CORRELATION
"""Base64 of the binary correlation data."""
PAYLOAD_FORMAT_PROPERTY: Final = interop.MQTT_PAYLOAD_FORMAT
USER_PROPERTIES_PROPERTY: Final = interop.MQTT_USER_PROPERTIES
"""JSON list of [name, value] pairs, in wire order (names may repeat)."""
NATIVE_QOS: Final = 1
MAX_WIRE_LENGTH: Final = 0xFFFF
"""Bytes of the longest MQTT string or binary field."""
MAX_EXPIRY_INTERVAL: Final = 0xFFFFFFFF

def to_outgoing(native_topic: str, topic: str, payload: bytes, qos: int, retain: bool,
                client_id: str, properties: Properties, now_ms: int) -> OutgoingMessage:
    """The core message for an MQTT PUBLISH to ``topic``, stored in ``native_topic``."""
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
    return OutgoingMessage(native_topic, payload, properties=props, born_ts=now_ms)


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
    encoded: dict[tuple[int, bool, bool, int | None], tuple[bytes, bytes]] | None = None
    """The PUBLISH encodings connections made of this delivery, shared by the sessions it
    reaches (`ServerConnection.publish`); None: not shared (a retained message)."""
    event: CloudEvent | None = None
    """A binary-mode CloudEvent, which subscribers without properties (MQTT 3.1.1) get in
    structured mode (``structured_payload``)."""
    _structured: bytes | None = field(default=None, init=False, repr=False)

    def structured_payload(self) -> bytes:
        """The payload for a subscriber without properties: the event in structured mode
        (made once, on first use), or the payload when this is no binary-mode event."""
        if self.event is None:
            return self.payload
        if self._structured is None:
            self._structured = cloudevents.to_structured(self.event)
        return self._structured

    def with_payload(self, payload: bytes) -> Inbound:
        """The same message view for another message with the same stored properties."""
        return Inbound(self.topic, payload, self.qos, self.retain, self.publisher,
                       self.expiry_at_ms, self.properties, {})

    def expired(self, now_ms: int) -> bool:
        return self.expiry_at_ms is not None and now_ms >= self.expiry_at_ms

    def properties_at(self, now_ms: int, subscription_ids: tuple[int, ...]) -> Properties:
        """The PUBLISH properties: remaining expiry in whole seconds, subscription ids."""
        props = self.properties
        if self.expiry_at_ms is None and not subscription_ids:
            return props
        remaining = None
        if self.expiry_at_ms is not None:
            remaining = min(MAX_EXPIRY_INTERVAL, max(1, -(-(self.expiry_at_ms - now_ms) // 1000)))
        return replace(props, message_expiry_interval=remaining,
                       subscription_identifiers=subscription_ids)


_MQTT_PROPERTIES: Final = frozenset({CONTENT_TYPE_PROPERTY, RESPONSE_TOPIC_PROPERTY,
                                     CORRELATION_PROPERTY, PAYLOAD_FORMAT_PROPERTY,
                                     USER_PROPERTIES_PROPERTY})
_invalid = DenialLog(log, interval_s=300.0, max_keys=1024)
"""Stored values MQTT cannot take, logged once per (topic, property) per interval."""


def from_stored(topic_name: str, body: bytes, properties: Mapping[str, str],
                born_ms: int = 0) -> Inbound:
    """What an MQTT subscriber gets for a stored message of core topic ``topic_name``,
    published at ``born_ms``. Never raises: see the module notes for what happens to values
    MQTT cannot take."""
    invalid: list[tuple[str, str]] = []
    topic = _value(properties, SUBJECT_PROPERTY, _subject, topic_name, invalid) or topic_name
    if interop.AMQP_EXCHANGE in properties and QOS_PROPERTY not in properties:
        return _from_amqp(topic, body, interop.common(properties, born_ms),
                          cloudevents.amqp_event(properties, body), invalid)
    qos = _value(properties, QOS_PROPERTY, _QOS.__getitem__, topic_name, invalid)
    retain = _value(properties, RETAIN_PROPERTY, _FLAG.__getitem__, topic_name, invalid)
    expiry = _value(properties, EXPIRY_PROPERTY, _expiry_at, topic_name, invalid)
    publisher = properties.get(CLIENT_PROPERTY, "")
    mqtt_props = NO_PROPERTIES
    if invalid or not _MQTT_PROPERTIES.isdisjoint(properties):
        def value(name: str, parse: Callable[[str], T]) -> T | None:
            return _value(properties, name, parse, topic_name, invalid)
        users = value(USER_PROPERTIES_PROPERTY, _user_properties) or ()
        mqtt_props = Properties(
            payload_format_indicator=value(PAYLOAD_FORMAT_PROPERTY, _FORMAT.__getitem__),
            content_type=value(CONTENT_TYPE_PROPERTY, _wire_text),
            response_topic=value(RESPONSE_TOPIC_PROPERTY, _topic_name),
            correlation_data=value(CORRELATION_PROPERTY, _binary),
            user_properties=users + tuple(invalid))
    if QOS_PROPERTY in properties:  # an MQTT publish: delivered as it came, but to MQTT 3.1.1
        event = cloudevents.mqtt_event(properties, body, structured=False)
    else:
        event = cloudevents.from_native(properties, body)
        if event is not None:
            mqtt_props = _with_event(mqtt_props, event)
    return Inbound(topic, body, NATIVE_QOS if qos is None else qos, bool(retain),
                   publisher if isinstance(publisher, str) else "", expiry, mqtt_props,
                   event=None if event is None or event.structured else event)


def born_independent(properties: Mapping[str, str]) -> bool:
    """Whether ``from_stored`` answers the same for these properties whatever ``born_ms`` is
    (anything but an AMQP publish), so its answer may be reused for another message."""
    return QOS_PROPERTY in properties or interop.AMQP_EXCHANGE not in properties


def same_view(properties: Mapping[str, str], body: bytes) -> bool:
    """Whether a message with ``properties`` and ``body`` gets the view (``from_stored``) of
    another with the same properties: unless it is a native send whose body may be a
    structured CloudEvent, which gets that event's content type."""
    return QOS_PROPERTY in properties or not cloudevents.may_be_structured(body)


def _from_amqp(topic: str, body: bytes, common: interop.Common, event: CloudEvent | None,
               invalid: list[tuple[str, str]]) -> Inbound:
    """An AMQP publish as MQTT sees it; what MQTT cannot take is left out."""
    users = _fitting(common.user_properties + common.extra)
    correlation = common.correlation
    properties = Properties(
        content_type=_fits(_wire_text, common.content_type),
        response_topic=_fits(_topic_name, common.reply_subject),
        correlation_data=correlation if correlation and len(correlation) <= MAX_WIRE_LENGTH
        else None,
        user_properties=users + tuple(invalid))
    if event is not None:
        properties = _with_event(properties, event)
    return Inbound(topic, body, 1 if common.persistent else 0, False, "", common.expiry_at_ms,
                   properties, event=None if event is None or event.structured else event)


def _with_event(properties: Properties, event: CloudEvent) -> Properties:
    """``properties`` with ``event`` in MQTT 5 binary mode (its attributes as user
    properties, in place of the ones that carried them), or a structured event's content
    type."""
    if event.structured:
        return replace(properties, content_type=properties.content_type
                       or cloudevents.STRUCTURED_TYPE)
    kept = tuple(pair for pair in properties.user_properties if pair[0] not in event.carried)
    return replace(properties, content_type=_fits(_wire_text, event.content_type),
                   user_properties=_fitting(cloudevents.user_properties(event)) + kept)


def _fitting(pairs: Iterable[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    """The (name, value) ``pairs`` MQTT can take as user properties."""
    return tuple(pair for pair in pairs if _fits(_wire_text, pair[0]) is not None
                 and _fits(_wire_text, pair[1]) is not None)


def _fits(parse: Callable[[str], str], value: str | None) -> str | None:
    """``value`` if MQTT can take it (``parse`` does not raise), else None."""
    if value is None:
        return None
    try:
        return parse(value)
    except ValueError:
        return None


def _value(properties: Mapping[str, str], name: str, parse: Callable[[str], T], topic_name: str,
           invalid: list[tuple[str, str]]) -> T | None:
    """``parse`` of property ``name``, or None when it is absent or MQTT cannot take it (then
    passed on in ``invalid`` and logged)."""
    raw = properties.get(name)
    if raw is None:
        return None
    try:
        if isinstance(raw, str):
            return parse(raw)
    except (ValueError, LookupError, RecursionError):  # base64 and Unicode errors included
        pass
    _pass_on(topic_name, name, raw, invalid)
    return None


_QOS: Final = {"0": 0, "1": 1, "2": 2}
_FLAG: Final = {"0": False, "1": True}
_FORMAT: Final = {"0": 0, "1": 1}


def _wire_text(raw: str) -> str:
    """``raw`` if it can travel as an MQTT UTF-8 string, else ValueError."""
    if "\x00" in raw or len(raw) > MAX_WIRE_LENGTH:
        raise ValueError("U+0000, or longer than an MQTT string")
    if not raw.isascii() and len(raw.encode()) > MAX_WIRE_LENGTH:  # lone surrogates raise here
        raise ValueError("longer than an MQTT string")
    return raw


def _topic_name(raw: str) -> str:
    """``raw`` if it is a valid MQTT topic name (no wildcards), else ValueError."""
    if not _wire_text(raw) or "+" in raw or "#" in raw:
        raise ValueError("not a topic name")
    return raw


def _subject(raw: str) -> str | None:
    """The subject as an MQTT topic name; None (the topic name applies) when empty."""
    return _topic_name(raw) if raw else None


def _expiry_at(raw: str) -> int:
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 16):
        raise ValueError("not a time in ms since the epoch")
    return int(raw)


def _binary(raw: str) -> bytes:
    data = base64.b64decode(raw, validate=True)
    if len(data) > MAX_WIRE_LENGTH:
        raise ValueError("longer than an MQTT binary field")
    return data


def _user_properties(raw: str) -> tuple[tuple[str, str], ...]:
    pairs = json.loads(raw)
    if not isinstance(pairs, list):
        raise ValueError("not a list of [name, value] pairs")
    out = []
    for pair in pairs:
        if not (isinstance(pair, list) and len(pair) == 2
                and isinstance(pair[0], str) and isinstance(pair[1], str)):
            raise ValueError("not a [name, value] pair of strings")
        out.append((_wire_text(pair[0]), _wire_text(pair[1])))
    return tuple(out)


def _pass_on(topic_name: str, name: str, raw: object, invalid: list[tuple[str, str]]) -> None:
    """Keep a value MQTT cannot take as a user property if it can travel as one; log it."""
    outcome = "dropped"
    if isinstance(raw, str):
        try:
            invalid.append((name, _wire_text(raw)))
            outcome = "passed on as a user property"
        except ValueError:
            pass
    _invalid.denied(topic_name, name, "a message in topic %s has %s=%s, which MQTT cannot "
                    "take: %s", clip(topic_name), name, clip(raw), outcome)


def now_ms() -> int:
    return int(time.time() * 1000)
