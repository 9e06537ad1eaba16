"""Columnar decoding for the Spark source: a run of store records straight into one Arrow batch.

Decoding record by record costs microseconds of Python each. Here every step works on a whole
run at once: the store locates every field of every record of a run (``RecordColumns``, from
``StoreReader.read_columns``), and each column is cut out of the log bytes for all records by
one Arrow ``take`` over a binary array whose offsets are the field boundaries (store/record_arrow.py).
Records carrying a packed batch (``sluice.batch``) are unpacked in Python, one row per body.
Runs on executors; holds no state.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sluice.client.packing import BATCH_PROPERTY, unpack_bodies
from store.record_arrow import Properties, keys, slices, tags

from .schema import ARROW_SCHEMA, SUBJECT_PROPERTY

if TYPE_CHECKING:
    from store.record_columns import RecordColumns

_MICROS = ARROW_SCHEMA.field("born_ts").type
_SUBJECT, _PACKED = (pa.scalar(name.encode(), pa.binary()) for name in (SUBJECT_PROPERTY, BATCH_PROPERTY))
_PACKED_NAME = BATCH_PROPERTY.encode()
"""Typed scalars: pyarrow spends ~100 us guessing the type of a bare Python value."""


def record_batch(records: RecordColumns, topic: str, queue: int, first_offset: int,
                 columns: Sequence[str] = tuple(ARROW_SCHEMA.names)) -> pa.RecordBatch:
    """The rows of ``records``, whose first has queue offset ``first_offset`` in ``queue`` of
    ``topic``, as a batch of ``columns`` of ``ARROW_SCHEMA`` (only those are decoded). Raises
    CorruptRecordError for a record whose keys or properties overrun their section."""
    if len(records.data) >= 1 << 31:  # Arrow's binary offsets are int32; a run is a few MB
        raise ValueError(f"a run of {len(records.data)} bytes is too large for one Arrow batch")
    data = pa.py_buffer(records.data)
    count = len(records)
    # A packed record names the batch property in its properties section, so a run without
    # those bytes anywhere has none: its properties need no decoding unless asked for.
    packed = _PACKED_NAME in records.data
    build = ARROW_SCHEMA.names if packed else columns
    properties = Properties(records, data) if packed or {"subject", "properties"} & set(build) else None
    builders: dict[str, Callable[[], pa.Array]] = {
        "topic": lambda: pa.repeat(pa.scalar(topic, pa.string()), count),
        "queue": lambda: pa.repeat(pa.scalar(queue, pa.int32()), count),
        "offset": lambda: pa.array(np.arange(first_offset, first_offset + count)),
        "batch_index": lambda: pa.nulls(count, pa.int32()),
        "msg_id": lambda: slices(data, records.spans("msg_id")).cast(pa.string()),
        "keys": lambda: keys(records, data),
        "tag": lambda: tags(data, records.spans("tag")),
        "subject": lambda: properties.value(_SUBJECT).cast(pa.string()),
        "properties": lambda: properties.map(),
        "body": lambda: slices(data, records.spans("body")),
        "born_ts": lambda: pa.array(records.born_ts * 1000).view(_MICROS),
        "store_ts": lambda: pa.array(records.store_ts * 1000).view(_MICROS),
    }
    batch = pa.RecordBatch.from_arrays([builders[name]() for name in build],
                                       schema=pa.schema([ARROW_SCHEMA.field(name) for name in build]))
    if packed and pc.any(pc.equal(properties.names, _PACKED)).as_py():
        batch = _unpacked(batch, properties.value(_PACKED))
    return batch if len(build) == len(columns) else batch.select(list(columns))


def _unpacked(batch: pa.RecordBatch, packed: pa.Array) -> pa.RecordBatch:
    """``batch`` with each record that carries a packed batch repeated once per body, and those
    rows' ``body`` and ``batch_index`` filled in (a Python loop: packed records are few)."""
    rows, bodies, indexes = [], [], []
    for row, (count, body) in enumerate(zip(packed.to_pylist(), batch.column("body").to_pylist())):
        parts = unpack_bodies(body) if count else [body]
        rows += [row] * len(parts)
        bodies += parts
        indexes += range(len(parts)) if count else [None]
    columns = dict(zip(ARROW_SCHEMA.names, batch.take(pa.array(rows, pa.int64())).columns))
    columns["body"] = pa.array(bodies, pa.binary())
    columns["batch_index"] = pa.array(indexes, pa.int32())
    return pa.RecordBatch.from_arrays([columns[name] for name in ARROW_SCHEMA.names], schema=ARROW_SCHEMA)
