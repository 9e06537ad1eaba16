"""AMQP 0-9-1 field values decoded in time linear in their bytes: field tables and arrays, the
arguments of methods and the properties of content headers.

pamqp's decoder hands every value of a table the rest of the buffer as a new bytes object
(``embedded_value(value[offset:])``), so a table of N entries copies about N times its own size:
a 131 KB content header took 0.45 s, before its publish was authorized. Here every value is read
at an offset of the one frame buffer, and only the bytes of strings are copied.

Values are the ones pamqp gives, type letter by type letter (RabbitMQ's errata): ``t`` bool;
``b``/``B``, ``s``/``u``, ``I``/``i`` signed and unsigned 8, 16 and 32-bit; ``l`` and ``L``
signed 64-bit; ``f``, ``d`` floats; ``D`` a Decimal (scale octet, signed 32-bit value); ``S`` a
long string, UTF-8 text or else bytes; ``x`` a bytearray; ``T`` a UTC datetime (seconds, or
milliseconds above 2^32); ``F`` a table; ``A`` an array; ``V`` and ``\\x00`` None. Method
fields and content-header properties are decoded by the types pamqp's classes declare, into
pamqp's own method and header objects; bytes after a method's last field are ignored, as pamqp
ignores them.

Bounds: tables and arrays nest at most ``MAX_DEPTH`` levels, and one frame holds at most
``MAX_ENTRIES`` table entries and array items, nested ones included (RabbitMQ sets neither;
clients send a few dozen). Beyond them, and for anything malformed (a value running past its
table, frame or array, an unknown type letter, a table key or short string that is not UTF-8, a
timestamp no date can hold), ``FieldError``, which the codec answers with the frame's error code.
"""

from __future__ import annotations

import datetime
import decimal
import struct
from collections.abc import Callable
from typing import Any, Final

from pamqp import commands
from pamqp.base import Frame
from pamqp.header import ContentHeader

__all__ = ["MAX_DEPTH", "MAX_ENTRIES", "FieldError", "FieldReader", "content_header",
           "method_arguments", "properties"]

MAX_DEPTH: Final = 64
"""Tables and arrays nested inside one table (its own entries are at depth 1)."""
MAX_ENTRIES: Final = 4096
"""Table entries and array items in one frame, at every depth."""

_UINT32 = struct.Struct(">I")
_CONTENT_HEAD = struct.Struct(">HHQ")
_FLAGS = struct.Struct(">H")
_DECIMAL = struct.Struct(">Bi")
_TIMESTAMP = struct.Struct(">Q")
_STRUCTS: Final[dict[int, struct.Struct]] = {
    ord(letter): struct.Struct(">" + code) for letter, code in (
        ("b", "b"), ("B", "B"), ("s", "h"), ("u", "H"), ("I", "l"), ("i", "L"), ("l", "q"),
        ("L", "q"), ("f", "f"), ("d", "d"))}
"""Field value types of one fixed-size number each."""
_VOID: Final = frozenset(b"V\x00")


class FieldError(ValueError):
    """A field value is malformed or passes a bound; the text says which."""


class FieldReader:
    """Reads field values out of one frame buffer, counting table entries and array items
    against ``MAX_ENTRIES``."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.entries_left = MAX_ENTRIES

    def table(self, at: int, end: int, depth: int = 0) -> tuple[dict[str, Any], int]:
        """The field table at ``data[at]`` (its 4-byte length first), which must end by
        ``end``: (table, where it ends)."""
        table_end = self._sized(at, end, "field table")
        at += 4
        data, table = self.data, {}
        while at < table_end:
            self._count()
            key_end = at + 1 + data[at]
            if key_end >= table_end:
                raise FieldError("a field-table key runs past its table")
            key = _text(data, at + 1, key_end, "field-table key")
            table[key], at = self.value(key_end, table_end, depth + 1)
        return table, table_end

    def array(self, at: int, end: int, depth: int) -> tuple[list[Any], int]:
        """The field array at ``data[at]`` (its 4-byte length first): (items, where it ends)."""
        array_end = self._sized(at, end, "field array")
        at += 4
        items = []
        while at < array_end:
            self._count()
            item, at = self.value(at, array_end, depth + 1)
            items.append(item)
        return items, array_end

    def value(self, at: int, end: int, depth: int) -> tuple[Any, int]:
        """The typed field value at ``data[at]`` (its type letter first), within ``end``."""
        if depth > MAX_DEPTH:
            raise FieldError(f"field tables and arrays nest deeper than {MAX_DEPTH} levels")
        if at >= end:
            raise FieldError("a field value has no type")
        data, kind = self.data, self.data[at]
        at += 1
        fixed = _STRUCTS.get(kind)
        if fixed is not None:
            _need(at + fixed.size, end)
            return fixed.unpack_from(data, at)[0], at + fixed.size
        reader = _VALUES.get(kind)
        if reader is not None:
            return reader(self, at, end, depth)
        if kind in _VOID:
            return None, at
        raise FieldError(f"unknown field value type {bytes((kind,))!r}")

    def field(self, kind: str, at: int, end: int) -> tuple[Any, int]:
        """A method field or content-header property of pamqp's type name ``kind`` (every
        type but ``bit``)."""
        return _FIELDS[kind](self, at, end)

    def _sized(self, at: int, end: int, what: str) -> int:
        """Where the length-prefixed value at ``at`` ends; FieldError past ``end``."""
        _need(at + 4, end)
        stop = at + 4 + _UINT32.unpack_from(self.data, at)[0]
        if stop > end:
            raise FieldError(f"a {what} runs past what holds it")
        return stop

    def _count(self) -> None:
        self.entries_left -= 1
        if self.entries_left < 0:
            raise FieldError(f"more than {MAX_ENTRIES} field-table entries and array items in "
                             "one frame")

    # --- the value types of more than one fixed-size number ---

    def _boolean(self, at: int, end: int, depth: int) -> tuple[bool, int]:
        _need(at + 1, end)
        return bool(self.data[at]), at + 1

    def _decimal(self, at: int, end: int, depth: int) -> tuple[decimal.Decimal, int]:
        _need(at + _DECIMAL.size, end)
        scale, raw = _DECIMAL.unpack_from(self.data, at)
        return decimal.Decimal(raw) * (decimal.Decimal(10) ** -scale), at + _DECIMAL.size

    def _long_string(self, at: int, end: int, depth: int = 0) -> tuple[str | bytes, int]:
        stop = self._sized(at, end, "long string")
        raw = self.data[at + 4:stop]
        try:
            return raw.decode(), stop
        except UnicodeDecodeError:
            return raw, stop

    def _byte_array(self, at: int, end: int, depth: int) -> tuple[bytearray, int]:
        stop = self._sized(at, end, "byte array")
        return bytearray(self.data[at + 4:stop]), stop

    def _timestamp(self, at: int, end: int, depth: int = 0) -> tuple[datetime.datetime, int]:
        _need(at + 8, end)
        seconds: float = _TIMESTAMP.unpack_from(self.data, at)[0]
        if seconds > 0xFFFFFFFF:  # as pamqp reads it: beyond 2106, milliseconds
            seconds /= 1000.0
        try:
            return datetime.datetime.fromtimestamp(seconds, tz=datetime.UTC), at + 8
        except (ValueError, OverflowError, OSError):
            raise FieldError(f"timestamp {seconds} is beyond the dates Python holds") from None

    # --- method field and property types ---

    def _octet(self, at: int, end: int) -> tuple[int, int]:
        _need(at + 1, end)
        return self.data[at], at + 1

    def _short_string(self, at: int, end: int) -> tuple[str, int]:
        _need(at + 1, end)
        stop = at + 1 + self.data[at]
        _need(stop, end)
        return _text(self.data, at + 1, stop, "short string"), stop


def _number(code: str) -> Callable[[FieldReader, int, int], tuple[int, int]]:
    fixed = struct.Struct(">" + code)

    def read(reader: FieldReader, at: int, end: int) -> tuple[int, int]:
        _need(at + fixed.size, end)
        return fixed.unpack_from(reader.data, at)[0], at + fixed.size
    return read


_VALUES: Final[dict[int, Callable[..., tuple[Any, int]]]] = {
    ord("t"): FieldReader._boolean, ord("D"): FieldReader._decimal,
    ord("S"): FieldReader._long_string, ord("x"): FieldReader._byte_array,
    ord("T"): FieldReader._timestamp, ord("F"): FieldReader.table,
    ord("A"): FieldReader.array}
_FIELDS: Final[dict[str, Callable[..., tuple[Any, int]]]] = {
    "octet": FieldReader._octet, "short": _number("H"), "long": _number("L"),
    "longlong": _number("q"), "shortstr": FieldReader._short_string,
    "longstr": FieldReader._long_string, "table": FieldReader.table,
    "timestamp": FieldReader._timestamp}
"""pamqp's method and property types (``bit`` aside), read as pamqp reads them."""


def method_arguments(method: Frame, data: bytes, start: int, end: int) -> Frame:
    """``method`` (a new pamqp method) with its fields read from ``data[start:end]``; bits
    share octets as pamqp packs them, and bytes after the last field are ignored."""
    reader = FieldReader(data)
    at, bits_at, bit = start, -1, 8
    for name in method.__slots__:
        kind = method.amqp_type(name)
        if kind == "bit":
            if bit == 8:
                _need(at + 1, end)
                bits_at, at, bit = at, at + 1, 0
            value: Any = bool(data[bits_at] >> bit & 1)
            bit += 1
        else:
            bit = 8
            value, at = reader.field(kind, at, end)
        setattr(method, name, value)
    return method


_PROPERTIES: Final = tuple(
    (name, commands.Basic.Properties.flags[name], getattr(commands.Basic.Properties, "_" + name),
     "" if name == "cluster_id" else None)
    for name in commands.Basic.Properties.__slots__)
"""(name, flag, pamqp type, value when absent) of each basic property, in wire order."""
_new_properties = object.__new__
"""Properties are built as pamqp's unmarshal builds them: every field set, none validated."""


def content_header(data: bytes, start: int, end: int) -> ContentHeader:
    """The content header whose payload is ``data[start:end]``: class, weight, body size,
    property flags (in as many 16-bit words as their continuation bits say) and the
    properties they announce."""
    _need(start + _CONTENT_HEAD.size, end)
    class_id, weight, body_size = _CONTENT_HEAD.unpack_from(data, start)
    header = ContentHeader(weight, body_size, properties(data, start + _CONTENT_HEAD.size, end))
    header.class_id = class_id
    return header


def properties(data: bytes, at: int, end: int) -> commands.Basic.Properties:
    """The basic properties at ``data[at:end]``, flag words first. Every property has its
    flag in the first word; the words its continuation bit announces are read past."""
    _need(at + 2, end)
    flags = part = _FLAGS.unpack_from(data, at)[0]
    at += 2
    while part & 1:
        _need(at + 2, end)
        part = _FLAGS.unpack_from(data, at)[0]
        at += 2
    result = _new_properties(commands.Basic.Properties)
    reader = None
    for name, flag, kind, absent in _PROPERTIES:
        value: Any = absent
        if not flags & flag:
            pass  # absent: None (cluster_id: ""), as pamqp's defaults
        elif kind == "shortstr":  # most of them: read here, the hot path of every publish
            stop = at + 1 + data[at] if at < end else end + 1
            if stop > end:
                raise FieldError("a short string runs past the end of its frame")
            try:
                value, at = data[at + 1:stop].decode(), stop
            except UnicodeDecodeError:
                raise FieldError("a short string is not UTF-8") from None
        elif kind == "octet":
            if at >= end:
                raise FieldError("an octet runs past the end of its frame")
            value, at = data[at], at + 1
        else:
            reader = reader or FieldReader(data)
            value, at = reader.field(kind, at, end)
        setattr(result, name, value)
    return result


def _need(stop: int, end: int) -> None:
    if stop > end:
        raise FieldError("a field runs past the end of its frame")


def _text(data: bytes, start: int, stop: int, what: str) -> str:
    try:
        return data[start:stop].decode()
    except UnicodeDecodeError:
        raise FieldError(f"a {what} is not UTF-8") from None
