"""AMQP field tables from untrusted values: only what pamqp encodes, in bounded work.

pamqp's table encoder raises on what a field table cannot carry (a decimal NaN or Infinity, an
integer past 64 bits, a float past single precision, a string with a lone surrogate, a decimal
mantissa past 32 bits, which pamqp writes signed) and spends time without bound on a decimal
with a large positive exponent (``1E+400000`` becomes ten to the 400,000th as an integer
first); clients such as pika cannot read a float NaN or Infinity. Nested tables cost a few
stack frames per level in the encoder. ``field_table`` takes a table as stored
(``protocols.amqp.mapping``'s tagged JSON, already parsed) or as another protocol's properties
made it, and keeps what pamqp encodes within the bounds below; a field holding anything else is
dropped whole, and counted in a ``Conversion`` the caller may log. Never raises.

The bounds on nesting and values are the inbound decoder's (``protocols.amqp.properties``:
values at most ``MAX_DEPTH`` levels deep, the top table's own at depth 1, and ``MAX_ENTRIES``
of them), so that whatever the broker accepts from a publisher it can also deliver. Pure
functions; safe anywhere.
"""

from __future__ import annotations

import base64
import binascii
import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import Any, Final

from .properties import MAX_DEPTH, MAX_ENTRIES

MAX_NAME_BYTES: Final = 128
"""The longest field name pamqp writes (it cuts longer ones, which could merge two names)."""
MAX_DECIMAL_SCALE: Final = 255
"""Digits after the point of a decimal (AMQP's octet scale)."""
MAX_DECIMAL_TEXT: Final = 64
"""Characters of a stored decimal: far more than any encodable one needs."""
TAGS: Final = ("$bytes", "$decimal", "$time", "$table")
"""One-entry objects standing for field values JSON has no type for (and for a table that
looks like one of them), as ``protocols.amqp.mapping`` stores them."""

_INT32: Final = range(-(1 << 31), 1 << 31)
_INT64: Final = range(-(1 << 63), 1 << 63)
_TIME: Final = range(0, 1 << 32)
"""Timestamps pamqp writes as seconds and clients read back as seconds (later ones: as ms)."""
_SINGLE: Final = struct.Struct(">f")
_SKIP: Final = object()
_BAD_NAME: Final = f"a field name that is not UTF-8 of at most {MAX_NAME_BYTES} bytes"


@dataclass(slots=True)
class Conversion:
    """What converting one table did: values looked at, and what was dropped."""

    visited: int = 0
    dropped: int = 0
    """Fields dropped."""
    first_drop: tuple[str, str] | None = None
    """(field name, why) of the first field dropped."""

    @property
    def exhausted(self) -> bool:
        return self.visited >= MAX_ENTRIES

    def drop(self, name: str, why: str) -> object:
        self.dropped += 1
        if self.first_drop is None:
            self.first_drop = (name, why)
        return _SKIP


def field_table(value: object, conversion: Conversion | None = None) -> dict[str, Any]:
    """``value`` as a field table pamqp encodes without raising, within the bounds above;
    empty when ``value`` is not a mapping. A field any part of which cannot be carried is
    dropped whole, never cut into a value the sender did not write. A table stored as
    ``{"$table": {...}}`` (one whose only name is a tag) is unwrapped."""
    conversion = Conversion() if conversion is None else conversion
    if not isinstance(value, Mapping):
        conversion.drop("", "not a table")
        return {}
    inner = value.get("$table") if len(value) == 1 else None
    out: dict[str, Any] = {}
    for name, item in (inner if isinstance(inner, Mapping) else value).items():
        if conversion.exhausted:
            conversion.drop(str(name)[:MAX_NAME_BYTES], f"more than {MAX_ENTRIES} values")
            break
        if not _name_fits(name):
            conversion.drop(str(name)[:MAX_NAME_BYTES], _BAD_NAME)
            continue
        converted = _value(item, 1, name, conversion)
        if converted is not _SKIP:
            out[name] = converted
    return out


def _table(value: Mapping[Any, Any], depth: int, top: str, conversion: Conversion) -> Any:
    """A nested table, or ``_SKIP`` if any of it cannot be carried."""
    out: dict[str, Any] = {}
    for name, item in value.items():
        if not _name_fits(name):
            return conversion.drop(top, _BAD_NAME)
        converted = _value(item, depth, top, conversion)
        if converted is _SKIP:
            return _SKIP
        out[name] = converted
    return out


def _array(value: list[Any], depth: int, top: str, conversion: Conversion) -> Any:
    """An array, or ``_SKIP`` if any of it cannot be carried."""
    out = []
    for item in value:
        converted = _value(item, depth, top, conversion)
        if converted is _SKIP:
            return _SKIP
        out.append(converted)
    return out


def _value(item: Any, depth: int, top: str, conversion: Conversion) -> Any:
    """``item`` as a field value, or ``_SKIP`` (counted as dropped)."""
    if conversion.exhausted:
        return conversion.drop(top, f"more than {MAX_ENTRIES} values")
    if depth > MAX_DEPTH:
        return conversion.drop(top, f"tables or arrays nested deeper than {MAX_DEPTH}")
    conversion.visited += 1
    if item is None or isinstance(item, bool):
        return item
    if isinstance(item, int):
        return item if item in _INT64 else conversion.drop(top, "an integer past 64 bits")
    if isinstance(item, float):
        return item if _single(item) else conversion.drop(
            top, "a float that is not finite or past single precision")
    if isinstance(item, str):
        return item if _utf8_within(item, None) else conversion.drop(top, "text that is not UTF-8")
    if isinstance(item, (bytes, bytearray)):
        return bytearray(item)
    if isinstance(item, Decimal):
        return item if _decimal_fits(item) else conversion.drop(top, "a decimal AMQP cannot carry")
    if isinstance(item, datetime):
        aware = item if item.tzinfo is not None else item.replace(tzinfo=UTC)  # as pamqp reads it
        return item if int(aware.timestamp()) in _TIME else conversion.drop(
            top, "a time AMQP cannot carry")
    if not isinstance(item, (list, Mapping)):
        return conversion.drop(top, "not a field value")
    if isinstance(item, list):
        return _array(item, depth + 1, top, conversion)
    if len(item) == 1:
        (tag, inner), = item.items()
        if tag in TAGS:
            return _tagged(tag, inner, depth, top, conversion)
    return _table(item, depth + 1, top, conversion)


def _tagged(tag: str, inner: Any, depth: int, top: str, conversion: Conversion) -> Any:
    """The value a one-entry ``{tag: inner}`` object stands for."""
    if tag == "$table" and isinstance(inner, Mapping):
        return _table(inner, depth + 1, top, conversion)
    if tag == "$bytes" and isinstance(inner, str):
        try:
            return bytearray(base64.b64decode(inner, validate=True))
        except (binascii.Error, ValueError):
            return conversion.drop(top, "bytes that are not base64")
    if tag == "$decimal" and isinstance(inner, str):
        number = _decimal(inner)
        return number if number is not None else conversion.drop(
            top, "a decimal AMQP cannot carry")
    if tag == "$time" and isinstance(inner, int) and not isinstance(inner, bool) \
            and inner in _TIME:
        return datetime.fromtimestamp(inner, UTC)
    return conversion.drop(top, f"a malformed {tag} value")


def _decimal(text: str) -> Decimal | None:
    """The decimal ``text`` stands for if AMQP can carry it (see ``_decimal_fits``)."""
    if len(text) > MAX_DECIMAL_TEXT:
        return None
    try:
        number = Decimal(text)
    except (InvalidOperation, ValueError):
        return None
    return number if _decimal_fits(number) else None


def _decimal_fits(number: Decimal) -> bool:
    """Whether pamqp encodes ``number`` (a scale of 0-255 digits and a signed 32-bit
    mantissa) in constant work: it is checked here on its digits and exponent, before any
    large power of ten could be built."""
    sign, digits, exponent = number.as_tuple()
    if not isinstance(exponent, int) or len(digits) > 10 or exponent > 9:  # NaN, Infinity
        return False
    if exponent < -MAX_DECIMAL_SCALE:
        return False
    mantissa = int("".join(map(str, digits)) or "0") * 10 ** max(exponent, 0)
    return (-mantissa if sign else mantissa) in _INT32


def _single(value: float) -> bool:
    """Whether ``value`` is finite (pika, for one, reads a float as an integer and drops the
    connection on NaN or Infinity) and pamqp can write it as the single-precision float it
    writes floats as."""
    if not math.isfinite(value):
        return False
    try:
        _SINGLE.pack(value)
    except OverflowError:
        return False
    return True


def _name_fits(name: object) -> bool:
    return isinstance(name, str) and _utf8_within(name, MAX_NAME_BYTES)


def _utf8_within(text: str, limit: int | None) -> bool:
    """Whether ``text`` encodes as UTF-8 (no lone surrogates) in at most ``limit`` bytes."""
    if text.isascii():
        return limit is None or len(text) <= limit
    try:
        size = len(text.encode())
    except UnicodeEncodeError:
        return False
    return limit is None or size <= limit
