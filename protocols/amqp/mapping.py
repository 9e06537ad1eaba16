"""AMQP messages to stored messages and back: where a publish is stored, and its properties
as ``amqp.*`` message properties (text), so a message delivered over AMQP carries the
properties it was published with.

A publish to ``amq.topic`` is stored under the subject its routing key names (``a.b.c`` ->
``a/b/c``, a ``/`` or ``%`` inside a word escaped as ``%2F`` / ``%25``), in the topic that
subject belongs to, so MQTT subscribers and native readers see it. Any other exchange stores
into ``amqp.<exchange>`` (virtual host ``/``) or ``amqp.<vhost>.<exchange>``, names escaped.
Converting stored properties back never raises on hostile values: what does not parse is left
out.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import Any, Final

from pamqp.commands import Basic

from core.model import SUBJECT_PROPERTY, OutgoingMessage

TOPIC_EXCHANGE: Final = "amq.topic"
DEFAULT_EXCHANGE_NAME: Final = "amq.default"
"""The default exchange ("") in topic names; clients cannot declare ``amq.*`` exchanges."""
EXCHANGE_PROPERTY: Final = "amqp.exchange"
ROUTING_KEY_PROPERTY: Final = "amqp.routing_key"
HEADERS_PROPERTY: Final = "amqp.headers"
TIMESTAMP_PROPERTY: Final = "amqp.timestamp"
_TEXT_FIELDS: Final = ("content_type", "content_encoding", "correlation_id", "reply_to",
                       "expiration", "message_id", "user_id", "app_id")
_INT_FIELDS: Final = ("delivery_mode", "priority")
_TYPE_PROPERTY: Final = "amqp.type"
_SAFE: Final = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_|")
_MAX_TOPIC: Final = 127
_TAGS: Final = ("$bytes", "$decimal", "$time", "$table")
"""One-entry objects standing for field values JSON has no type for (and for a table that
looks like one of them)."""


def _escape(name: str) -> str:
    return "".join(c if c in _SAFE else "".join(f"%{b:02X}" for b in c.encode()) for c in name)


def exchange_topic(vhost: str, exchange: str) -> str:
    """The native topic storing what is published to ``exchange`` of ``vhost``."""
    name = _escape(exchange or DEFAULT_EXCHANGE_NAME)
    topic = f"amqp.{name}" if vhost == "/" else f"amqp.{_escape(vhost)}.{name}"
    if len(topic) <= _MAX_TOPIC:
        return topic
    digest = hashlib.blake2b(topic.encode(), digest_size=8).hexdigest()
    return f"{topic[:_MAX_TOPIC - 17]}.{digest}"


def subject_of_key(routing_key: str) -> str:
    """The subject of an ``amq.topic`` routing key: words joined by ``/``."""
    return "/".join(word.replace("%", "%25").replace("/", "%2F")
                    for word in routing_key.split("."))


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


def to_properties(stored: Mapping[str, str]) -> Basic.Properties:
    """The AMQP properties of a stored message; values that do not parse are left out."""
    fields: dict[str, Any] = {}
    for name in _TEXT_FIELDS:
        value = stored.get(f"amqp.{name}")
        if value is not None:
            fields[name] = value[:255]
    for name in _INT_FIELDS:
        value = _parsed(stored.get(f"amqp.{name}"), int)
        if value is not None and 0 <= value <= 255:
            fields[name] = value
    if _TYPE_PROPERTY in stored:
        fields["message_type"] = stored[_TYPE_PROPERTY][:255]
    seconds = _parsed(stored.get(TIMESTAMP_PROPERTY), int)
    if seconds is not None and 0 <= seconds < 1 << 32:
        fields["timestamp"] = datetime.fromtimestamp(seconds, UTC)
    headers = _parsed(stored.get(HEADERS_PROPERTY), json.loads)
    if isinstance(headers, dict):
        fields["headers"] = _from_json(headers)
    return Basic.Properties(**fields)


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
        return {"$table": table} if len(table) == 1 and next(iter(table)) in _TAGS else table
    if isinstance(value, (list, tuple)):
        return [_to_json(item) for item in value]
    return str(value)


def _from_json(value: Any) -> Any:
    """The field value ``_to_json`` made; anything malformed stays as JSON gave it."""
    if isinstance(value, list):
        return [_from_json(item) for item in value]
    if not isinstance(value, dict):
        return value
    if len(value) == 1:
        (tag, inner), = value.items()
        try:
            if tag == "$bytes" and isinstance(inner, str):
                return bytearray(base64.b64decode(inner, validate=True))
            if tag == "$decimal" and isinstance(inner, str):
                return Decimal(inner)
            if tag == "$time" and isinstance(inner, int) and 0 <= inner < 1 << 32:
                return datetime.fromtimestamp(inner, UTC)
            if tag == "$table" and isinstance(inner, dict):
                return {key: _from_json(item) for key, item in inner.items()}
        except (ValueError, InvalidOperation):
            return {}
    return {key: _from_json(item) for key, item in value.items()}


def with_header(stored: Mapping[str, str], name: str, value: int | str) -> dict[str, str]:
    """``stored`` with the AMQP header ``name`` set to ``value`` (headers that do not parse
    are replaced)."""
    headers = _parsed(stored.get(HEADERS_PROPERTY), json.loads)
    headers = headers if isinstance(headers, dict) else {}
    headers[name] = value
    changed = dict(stored)
    changed[HEADERS_PROPERTY] = json.dumps(headers, ensure_ascii=False, separators=(",", ":"))
    return changed
