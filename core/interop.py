"""What every protocol's consumers can be told of a message, whichever protocol stored it.

A message is stored once, in the form it arrived (DESIGN.md, cross-protocol contract): an MQTT
publish with ``mqtt.*`` properties, an AMQP publish with ``amqp.*`` ones, a native send with
whatever its producer set. An adapter delivering a message another protocol stored reads it
through ``common``: the properties both protocols have, in neutral units, plus the namespaced
ones with no equivalent (``extra``), passed on rather than dropped. The stored names are
defined here because both adapters read them; each adapter's mapping writes its own.

- persistence: MQTT QoS 1/2 and AMQP delivery_mode 2 are persistent; QoS 0 and delivery_mode 1
  (or none) are not; a native send is (it was stored durably).
- expiry: MQTT's absolute ``mqtt.expiry_at`` (ms), AMQP's ``expiration`` (ms from publishing).
- content type, correlation (bytes; AMQP's correlation_id as UTF-8), reply subject (MQTT's
  response topic; AMQP's reply_to as a routing key, turned into its subject).
- user properties in order: MQTT 5 user properties; AMQP headers with their values as text.

Routing keys and subjects swap ``.`` and ``/`` (``key_of_subject``), a bijection, so a ``.``
inside an MQTT level and a ``/`` inside an AMQP word travel without merging levels.
Nothing here raises on hostile stored values: what does not parse is left out.

Namespaces belong to their writer: ``amqp.*`` properties are written only by the AMQP adapter,
``mqtt.*`` only by the MQTT one, ``sluice.*`` only by core, since consumers rely on them (RabbitMQ
guarantees ``user_id`` and the exchange; MQTT the QoS; core reads its timers' and transactions'
destinations back). A producer that names its properties itself (a native send) may set none of
them but ``SENDER_PROPERTIES`` (``check_sender_properties``). Users' own names travel inside
their protocol's property (MQTT user properties in ``mqtt.user_properties``, AMQP headers in
``amqp.headers``), so a user property called ``amqp.headers`` stays a user property.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from .errors import InvalidArgument
from .model import SUBJECT_PROPERTY
from .untrusted import clip

MQTT_QOS: Final = "mqtt.qos"
MQTT_RETAIN: Final = "mqtt.retain"
MQTT_CLIENT: Final = "mqtt.client"
MQTT_EXPIRY_AT: Final = "mqtt.expiry_at"
MQTT_CONTENT_TYPE: Final = "mqtt.content_type"
MQTT_RESPONSE_TOPIC: Final = "mqtt.response_topic"
MQTT_CORRELATION: Final = "mqtt.correlation_data"
MQTT_PAYLOAD_FORMAT: Final = "mqtt.payload_format"
MQTT_USER_PROPERTIES: Final = "mqtt.user_properties"

AMQP_EXCHANGE: Final = "amqp.exchange"
"""Set on every AMQP publish: what tells a message stored by the AMQP adapter."""
AMQP_DELIVERY_MODE: Final = "amqp.delivery_mode"
AMQP_EXPIRATION: Final = "amqp.expiration"
AMQP_CONTENT_TYPE: Final = "amqp.content_type"
AMQP_CORRELATION_ID: Final = "amqp.correlation_id"
AMQP_REPLY_TO: Final = "amqp.reply_to"
AMQP_HEADERS: Final = "amqp.headers"
AMQP_EXTRA: Final = ("amqp.message_id", "amqp.type", "amqp.app_id", "amqp.user_id",
                     "amqp.priority", "amqp.content_encoding", "amqp.timestamp")
"""AMQP properties MQTT has no field for, passed on by name."""
MQTT_EXTRA: Final = (MQTT_RETAIN, MQTT_PAYLOAD_FORMAT)
"""MQTT properties AMQP has no field for, passed on by name."""

OWN_NAMESPACES: Final = {"amqp": "the AMQP adapter", "mqtt": "the MQTT adapter",
                         "sluice": "the broker"}
"""The first dotted level of property names the broker writes, and who writes them."""
BATCH_PROPERTY: Final = "sluice.batch"
"""The SDK's packed-batch count (``sluice.client.packing``), read by consumers only."""
SENDER_PROPERTIES: Final = frozenset({SUBJECT_PROPERTY, BATCH_PROPERTY})
"""Names in ``sluice.*`` a producer may set: the subject (core checks that it lies in the
topic sent to) and the SDK's packed-batch count."""

MAX_STORED_JSON: Final = 1 << 16
"""Characters of a JSON property value parsed back (four times all of a message's properties
may hold): a longer one, which no adapter writes, is left out unparsed."""

_SWAP: Final = str.maketrans("./", "/.")
_MAX_EXPIRY_MS: Final = 1 << 53


def namespace_of(name: str) -> str | None:
    """The own namespace (``amqp``, ``mqtt``, ``sluice``) property ``name`` is in, or None."""
    head, dot, _ = name.partition(".")
    return head if dot and head in OWN_NAMESPACES else None


def check_sender_properties(names: Iterable[str]) -> None:
    """InvalidArgument naming the first of a producer's property ``names`` that lies in a
    namespace the broker writes (``OWN_NAMESPACES``), ``SENDER_PROPERTIES`` excepted."""
    for name in names:
        namespace = namespace_of(name)
        if namespace is not None and name not in SENDER_PROPERTIES:
            raise InvalidArgument(
                f"property {clip(name)} is in the {namespace}.* namespace, which only "
                f"{OWN_NAMESPACES[namespace]} writes; give it another name (of sluice.*, a "
                f"producer may set {' and '.join(sorted(SENDER_PROPERTIES))})")


def subject_of_key(routing_key: str) -> str:
    """The subject of an ``amq.topic`` routing key (``a.b/c`` -> ``a/b.c``)."""
    return routing_key.translate(_SWAP)


def key_of_subject(subject: str) -> str:
    """The ``amq.topic`` routing key of a subject or MQTT topic (``a/b.c`` -> ``a.b/c``)."""
    return subject.translate(_SWAP)


@dataclass(frozen=True, slots=True)
class Common:
    """The properties of a stored message every protocol has, in neutral units."""

    persistent: bool
    expiry_at_ms: int | None = None
    content_type: str | None = None
    correlation: bytes | None = None
    reply_subject: str | None = None
    user_properties: tuple[tuple[str, str], ...] = ()
    extra: tuple[tuple[str, str], ...] = ()
    """Namespaced properties with no equivalent elsewhere (``amqp.message_id``, ...)."""


def common(stored: Mapping[str, str], born_ms: int) -> Common:
    """The common properties of a stored message published at ``born_ms``."""
    if AMQP_EXCHANGE in stored:
        return _from_amqp(stored, born_ms)
    return _from_mqtt(stored)


def _from_amqp(stored: Mapping[str, str], born_ms: int) -> Common:
    expiration = _int(stored.get(AMQP_EXPIRATION))
    correlation = stored.get(AMQP_CORRELATION_ID)
    reply_to = stored.get(AMQP_REPLY_TO)
    return Common(
        persistent=stored.get(AMQP_DELIVERY_MODE) == "2",
        expiry_at_ms=None if expiration is None else born_ms + expiration,
        content_type=stored.get(AMQP_CONTENT_TYPE),
        correlation=None if correlation is None else correlation.encode(errors="replace"),
        reply_subject=None if reply_to is None else subject_of_key(reply_to),
        user_properties=stored_headers(stored.get(AMQP_HEADERS)),
        extra=tuple((name, stored[name]) for name in AMQP_EXTRA if name in stored))


def _from_mqtt(stored: Mapping[str, str]) -> Common:
    qos = stored.get(MQTT_QOS)
    correlation = stored.get(MQTT_CORRELATION)
    try:
        data = None if correlation is None else base64.b64decode(correlation, validate=True)
    except (binascii.Error, ValueError):
        data = None
    return Common(
        persistent=qos != "0",  # QoS 1 or 2, or a native send (stored durably)
        expiry_at_ms=_int(stored.get(MQTT_EXPIRY_AT)),
        content_type=stored.get(MQTT_CONTENT_TYPE),
        correlation=data,
        reply_subject=stored.get(MQTT_RESPONSE_TOPIC),
        user_properties=stored_user_properties(stored.get(MQTT_USER_PROPERTIES)),
        extra=tuple((name, stored[name]) for name in MQTT_EXTRA if name in stored))


def _int(raw: str | None) -> int | None:
    """A non-negative decimal integer as stored, else None."""
    if raw is None or not (raw.isascii() and raw.isdigit()) or len(raw) > 16:
        return None
    value = int(raw)
    return value if value < _MAX_EXPIRY_MS else None


def stored_user_properties(raw: str | None) -> tuple[tuple[str, str], ...]:
    """MQTT 5 user properties as stored (``mqtt.user_properties``), in order; () when they
    do not parse."""
    pairs = _json(raw)
    if not isinstance(pairs, list):
        return ()
    return tuple((p[0], p[1]) for p in pairs if isinstance(p, list) and len(p) == 2
                 and isinstance(p[0], str) and isinstance(p[1], str))


def stored_headers(raw: str | None) -> tuple[tuple[str, str], ...]:
    """AMQP headers (stored as tagged JSON by the AMQP mapping, ``amqp.headers``) as text
    pairs, in order; () when they do not parse."""
    table = _json(raw)
    if isinstance(table, dict) and len(table) == 1 and isinstance(table.get("$table"), dict):
        table = table["$table"]  # a table whose only name is a tag
    if not isinstance(table, dict):
        return ()
    return tuple((str(name), _text(value)) for name, value in table.items())


def without_user_properties(stored: Mapping[str, str], names: frozenset[str]) -> dict[str, str]:
    """``stored`` with the MQTT user properties and AMQP headers named in ``names`` left out
    (the rest as stored; a property that does not parse is kept as it is)."""
    changed = dict(stored)
    pairs = _json(stored.get(MQTT_USER_PROPERTIES))
    if isinstance(pairs, list):
        changed[MQTT_USER_PROPERTIES] = json.dumps(
            [pair for pair in pairs if not (isinstance(pair, list) and pair and pair[0] in names)],
            ensure_ascii=False, separators=(",", ":"))
    table = _json(stored.get(AMQP_HEADERS))
    if isinstance(table, dict):
        if len(table) == 1 and isinstance(table.get("$table"), dict):
            table = table["$table"]
        kept = {name: value for name, value in table.items() if name not in names}
        if len(kept) == 1 and next(iter(kept)).startswith("$"):  # as the AMQP mapping tags it
            kept = {"$table": kept}
        changed[AMQP_HEADERS] = json.dumps(kept, ensure_ascii=False, separators=(",", ":"))
    return changed


def _text(value: Any) -> str:
    """A header value as text: strings as they are, tagged bytes decoded, the rest as JSON."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and len(value) == 1:
        (tag, inner), = value.items()
        if tag == "$bytes" and isinstance(inner, str):
            try:
                return base64.b64decode(inner, validate=True).decode()
            except (binascii.Error, ValueError):
                return inner
        if tag in ("$decimal", "$time") and isinstance(inner, (str, int)):
            return str(inner)
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    except (ValueError, RecursionError):  # nested deeper than the stack allows
        return ""


def _json(raw: str | None) -> Any:
    if raw is None or len(raw) > MAX_STORED_JSON:
        return None
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        return None
