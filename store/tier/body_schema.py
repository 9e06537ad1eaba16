"""A topic's body schema: a flat JSON Schema document turned into typed columns.

A schema is an object with ``properties``, each of type ``string`` (-> string), ``integer``
(-> int64), ``number`` (-> float64), ``boolean`` (-> bool) or ``object`` (-> struct, its own
``properties`` in turn); ``["<type>", "null"]`` is accepted too, every field being nullable
anyway. Bodies are parsed in bulk by Arrow's C++ JSON reader; a body that is not a JSON object
of those types gives a null row, and only that row.
"""
from __future__ import annotations

import json
import re
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.json as pa_json

_TYPES = {"string": pa.string(), "integer": pa.int64(), "number": pa.float64(), "boolean": pa.bool_()}
_DDL = {"string": "STRING", "integer": "BIGINT", "number": "DOUBLE", "boolean": "BOOLEAN"}
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_MAX_DEPTH = 16
_CHUNK_BYTES = 8 << 20
"""Bodies parsed by one call of the JSON reader, about (its block holds them all)."""


class BodySchemaError(ValueError):
    """A body schema that cannot be used; says what is wrong."""


def _load(schema_text: str) -> dict[str, Any]:
    try:
        schema = json.loads(schema_text)
    except (ValueError, RecursionError) as error:
        raise BodySchemaError(f"the body schema is not JSON: {str(error)[:200]}") from None
    _check_object(schema, "the body schema", 0)
    return schema


def _check_object(schema: Any, where: str, depth: int) -> None:
    if depth > _MAX_DEPTH:
        raise BodySchemaError(f"{where} nests objects more than {_MAX_DEPTH} deep")
    if not isinstance(schema, dict) or schema.get("type") not in ("object", ["object", "null"], ["null", "object"]):
        raise BodySchemaError(f'{where} must be an object schema: {{"type": "object", "properties": {{...}}}}')
    properties = schema.get("properties")
    if not isinstance(properties, dict) or not properties:
        raise BodySchemaError(f"{where} needs a non-empty \"properties\" object naming the fields")
    for name, field in properties.items():
        if not name:
            raise BodySchemaError(f"{where} has a field with an empty name")
        if not isinstance(field, dict):
            raise BodySchemaError(f"field {name!r} of {where} is not a schema object")
        kind = _kind(field, f"field {name!r}")
        if kind == "object":
            _check_object(field, f"field {name!r}", depth + 1)


def _kind(field: dict[str, Any], where: str) -> str:
    """The field's type name: one of _TYPES or "object"."""
    kind = field.get("type")
    if isinstance(kind, list) and len(kind) == 2 and "null" in kind:
        kind = kind[0] if kind[1] == "null" else kind[1]
    if kind not in (*_TYPES, "object"):
        raise BodySchemaError(f"{where} has type {json.dumps(kind)}; supported: string, integer, number, "
                              "boolean, object (optionally with \"null\")")
    return kind


def _arrow(schema: dict[str, Any]) -> pa.StructType:
    fields = []
    for name, field in schema["properties"].items():
        kind = _kind(field, name)
        fields.append(pa.field(name, _arrow(field) if kind == "object" else _TYPES[kind]))
    return pa.struct(fields)


def _ddl(schema: dict[str, Any], separator: str) -> str:
    parts = []
    for name, field in schema["properties"].items():
        kind = _kind(field, name)
        quoted = name if _IDENTIFIER.fullmatch(name) else "`" + name.replace("`", "``") + "`"
        spark_type = "STRUCT<" + _ddl(field, ": ") + ">" if kind == "object" else _DDL[kind]
        parts.append(f"{quoted}{separator}{spark_type}")
    return ", ".join(parts)


def arrow_type(schema_text: str) -> pa.StructType:
    """The struct type of ``data`` for this schema; BodySchemaError if it cannot be used."""
    return _arrow(_load(schema_text))


def spark_ddl(schema_text: str) -> str:
    """The schema as Spark DDL: ``device STRING, ts BIGINT, temperature DOUBLE, ok BOOLEAN``."""
    return _ddl(_load(schema_text), " ")


def parse_bodies(bodies: pa.BinaryArray, schema_text: str) -> pa.StructArray:
    """Each body parsed by the schema; a null row where the body is null or does not parse."""
    kind = arrow_type(schema_text)
    values = bodies.to_pylist()
    lines, bad = [], np.zeros(len(values), bool)
    for row, body in enumerate(values):
        # raw CR/LF can only be whitespace between tokens in valid JSON: one body, one line
        line = body.replace(b"\r", b" ").replace(b"\n", b" ") if body else b""
        if not line.strip():
            line, bad[row] = b"{}", True
        lines.append(line)
    schema = pa.schema(list(kind))
    parts, start, size = [], 0, 0
    for end, line in enumerate(lines, 1):
        size += len(line) + 1
        if size >= _CHUNK_BYTES or end == len(lines):
            parts.append(_parse(lines, start, end, schema, bad))
            start, size = end, 0
    if not parts:
        return pa.array([], kind)
    parsed = pa.concat_arrays(parts)
    mask = np.logical_or(bad, parsed.is_null().to_numpy(zero_copy_only=False))
    return pa.StructArray.from_arrays(parsed.flatten(), fields=list(kind), mask=pa.array(mask))


def _parse(lines: list[bytes], start: int, end: int, schema: pa.Schema, bad: np.ndarray) -> pa.StructArray:
    """Rows ``start:end`` parsed with one reader call if they all parse, else halves in turn
    (a bad body costs a few parses of shrinking blocks, never the others their values)."""
    block = b"\n".join(lines[start:end]) + b"\n"
    try:
        table = pa_json.read_json(pa.BufferReader(block),
                                  read_options=pa_json.ReadOptions(block_size=len(block) + 1, use_threads=False),
                                  parse_options=pa_json.ParseOptions(explicit_schema=schema,
                                                                     unexpected_field_behavior="ignore"))
        if table.num_rows == end - start:
            return table.to_struct_array().combine_chunks() if table.num_rows else pa.array([], pa.struct(list(schema)))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        pass
    if end - start == 1:
        bad[start] = True
        return pa.nulls(1, pa.struct(list(schema)))
    middle = (start + end) // 2
    return pa.concat_arrays([_parse(lines, start, middle, schema, bad), _parse(lines, middle, end, schema, bad)])
