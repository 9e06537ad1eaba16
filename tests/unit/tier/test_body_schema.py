"""Body schemas: JSON Schema to Arrow and Spark types, bad schemas refused with what is wrong,
bodies parsed in bulk with a null row for each body that does not parse, and only for it."""
from __future__ import annotations

import json

import pyarrow as pa
import pytest
from hypothesis import given, settings, strategies as st

from store.tier.body_schema import BodySchemaError, arrow_type, parse_bodies, spark_ddl

SCHEMA = json.dumps({"type": "object", "properties": {
    "device": {"type": "string"}, "ts": {"type": "integer"}, "temperature": {"type": "number"},
    "ok": {"type": ["boolean", "null"]}, "pos": {"type": "object", "properties": {"x": {"type": "number"}}},
    "odd name": {"type": "string"}}})


def test_types_for_arrow_and_spark() -> None:
    assert arrow_type(SCHEMA) == pa.struct([
        ("device", pa.string()), ("ts", pa.int64()), ("temperature", pa.float64()), ("ok", pa.bool_()),
        ("pos", pa.struct([("x", pa.float64())])), ("odd name", pa.string())])
    assert spark_ddl(SCHEMA) == ("device STRING, ts BIGINT, temperature DOUBLE, ok BOOLEAN, "
                                 "pos STRUCT<x: DOUBLE>, `odd name` STRING")


@pytest.mark.parametrize("schema, problem", [
    ("{", "not JSON"),
    ('{"type": "array"}', "must be an object schema"),
    ('{"type": "object"}', "non-empty \\\"properties\\\""),
    ('{"type": "object", "properties": {"a": {"type": "array"}}}', "field 'a' has type \\\"array\\\"; supported"),
    ('{"type": "object", "properties": {"a": {"type": "object", "properties": {}}}}', "field 'a' needs"),
    ('{"type": "object", "properties": {"a": 5}}', "field 'a' .* is not a schema object"),
])
def test_bad_schemas_say_what_is_wrong(schema: str, problem: str) -> None:
    with pytest.raises(BodySchemaError, match=problem):
        arrow_type(schema)


def test_each_bad_body_nulls_only_its_own_row() -> None:
    bodies = [b'{"device": "a", "ts": 1, "temperature": 2.5, "ok": true, "pos": {"x": 1}, "extra": [1]}',
              b"not json", None, b"", b'{"ts": "text"}', b'{"device": "line\\nbreak",\r\n "ts": 2}', b"[1]",
              b"5", b'{"ts": 3}{"ts": 4}', b"\xff\xfe", b'{"ts": 1.5}', b'{"temperature": 3}']
    parsed = parse_bodies(pa.array(bodies, pa.binary()), SCHEMA).to_pylist()
    blank = dict.fromkeys(["device", "ts", "temperature", "ok", "pos", "odd name"])
    assert parsed == [
        {**blank, "device": "a", "ts": 1, "temperature": 2.5, "ok": True, "pos": {"x": 1.0}},
        None, None, None, None, {**blank, "device": "line\nbreak", "ts": 2}, None, None, None, None, None,
        {**blank, "temperature": 3.0}]


@settings(max_examples=50, deadline=None)
@given(st.lists(st.one_of(st.binary(max_size=30), st.builds(
    lambda ts, device: json.dumps({"ts": ts, "device": device}).encode(),
    st.integers(-(1 << 63), (1 << 63) - 1), st.text(max_size=10))), max_size=30))
def test_valid_bodies_parse_whatever_surrounds_them(bodies: list[bytes]) -> None:
    parsed = parse_bodies(pa.array(bodies, pa.binary()), SCHEMA).to_pylist()
    assert len(parsed) == len(bodies)
    for body, row in zip(bodies, parsed):
        try:
            expected = json.loads(body)
        except ValueError:
            continue
        if isinstance(expected, dict) and set(expected) == {"ts", "device"}:
            assert row is not None and (row["ts"], row["device"]) == (expected["ts"], expected["device"])
