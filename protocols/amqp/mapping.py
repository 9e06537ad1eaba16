"""AMQP messages to stored messages and back: where a publish is stored, and its properties
as ``amqp.*`` message properties (text), so a message delivered over AMQP carries the
properties it was published with.

A publish to ``amq.topic`` is stored under the subject its routing key names, in the topic
that subject belongs to, so MQTT subscribers and native readers see it; a queue bound to
``amq.topic`` gets the subject filter its binding key names bound in core's fan-out, so MQTT
and native publishes reach it. Routing keys and subjects swap ``.`` and ``/``: ``a.b.c`` is
``a/b/c``, and a ``/`` inside a word is a ``.`` inside a level (``v1/2.x`` is ``v1.2/x``), a
bijection, so nothing is merged and every key and topic comes back as it was (percent escapes
cannot be: an MQTT topic may hold ``%2F`` itself). Binding keys map ``*`` to ``+`` and ``#`` to
``#``. Any other exchange stores into ``amqp.<exchange>`` (virtual host ``/``) or
``amqp.<vhost>.<exchange>``, names escaped.
Converting stored properties back never raises on hostile values and does bounded work: what
does not parse, or that AMQP cannot carry, is left out, and a header table keeps only what
pamqp encodes within the bounds of ``field_values`` (values it drops are logged, once per
header and reason per interval).

A message another protocol stored (MQTT, native) is delivered with the AMQP properties of what
it has (``core.interop``): delivery_mode 2 when persistent (QoS 1/2, native) else 1, its
remaining expiry as expiration (ms), content type, correlation data as correlation_id (UTF-8 up
to 255 bytes, else the ``mqtt.correlation_data`` header), its response topic's routing key as
reply_to, the time it was published as timestamp (s), MQTT 5 user properties as headers (a
field table has no order: pamqp writes it sorted by name; a repeated name's values become an
array in their order), the publishing MQTT client id as the ``mqtt.client_id`` header and its
QoS as ``x-mqtt-publish-qos`` (as RabbitMQ names it), the rest as ``mqtt.*`` headers; a native
producer's own properties are headers too. A CloudEvent (``core.cloudevents.event_of``) is
delivered in the RabbitMQ binding: its attributes as ``ce-<attribute>`` headers (instead of the
user properties or properties that carried them), ``datacontenttype`` as content_type; a
structured one keeps its body, with content_type ``application/cloudevents+json``.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import logging
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, Final

from pamqp.commands import Basic

from core import cloudevents, interop
from core.clock import now_ms
from core.interop import key_of_subject, subject_of_key  # noqa: F401 - re-exported
from core.model import SUBJECT_PROPERTY, OutgoingMessage
from core.untrusted import DenialLog, clip

from .field_values import MAX_NAME_BYTES, TAGS, Conversion, field_table

log = logging.getLogger(__name__)

TOPIC_EXCHANGE: Final = "amq.topic"
DEFAULT_EXCHANGE_NAME: Final = "amq.default"
"""The default exchange ("") in topic names; clients cannot declare ``amq.*`` exchanges."""
EXCHANGE_PROPERTY: Final = interop.AMQP_EXCHANGE
ROUTING_KEY_PROPERTY: Final = "amqp.routing_key"
HEADERS_PROPERTY: Final = interop.AMQP_HEADERS
CLIENT_ID_HEADER: Final = "mqtt.client_id"
QOS_HEADER: Final = "x-mqtt-publish-qos"
_SHORTSTR: Final = 255
TIMESTAMP_PROPERTY: Final = "amqp.timestamp"
_TEXT_FIELDS: Final = ("content_type", "content_encoding", "correlation_id", "reply_to",
                       "expiration", "message_id", "user_id", "app_id")
_INT_FIELDS: Final = ("delivery_mode", "priority")
_TYPE_PROPERTY: Final = "amqp.type"
_SAFE: Final = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_|")
_MAX_TOPIC: Final = 127
_MAX_SECONDS: Final = 253_402_300_799
"""The last second of year 9999, the last a timestamp property can name."""
_dropped = DenialLog(log, interval_s=300.0, max_keys=1024)
"""Header values left out of deliveries, logged once per (header, reason) per interval."""


def _escape(name: str) -> str:
    return "".join(c if c in _SAFE else "".join(f"%{b:02X}" for b in c.encode()) for c in name)


@functools.lru_cache(maxsize=1024)  # pure, and asked for by every publish
def exchange_topic(vhost: str, exchange: str) -> str:
    """The native topic storing what is published to ``exchange`` of ``vhost``."""
    name = _escape(exchange or DEFAULT_EXCHANGE_NAME)
    topic = f"amqp.{name}" if vhost == "/" else f"amqp.{_escape(vhost)}.{name}"
    if len(topic) <= _MAX_TOPIC:
        return topic
    digest = hashlib.blake2b(topic.encode(), digest_size=8).hexdigest()
    return f"{topic[:_MAX_TOPIC - 17]}.{digest}"


_SINGLE_WORD: Final = "*"
_SINGLE_LEVEL: Final = "+"
_MULTI: Final = "#"


def filter_of_binding_key(binding_key: str) -> str | None:
    """The subject filter an ``amq.topic`` binding key reads (``devices.*.telemetry`` ->
    ``devices/+/telemetry``; ``#`` may stand anywhere, as in AMQP). None when a word holds
    ``+``: no MQTT topic can, and the filter could not say it."""
    levels = []
    for word in binding_key.split("."):
        if word == _SINGLE_WORD:
            levels.append(_SINGLE_LEVEL)
        elif word == _MULTI:
            levels.append(_MULTI)
        elif _SINGLE_LEVEL in word or _MULTI in word:
            return None
        else:
            levels.append(word.replace("/", "."))
    return "/".join(levels)


def binding_key_of_filter(subject_filter: str) -> str | None:
    """The ``amq.topic`` binding key of an MQTT filter (``+`` -> ``*``); None when a level
    holds ``*``, which a binding key would read as a wildcard."""
    words = []
    for level in subject_filter.split("/"):
        if level == _SINGLE_LEVEL:
            words.append(_SINGLE_WORD)
        elif level == _MULTI:
            words.append(_MULTI)
        elif _SINGLE_WORD in level:
            return None
        else:
            words.append(level.replace(".", "/"))
    return ".".join(words)


def read_filter(binding_key: str) -> str:
    """The subject filter a binding of ``amq.topic`` is authorized on: the one it reads, or
    wider (a level with ``+`` in it is any level; what follows a ``#`` is dropped, since
    filters take ``#`` last), so a binding never reads what its filter would not."""
    levels = []
    for word in binding_key.split("."):
        if word == _MULTI:
            levels.append(_MULTI)
            break
        if word == _SINGLE_WORD or _SINGLE_LEVEL in word or _MULTI in word:
            levels.append(_SINGLE_LEVEL)
        else:
            levels.append(word.replace("/", "."))
    return "/".join(levels)


def origin(topic: str, stored: Mapping[str, str]) -> tuple[str, str]:
    """(exchange, routing key) a message of ``topic`` is delivered with: as published over
    AMQP, else ``amq.topic`` and the key of its subject (an MQTT or native publish, which
    reached the queue through a binding of ``amq.topic``)."""
    exchange = stored.get(EXCHANGE_PROPERTY)
    if exchange is not None:
        return _shortstr(exchange), _shortstr(stored.get(ROUTING_KEY_PROPERTY, ""))
    return TOPIC_EXCHANGE, _shortstr(key_of_subject(stored.get(SUBJECT_PROPERTY) or topic))


def _shortstr(text: str) -> str:
    """``text`` cut to AMQP's 255-byte short string (an MQTT topic may be longer); a lone
    surrogate, which UTF-8 cannot carry, becomes ``?``."""
    if text.isascii():
        return text[:_SHORTSTR]
    raw = text.encode(errors="replace")
    return raw[:_SHORTSTR].decode(errors="ignore")


def to_outgoing(topic: str, subject: str | None, exchange: str, routing_key: str,
                properties: Basic.Properties, body: bytes,
                also_into: tuple[str, ...]) -> OutgoingMessage:
    """A publish as the message core stores."""
    props: dict[str, str] = {EXCHANGE_PROPERTY: exchange, ROUTING_KEY_PROPERTY: routing_key}
    if subject:
        props[SUBJECT_PROPERTY] = subject
    for name in _TEXT_FIELDS:
        value = getattr(properties, name)
        if value is not None:
            props[f"amqp.{name}"] = value
    for name in _INT_FIELDS:
        value = getattr(properties, name)
        if value is not None:
            props[f"amqp.{name}"] = str(value)
    if properties.message_type is not None:
        props[_TYPE_PROPERTY] = properties.message_type
    if properties.timestamp is not None:
        props[TIMESTAMP_PROPERTY] = str(int(properties.timestamp.timestamp()))
    if properties.headers is not None:
        props[HEADERS_PROPERTY] = json.dumps(_to_json(properties.headers), ensure_ascii=False,
                                             separators=(",", ":"))
    return OutgoingMessage(topic, body, properties=props, also_into=also_into)


def to_properties(stored: Mapping[str, str], born_ms: int = 0, body: bytes = b"") -> Basic.Properties:
    """The AMQP properties of a stored message published at ``born_ms`` with ``body``: they
    marshal without raising, whatever was stored (values that do not parse or that AMQP cannot
    carry are left out)."""
    if EXCHANGE_PROPERTY not in stored:
        return _from_other(stored, born_ms, body)
    fields: dict[str, Any] = {}
    for name in _TEXT_FIELDS:
        value = stored.get(f"amqp.{name}")
        if value is not None:
            fields[name] = _shortstr(value)
    mode = stored.get(interop.AMQP_DELIVERY_MODE)
    if mode in ("1", "2"):
        fields["delivery_mode"] = int(mode)
    priority = _number(stored.get("amqp.priority"))
    if priority is not None and 0 <= priority <= 255:
        fields["priority"] = priority
    if _TYPE_PROPERTY in stored:
        fields["message_type"] = _shortstr(stored[_TYPE_PROPERTY])
    timestamp = _timestamp(_number(stored.get(TIMESTAMP_PROPERTY)))
    if timestamp is not None:
        fields["timestamp"] = timestamp
    raw = stored.get(HEADERS_PROPERTY)
    if raw is not None:
        headers = _parsed(raw, json.loads) if len(raw) <= interop.MAX_STORED_JSON else None
        table = _checked_headers(headers)
        if isinstance(headers, dict):
            fields["headers"] = table
    return Basic.Properties(**fields)


def _checked_headers(headers: object) -> dict[str, Any]:
    """``headers`` as a field table pamqp encodes (``field_values``), logging what is left out."""
    conversion = Conversion()
    table = field_table(headers, conversion)
    if conversion.first_drop is not None:
        name, why = conversion.first_drop
        _dropped.denied(name, why, "a delivery leaves out %d AMQP header(s) it cannot carry, "
                        "the first %s: %s", conversion.dropped, clip(name), why)
    return table


def _number(raw: str | None) -> int | None:
    """A decimal integer of at most 20 digits as stored, else None."""
    if raw is None or len(raw) > 20:
        return None
    return _parsed(raw, int)


def _timestamp(seconds: int | None) -> datetime | None:
    """The time ``seconds`` after the epoch, if a timestamp property can name it."""
    if seconds is None or not 0 <= seconds <= _MAX_SECONDS:
        return None
    return datetime.fromtimestamp(seconds, UTC)


def properties_payload(stored: Mapping[str, str], born_ms: int = 0, body: bytes = b"") -> bytes:
    """``to_properties`` marshalled, as a content header carries them. Those of an AMQP
    publish depend on the stored properties alone and are cached by value: a run of messages
    mostly shares them, and building and marshalling them is most of a delivery's cost."""
    if EXCHANGE_PROPERTY not in stored:
        return to_properties(stored, born_ms, body).marshal()
    return _published_payload(tuple(stored.items()))


@functools.lru_cache(maxsize=1024)
def _published_payload(stored: tuple[tuple[str, str], ...]) -> bytes:
    return to_properties(dict(stored)).marshal()


def _from_other(stored: Mapping[str, str], born_ms: int, body: bytes) -> Basic.Properties:
    """The AMQP properties of a message MQTT or a native producer stored; a CloudEvent in
    the RabbitMQ binding (``ce-`` headers, or a structured one's content type)."""
    common = interop.common(stored, born_ms)
    event = cloudevents.event_of(stored, body)
    content_type, carried = common.content_type, frozenset[str]()
    headers: dict[str, Any] = {}
    if event is not None and event.structured:
        content_type = content_type or cloudevents.STRUCTURED_TYPE
    elif event is not None:
        content_type, carried = event.content_type, event.carried
        headers.update(cloudevents.amqp_headers(event))
    for name, value in common.user_properties:
        if name not in carried:
            _add_header(headers, name, value)
    qos = stored.get(interop.MQTT_QOS)
    if qos in ("0", "1", "2"):
        headers[QOS_HEADER] = int(qos)
    if stored.get(interop.MQTT_CLIENT):
        headers[CLIENT_ID_HEADER] = stored[interop.MQTT_CLIENT]
    headers.update(common.extra)
    for name, value in stored.items():  # a native producer's own properties
        if interop.namespace_of(name) is None and name not in carried:
            _add_header(headers, name, value)
    fields: dict[str, Any] = {"delivery_mode": 2 if common.persistent else 1}
    timestamp = _timestamp(born_ms // 1000) if born_ms > 0 else None
    if timestamp is not None:
        fields["timestamp"] = timestamp
    if common.expiry_at_ms is not None:
        fields["expiration"] = str(max(0, common.expiry_at_ms - now_ms()))
    _short(fields, headers, "content_type", content_type, interop.MQTT_CONTENT_TYPE)
    if common.correlation is not None:
        try:
            _short(fields, headers, "correlation_id", common.correlation.decode(),
                   interop.MQTT_CORRELATION)
        except UnicodeDecodeError:
            headers[interop.MQTT_CORRELATION] = bytearray(common.correlation)
    if common.reply_subject is not None:
        _short(fields, headers, "reply_to", key_of_subject(common.reply_subject),
               interop.MQTT_RESPONSE_TOPIC)
    if headers:
        fields["headers"] = _checked_headers(headers)
    return Basic.Properties(**fields)


def _add_header(headers: dict[str, Any], name: str, value: str) -> None:
    """Add a header; a repeated name's values become an array, in order (names longer than
    pamqp writes, 128 bytes, are left out rather than cut into another name)."""
    if len(name.encode(errors="replace")) > MAX_NAME_BYTES:
        return
    if name not in headers:
        headers[name] = value
    elif isinstance(headers[name], list):
        headers[name].append(value)
    else:
        headers[name] = [headers[name], value]


def _short(fields: dict[str, Any], headers: dict[str, Any], field: str, value: str | None,
           header: str) -> None:
    """``value`` as property ``field`` if it fits a short string, else as header ``header``."""
    if value is None:
        return
    if _shortstr(value) == value:
        fields[field] = value
    else:
        headers[header] = value


def _parsed(raw: str | None, parse: Callable[[str], Any]) -> Any:
    if raw is None:
        return None
    try:
        return parse(raw)
    except (ValueError, RecursionError):
        return None


def _to_json(value: Any) -> Any:
    """A field value as JSON, tagging what JSON cannot tell apart."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"$bytes": base64.b64encode(bytes(value)).decode()}
    if isinstance(value, Decimal):
        return {"$decimal": str(value)}
    if isinstance(value, datetime):
        return {"$time": int(value.timestamp())}
    if isinstance(value, Mapping):
        table = {str(key): _to_json(item) for key, item in value.items()}
        return {"$table": table} if len(table) == 1 and next(iter(table)) in TAGS else table
    if isinstance(value, (list, tuple)):
        return [_to_json(item) for item in value]
    return str(value)


def with_header(stored: Mapping[str, str], name: str, value: int | str) -> dict[str, str]:
    """``stored`` with the AMQP header ``name`` set to ``value`` (headers that do not parse
    are replaced)."""
    headers = _parsed(stored.get(HEADERS_PROPERTY), json.loads)
    headers = headers if isinstance(headers, dict) else {}
    headers[name] = value
    changed = dict(stored)
    try:
        changed[HEADERS_PROPERTY] = json.dumps(headers, ensure_ascii=False, separators=(",", ":"))
    except (ValueError, RecursionError):  # nested deeper than the stack allows: replaced
        changed[HEADERS_PROPERTY] = json.dumps({name: value}, separators=(",", ":"))
    return changed
