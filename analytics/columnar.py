"""Columnar decoding for the Spark source: a run of store records straight into one Arrow batch.

Decoding record by record costs microseconds of Python each. Here every step works on a whole
``RecordRun`` (``StoreView.read_runs``) at once. Each field is cut out of the log bytes for all
records by one Arrow ``take`` over a binary array whose offsets are the field boundaries (see
``_slices``): first the fixed-size headers, which numpy then reads as records, then the message
ids, tags, bodies, keys and properties they locate. Keys and properties, a variable number per
record, are walked one item per step for all records together. Records carrying a packed batch
(``sluice.batch``) are unpacked in Python, one row per body. Runs on executors; holds no state.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sluice.client.packing import BATCH_PROPERTY, unpack_bodies
from store.errors import CorruptRecordError
from store.view import RecordRun
from store.record import HEADER, HEADER_SIZE

from .schema import ARROW_SCHEMA, SUBJECT_PROPERTY

_HEADER = np.dtype({
    "names": ["size", "magic", "version", "flags", "crc", "phys", "queue_id", "queue_offset",
              "born_ts", "store_ts", "topic_len", "msg_id_len", "tag_len", "keys_len", "props_len",
              "dispatch_len", "body_len"],
    "formats": ["<" + code for code in HEADER.format.lstrip("<")],
})
"""The record header (store/record.py) as a numpy record."""
assert _HEADER.itemsize == HEADER_SIZE

_SECTIONS = ("topic_len", "msg_id_len", "tag_len", "keys_len", "props_len", "dispatch_len", "body_len")
_TOPIC, _MSG_ID, _TAG, _KEYS, _PROPS, _DISPATCH, _BODY = range(len(_SECTIONS))
_KEYS_TYPE = ARROW_SCHEMA.field("keys").type
_PROPS_TYPE = ARROW_SCHEMA.field("properties").type
_MICROS = ARROW_SCHEMA.field("born_ts").type
_EMPTY = np.zeros(0, np.int64)  # np.concatenate needs at least one array
_NO_TAG = pa.scalar(None, pa.binary())
_SUBJECT, _PACKED = (pa.scalar(name.encode(), pa.binary()) for name in (SUBJECT_PROPERTY, BATCH_PROPERTY))
_PACKED_NAME = BATCH_PROPERTY.encode()
"""Typed scalars: pyarrow spends ~100 us guessing the type of a bare Python value."""


def record_batch(run: RecordRun, topic: str, queue: int, first_offset: int,
                 columns: Sequence[str] = tuple(ARROW_SCHEMA.names)) -> pa.RecordBatch:
    """The rows of ``run``, whose first record has queue offset ``first_offset`` in ``queue`` of
    ``topic``, as a batch of ``columns`` of ``ARROW_SCHEMA`` (only those are decoded). Raises
    CorruptRecordError for a record whose sections do not add up (the store checked its CRC, so
    only a writer bug makes one)."""
    if len(run.data) >= 1 << 31:  # Arrow's binary offsets are int32; a run is a few MB
        raise ValueError(f"a run of {len(run.data)} bytes is too large for one Arrow batch")
    data = pa.py_buffer(run.data)
    head, edges = _headers(run, data)
    count = len(head)
    # A packed record names the batch property in its properties section, so a run without
    # those bytes anywhere has none: its properties need no decoding unless asked for.
    packed = _PACKED_NAME in run.data
    build = ARROW_SCHEMA.names if packed else columns
    properties = _Properties(run, data, edges) if packed or {"subject", "properties"} & set(build) else None
    builders: dict[str, Callable[[], pa.Array]] = {
        "topic": lambda: pa.repeat(pa.scalar(topic, pa.string()), count),
        "queue": lambda: pa.repeat(pa.scalar(queue, pa.int32()), count),
        "offset": lambda: pa.array(np.arange(first_offset, first_offset + count)),
        "batch_index": lambda: pa.nulls(count, pa.int32()),
        "msg_id": lambda: _slices(data, edges[_MSG_ID], edges[_MSG_ID + 1]).cast(pa.string()),
        "keys": lambda: _keys(run, data, edges),
        "tag": lambda: _tags(data, edges[_TAG], edges[_TAG + 1]),
        "subject": lambda: properties.value(_SUBJECT).cast(pa.string()),
        "properties": lambda: properties.map(),
        "body": lambda: _slices(data, edges[_BODY], edges[_BODY + 1]),
        "born_ts": lambda: pa.array(head["born_ts"] * 1000).view(_MICROS),
        "store_ts": lambda: pa.array(head["store_ts"] * 1000).view(_MICROS),
    }
    batch = pa.RecordBatch.from_arrays([builders[name]() for name in build],
                                       schema=pa.schema([ARROW_SCHEMA.field(name) for name in build]))
    if packed and pc.any(pc.equal(properties.names, _PACKED)).as_py():
        batch = _unpacked(batch, properties.value(_PACKED))
    return batch if len(build) == len(columns) else batch.select(list(columns))


class _Properties:
    """The properties sections of a run, decoded once for every column that needs them."""

    def __init__(self, run: RecordRun, data: pa.Buffer, edges: np.ndarray) -> None:
        self.offsets, (self.names, self.values) = _items(run, data, edges[_PROPS], edges[_PROPS + 1], (2, 4))

    def value(self, name: pa.Scalar) -> pa.BinaryArray:
        """Each record's value of property ``name``, null where it has none."""
        return _property(self.offsets, self.names, self.values, name)

    def map(self) -> pa.MapArray:
        return pa.MapArray.from_arrays(self.offsets, self.names.cast(pa.string()),
                                       self.values.cast(pa.string()), type=_PROPS_TYPE)


def _keys(run: RecordRun, data: pa.Buffer, edges: np.ndarray) -> pa.ListArray:
    offsets, (keys,) = _items(run, data, edges[_KEYS], edges[_KEYS + 1], (2,))
    return pa.ListArray.from_arrays(offsets, keys.cast(pa.string()), type=_KEYS_TYPE)


def _headers(run: RecordRun, data: pa.Buffer) -> tuple[np.ndarray, np.ndarray]:
    """The records' headers, and where their sections lie: section k of record i is
    ``data[edges[k, i]:edges[k + 1, i]]`` (k indexes ``_SECTIONS``)."""
    starts = np.frombuffer(run.positions, np.int64)
    head = np.frombuffer(_slices(data, starts, starts + HEADER_SIZE).buffers()[2], _HEADER, len(starts))
    edges = np.cumsum([starts + HEADER_SIZE] + [head[name].astype(np.int64) for name in _SECTIONS], axis=0)
    bad = np.flatnonzero(edges[-1] != starts + head["size"])
    if bad.size:
        raise CorruptRecordError(run.base + int(starts[bad[0]]), "its section lengths do not add up "
                                 "to its size", run.segment)
    return head, edges


def _slices(data: pa.Buffer, starts: np.ndarray, stops: np.ndarray) -> pa.BinaryArray:
    """``data[starts[i]:stops[i]]`` for every i, copied into one array.

    The ranges ascend without overlapping, so ``starts[0], stops[0], starts[1], ...`` are the
    offsets of an array over ``data`` whose even elements are the wanted values: one ``take``
    copies them out.
    """
    bounds = np.empty(2 * len(starts) + 1, np.int32)
    bounds[0:-1:2] = starts
    bounds[1::2] = stops
    bounds[-1] = stops[-1] if len(stops) else 0
    pieces = pa.Array.from_buffers(pa.binary(), len(bounds) - 1, [None, pa.py_buffer(bounds), data])
    return pieces.take(pa.array(np.arange(0, len(bounds) - 1, 2)))


def _tags(data: pa.Buffer, starts: np.ndarray, stops: np.ndarray) -> pa.StringArray:
    """The tag column: null for an empty tag (no tag)."""
    if not (stops > starts).any():
        return pa.nulls(len(starts), pa.string())
    return pc.if_else(pa.array(stops > starts), _slices(data, starts, stops), _NO_TAG).cast(pa.string())


def _items(run: RecordRun, data: pa.Buffer, begin: np.ndarray, end: np.ndarray,
           widths: tuple[int, ...]) -> tuple[np.ndarray, list[pa.BinaryArray]]:
    """Decode the sections ``[begin[i], end[i])`` whose items are each a sequence of strings,
    every one after its little-endian length of the given byte width: keys are ``(2,)``,
    properties ``(2, 4)``. Returns list offsets (items per record, int32) and one array per
    string of an item. Step k takes the k-th item of every record that has one."""
    raw = np.frombuffer(data, np.uint8)
    starts, stops = [[] for _ in widths], [[] for _ in widths]
    cursor, owners = begin.copy(), []
    active = np.flatnonzero(cursor < end)
    while active.size:
        at = cursor[active]
        for k, width in enumerate(widths):  # clip: a bad length must not index past the buffer
            length = raw.take(at[:, None] + np.arange(width), mode="clip").view(f"<u{width}").ravel()
            starts[k].append(at + width)
            at = at + width + length
            stops[k].append(at)
        owners.append(active)
        cursor[active] = at
        active = active[at < end[active]]
    bad = np.flatnonzero(cursor != end)
    if bad.size:
        raise CorruptRecordError(run.base + int(begin[bad[0]]), "its keys or properties overrun "
                                 "their section", run.segment)
    owner = np.concatenate([_EMPTY, *owners])
    order = np.argsort(owner, kind="stable")  # record by record, items in the order written
    strings = [_slices(data, np.concatenate([_EMPTY, *first])[order],
                       np.concatenate([_EMPTY, *last])[order]) for first, last in zip(starts, stops)]
    offsets = np.zeros(len(begin) + 1, np.int32)
    np.cumsum(np.bincount(owner, minlength=len(begin)), out=offsets[1:])
    return offsets, strings


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
