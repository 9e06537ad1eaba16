"""Columnar decoding for the Spark source: a run of store records straight into one Arrow batch.

Decoding record by record costs microseconds of Python each. Here every step works on a whole
run at once: the store locates every field of every record of a run (``RecordColumns``, from
``StoreReader.read_columns``), and each column is cut out of the log bytes for all records by
one Arrow ``take`` over a binary array whose offsets are the field boundaries (see ``_slices``).
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

from .schema import ARROW_SCHEMA, SUBJECT_PROPERTY

if TYPE_CHECKING:
    from store.record_columns import RecordColumns, Spans

_KEYS_TYPE = ARROW_SCHEMA.field("keys").type
_PROPS_TYPE = ARROW_SCHEMA.field("properties").type
_MICROS = ARROW_SCHEMA.field("born_ts").type
_NO_TAG = pa.scalar(None, pa.binary())
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
    properties = _Properties(records, data) if packed or {"subject", "properties"} & set(build) else None
    builders: dict[str, Callable[[], pa.Array]] = {
        "topic": lambda: pa.repeat(pa.scalar(topic, pa.string()), count),
        "queue": lambda: pa.repeat(pa.scalar(queue, pa.int32()), count),
        "offset": lambda: pa.array(np.arange(first_offset, first_offset + count)),
        "batch_index": lambda: pa.nulls(count, pa.int32()),
        "msg_id": lambda: _slices(data, records.spans("msg_id")).cast(pa.string()),
        "keys": lambda: _keys(records, data),
        "tag": lambda: _tags(data, records.spans("tag")),
        "subject": lambda: properties.value(_SUBJECT).cast(pa.string()),
        "properties": lambda: properties.map(),
        "body": lambda: _slices(data, records.spans("body")),
        "born_ts": lambda: pa.array(records.born_ts * 1000).view(_MICROS),
        "store_ts": lambda: pa.array(records.store_ts * 1000).view(_MICROS),
    }
    batch = pa.RecordBatch.from_arrays([builders[name]() for name in build],
                                       schema=pa.schema([ARROW_SCHEMA.field(name) for name in build]))
    if packed and pc.any(pc.equal(properties.names, _PACKED)).as_py():
        batch = _unpacked(batch, properties.value(_PACKED))
    return batch if len(build) == len(columns) else batch.select(list(columns))


class _Properties:
    """The properties of a run, as Arrow arrays once for every column that needs them."""

    def __init__(self, records: RecordColumns, data: pa.Buffer) -> None:
        self.offsets, (names, values) = records.properties()
        self.names, self.values = _slices(data, names), _slices(data, values)

    def value(self, name: pa.Scalar) -> pa.BinaryArray:
        """Each record's value of property ``name``, null where it has none."""
        return _property(self.offsets, self.names, self.values, name)

    def map(self) -> pa.MapArray:
        return pa.MapArray.from_arrays(self.offsets, self.names.cast(pa.string()),
                                       self.values.cast(pa.string()), type=_PROPS_TYPE)


def _keys(records: RecordColumns, data: pa.Buffer) -> pa.ListArray:
    offsets, (keys,) = records.keys()
    return pa.ListArray.from_arrays(offsets, _slices(data, keys).cast(pa.string()), type=_KEYS_TYPE)


def _slices(data: pa.Buffer, spans: Spans) -> pa.BinaryArray:
    """``data[starts[i]:stops[i]]`` for every i, copied into one array.

    The ranges ascend without overlapping, so ``starts[0], stops[0], starts[1], ...`` are the
    offsets of an array over ``data`` whose even elements are the wanted values: one ``take``
    copies them out.
    """
    starts, stops = spans
    bounds = np.empty(2 * len(starts) + 1, np.int32)
    bounds[0:-1:2] = starts
    bounds[1::2] = stops
    bounds[-1] = stops[-1] if len(stops) else 0
    pieces = pa.Array.from_buffers(pa.binary(), len(bounds) - 1, [None, pa.py_buffer(bounds), data])
    return pieces.take(pa.array(np.arange(0, len(bounds) - 1, 2)))


def _tags(data: pa.Buffer, spans: Spans) -> pa.StringArray:
    """The tag column: null for an empty tag (no tag)."""
    starts, stops = spans
    if not (stops > starts).any():
        return pa.nulls(len(starts), pa.string())
    return pc.if_else(pa.array(stops > starts), _slices(data, spans), _NO_TAG).cast(pa.string())


def _property(offsets: np.ndarray, names: pa.BinaryArray, values: pa.BinaryArray, name: pa.Scalar) -> pa.BinaryArray:
    """Each record's value of property ``name``, null where it has none."""
    owner = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
    pick = np.full(len(offsets) - 1, -1)
    found = np.flatnonzero(pc.equal(names, name).to_numpy(zero_copy_only=False))
    pick[owner[found]] = found
    return values.take(pa.array(pick, mask=pick < 0))


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
