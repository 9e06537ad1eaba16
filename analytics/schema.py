"""The ``sluice`` source's columns: one definition for Spark (DDL) and for Arrow."""

from __future__ import annotations

import pyarrow as pa

SUBJECT_PROPERTY = "sluice.subject"

COLUMN_TYPES = {
    "topic": "string", "queue": "int", "offset": "bigint", "batch_index": "int",
    "msg_id": "string", "keys": "array<string>", "tag": "string", "subject": "string",
    "properties": "map<string,string>", "body": "binary", "born_ts": "timestamp",
    "store_ts": "timestamp",
}
"""Column -> Spark type, as ``DataType.simpleString()`` spells it."""

SCHEMA = ", ".join(f"{name} {kind}" for name, kind in COLUMN_TYPES.items())

ARROW_SCHEMA = pa.schema([
    ("topic", pa.string()), ("queue", pa.int32()), ("offset", pa.int64()),
    ("batch_index", pa.int32()), ("msg_id", pa.string()), ("keys", pa.list_(pa.field("element", pa.string()))),
    ("tag", pa.string()), ("subject", pa.string()), ("properties", pa.map_(pa.string(), pa.string())),
    ("body", pa.binary()), ("born_ts", pa.timestamp("us", tz="UTC")),
    ("store_ts", pa.timestamp("us", tz="UTC")),
])
"""Exactly the Arrow types Spark expects for ``SCHEMA`` (it refuses any other)."""
assert ARROW_SCHEMA.names == list(COLUMN_TYPES)
