"""Columns of the tier's Parquet files (docs/tiering.md lists them for users).

Data files hold one home topic's records of one UTC day of one segment; ``topic`` and ``day``
are not columns but the Hive partition in the path (layout.py). Index files hold one row per
message id and business key of a segment's records, sorted by (kind, value), so a lookup reads
only the row groups whose statistics admit the value.
"""
from __future__ import annotations

import pyarrow as pa

from ..record_arrow import KEYS_TYPE, PROPERTIES_TYPE

MICROS = pa.timestamp("us", tz="UTC")
DISPATCH_TYPE = pa.list_(pa.field("element", pa.struct([("topic", pa.string()), ("queue", pa.int32()),
                                                        ("offset", pa.int64())])))
DATA_SCHEMA = pa.schema([
    ("queue", pa.int32()), ("offset", pa.int64()), ("batch_index", pa.int32()), ("msg_id", pa.string()),
    ("keys", KEYS_TYPE), ("tag", pa.string()), ("subject", pa.string()), ("properties", PROPERTIES_TYPE),
    ("body", pa.binary()), ("born_ts", MICROS), ("store_ts", MICROS), ("log_offset", pa.int64()),
    ("log_size", pa.int32()), ("dispatch", DISPATCH_TYPE),
])
"""A data file's columns; files of a topic with a body schema add ``data`` (``with_data``)."""
INDEX_SCHEMA = pa.schema([
    ("kind", pa.string()), ("value", pa.string()), ("topic", pa.string()), ("log_offset", pa.int64()),
    ("store_ts", MICROS),
])
"""An index file's columns: ``kind`` is ``id`` (a message id chosen by its producer; ids the
store generated are the record's offset and are not indexed) or ``key`` (a business key);
``topic`` is the record's home topic."""
DATA_ROW_GROUP = 131072
INDEX_ROW_GROUP = 65536
COMPRESSION = "zstd"


def with_data(data_type: pa.StructType) -> pa.Schema:
    """The columns of a data file whose topic has a body schema of ``data_type``."""
    return DATA_SCHEMA.append(pa.field("data", data_type))
