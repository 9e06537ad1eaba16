"""The queue arguments about messages leaving a queue, checked as RabbitMQ 4 checks them and
parsed into a `QueuePolicy`: x-message-ttl, x-expires, x-max-length, x-max-length-bytes,
x-overflow, x-dead-letter-exchange, x-dead-letter-routing-key, and for quorum queues
x-delivery-limit (``core.queue_features`` checks x-queue-type itself).

``check`` reads the field table as the client sent it (so a type is named as RabbitMQ names
it); ``policy`` reads the JSON-safe copy a queue keeps (``arguments.json_safe_table``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from core.errors import PreconditionFailed
from core.queue_features import field_type
from core.untrusted import clip

MAX_EXPIRY_MS: Final = 4_294_967_295
"""RabbitMQ's largest TTL or expiry (``?MAX_EXPIRY_TIMER``)."""
OVERFLOWS: Final = ("drop-head", "reject-publish", "reject-publish-dlx")
DEFAULT_DELIVERY_LIMIT: Final = 20
"""A quorum queue's delivery limit when it is not given (RabbitMQ 4.0)."""


@dataclass(frozen=True, slots=True)
class QueuePolicy:
    """What a queue's arguments ask of the messages leaving it (None: no limit)."""

    message_ttl: int | None = None
    expires: int | None = None
    max_length: int | None = None
    max_length_bytes: int | None = None
    overflow: str = "drop-head"
    dead_letter_exchange: str | None = None
    dead_letter_routing_key: str | None = None
    quorum: bool = False
    delivery_limit: int | None = None

    @property
    def limits_length(self) -> bool:
        return self.max_length is not None or self.max_length_bytes is not None


def _integer(value: Any) -> str | None:
    return None if isinstance(value, int) and not isinstance(value, bool) \
        else f"{{unacceptable_type,{field_type(value)}}}"


def _non_negative(value: Any, _: Mapping[str, Any]) -> str | None:
    return _integer(value) or (f"{{value_negative,{value}}}" if value < 0 else None)


def _expiry(value: int) -> str | None:
    if value < 0:
        return f"{{value_negative,{value}}}"
    return f"{{value_too_large,{value}}}" if value > MAX_EXPIRY_MS else None


def _message_ttl(value: Any, _: Mapping[str, Any]) -> str | None:
    return _integer(value) or _expiry(value)


def _expires(value: Any, _: Mapping[str, Any]) -> str | None:
    return _integer(value) or ("{value_zero,0}" if value == 0 else _expiry(value))


def _text(value: Any) -> str | None:
    return None if isinstance(value, (str, bytes, bytearray)) \
        else f"{{unacceptable_type,{field_type(value)}}}"


def _dlx(value: Any, _: Mapping[str, Any]) -> str | None:
    return _text(value)


def _dlx_key(value: Any, arguments: Mapping[str, Any]) -> str | None:
    if _text(value):
        return _text(value)
    return None if "x-dead-letter-exchange" in arguments else "routing_key_but_no_dlx_defined"


def _one_of(choices: tuple[str, ...], error: str) -> Callable[[Any, Mapping[str, Any]], str | None]:
    def check(value: Any, _: Mapping[str, Any]) -> str | None:
        if _text(value):
            return _text(value)
        text = value.decode(errors="replace") if isinstance(value, (bytes, bytearray)) else value
        return None if text in choices else error
    return check


def _delivery_limit(value: Any, _: Mapping[str, Any]) -> str | None:
    return _integer(value)


_CHECKS: Final[dict[str, Callable[[Any, Mapping[str, Any]], str | None]]] = {
    "x-message-ttl": _message_ttl,
    "x-expires": _expires,
    "x-max-length": _non_negative,
    "x-max-length-bytes": _non_negative,
    "x-overflow": _one_of(OVERFLOWS, "invalid_overflow"),
    "x-dead-letter-exchange": _dlx,
    "x-dead-letter-routing-key": _dlx_key,
    "x-delivery-limit": _delivery_limit,
}


def check(arguments: Mapping[str, Any] | None, queue: str, vhost: str, *, durable: bool,
          exclusive: bool, auto_delete: bool) -> None:
    """PreconditionFailed (406) with RabbitMQ's wording when an argument of a queue.declare
    has a wrong type or value, or a quorum queue is declared with properties it cannot have."""
    arguments = arguments or {}
    where = f"queue '{clip(queue, 200)[1:-1]}' in vhost '{clip(vhost, 200)[1:-1]}'"
    for key, checker in _CHECKS.items():
        if key in arguments and (error := checker(arguments[key], arguments)):
            raise PreconditionFailed(f"invalid arg '{key}' for {where}: {error}")
    if _as_text(arguments.get("x-queue-type")) == "quorum":
        for flag, name in ((auto_delete, "auto-delete"), (exclusive, "exclusive-owner"),
                           (not durable, "non-durable")):
            if flag:
                raise PreconditionFailed(f"invalid property '{name}' for {where}")
        if _as_text(arguments.get("x-overflow")) == "reject-publish-dlx":
            raise PreconditionFailed(f"invalid arg 'x-overflow' with value "
                                     f"'reject-publish-dlx' for {where}")


def _as_text(value: Any) -> str | None:
    if isinstance(value, (bytes, bytearray)):
        return value.decode(errors="replace")
    return value if isinstance(value, str) else None


def policy(arguments: Mapping[str, Any]) -> QueuePolicy | None:
    """The policy of a queue's stored (checked, JSON-safe) arguments; None when they ask for
    nothing this module handles, so such a queue costs nothing on the hot path. A stream's
    arguments are its retention, not this (``core.queue_features``): None for a stream."""
    if arguments.get("x-queue-type") == "stream":
        return None
    quorum = arguments.get("x-queue-type") == "quorum"
    found = QueuePolicy(
        message_ttl=_int_or_none(arguments.get("x-message-ttl")),
        expires=_int_or_none(arguments.get("x-expires")),
        max_length=_int_or_none(arguments.get("x-max-length")),
        max_length_bytes=_int_or_none(arguments.get("x-max-length-bytes")),
        overflow=_as_text(arguments.get("x-overflow")) or "drop-head",
        dead_letter_exchange=_as_text(arguments.get("x-dead-letter-exchange")),
        dead_letter_routing_key=_as_text(arguments.get("x-dead-letter-routing-key")),
        quorum=quorum,
        delivery_limit=_delivery_limit_of(arguments) if quorum else None)
    return None if found == QueuePolicy() else found


def _delivery_limit_of(arguments: Mapping[str, Any]) -> int | None:
    """A quorum queue's limit: the argument, 20 when absent, none when negative."""
    limit = _int_or_none(arguments.get("x-delivery-limit"))
    if limit is None:
        return DEFAULT_DELIVERY_LIMIT
    return None if limit < 0 else limit


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


COMPARED: Final = ("x-expires", "x-message-ttl", "x-dead-letter-exchange",
                   "x-dead-letter-routing-key", "x-max-length", "x-max-length-bytes",
                   "x-overflow", "x-delivery-limit")
"""The arguments of this module a redeclaration must repeat (RabbitMQ compares them)."""


def check_equivalent(current: Mapping[str, Any], received: Mapping[str, Any], queue: str,
                     vhost: str) -> None:
    """PreconditionFailed (406) worded as RabbitMQ's ``inequivalent arg`` when a queue is
    declared again with other values for one of ``COMPARED``. ``current`` is the stored
    (JSON-safe) table, ``received`` the JSON-safe table of the new declaration."""
    for key in COMPARED:
        old, new = current.get(key), received.get(key)
        if old == new and type(old) is type(new):
            continue
        where = f"queue '{clip(queue, 200)[1:-1]}' in vhost '{clip(vhost, 200)[1:-1]}'"
        raise PreconditionFailed(f"inequivalent arg '{key}' for {where}: received "
                                 f"{_value(new, old is None)} but current is "
                                 f"{_value(old, new is None)}")


def _value(value: Any, typed: bool) -> str:
    """A value in RabbitMQ's wording: none, 'v', or the value 'v' of type 't' (when the other
    side has none)."""
    if value is None:
        return "none"
    if not typed:
        return f"'{value}'"
    kind = field_type(value)
    if kind == "long" and -(1 << 31) <= value < 1 << 31:
        kind = "signedint"
    return f"the value '{value}' of type '{kind}'"
