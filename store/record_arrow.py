"""Arrow arrays of record fields, cut out of the log bytes for a whole run of records at once.

Built on ``RecordColumns`` (record_columns.py), which says where every field of every record
lies: each column is copied out by one Arrow ``take`` over a binary array whose offsets are the
field boundaries (``slices``). For the Spark source (analytics/columnar.py) and the tier writer
(tier/writer.py). Needs pyarrow and numpy.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .record_columns import RecordColumns, Spans

KEYS_TYPE = pa.list_(pa.field("element", pa.string()))
PROPERTIES_TYPE = pa.map_(pa.string(), pa.string())
_NO_TAG = pa.scalar(None, pa.binary())


def slices(data: pa.Buffer, spans: Spans) -> pa.BinaryArray:
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


def keys(records: RecordColumns, data: pa.Buffer) -> pa.ListArray:
    """Every record's business keys (an empty list for none)."""
    offsets, (strings,) = records.keys()
    return pa.ListArray.from_arrays(offsets, slices(data, strings).cast(pa.string()), type=KEYS_TYPE)


def tags(data: pa.Buffer, spans: Spans) -> pa.StringArray:
    """The tag column: null for an empty tag (no tag)."""
    starts, stops = spans
    if not (stops > starts).any():
        return pa.nulls(len(starts), pa.string())
    return pc.if_else(pa.array(stops > starts), slices(data, spans), _NO_TAG).cast(pa.string())


class Properties:
    """The properties of a run, as Arrow arrays once for every column that needs them."""

    def __init__(self, records: RecordColumns, data: pa.Buffer) -> None:
        self.offsets, (names, values) = records.properties()
        self.names, self.values = slices(data, names), slices(data, values)

    def value(self, name: pa.Scalar) -> pa.BinaryArray:
        """Each record's value of property ``name`` (a binary scalar), null where it has none."""
        owner = np.repeat(np.arange(len(self.offsets) - 1), np.diff(self.offsets))
        pick = np.full(len(self.offsets) - 1, -1)
        found = np.flatnonzero(pc.equal(self.names, name).to_numpy(zero_copy_only=False))
        pick[owner[found]] = found
        return self.values.take(pa.array(pick, mask=pick < 0))

    def map(self) -> pa.MapArray:
        """Every record's properties, in the order written."""
        return pa.MapArray.from_arrays(self.offsets, self.names.cast(pa.string()),
                                       self.values.cast(pa.string()), type=PROPERTIES_TYPE)
