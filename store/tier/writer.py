"""One sealed commit-log segment as Parquet: a data file per (home topic, UTC day of store_ts)
and the segment's key-index file (columns: schema.py; names: layout.py).

Records are located by one scan of the segment's bytes (every record's CRC is checked; corrupt
spans are skipped and logged), then decoded column by column for all of them at once
(record_columns.py, record_arrow.py). A record carrying a packed batch (``sluice.batch``) gives
one row per body, ``batch_index`` numbering them; every other column repeats. A topic with a
body schema gets a ``data`` column, each body parsed by it (null where it does not parse).
Pure: bytes in, bytes out; the tierer uploads them.
"""
from __future__ import annotations

import io
import logging
import struct
from array import array
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from crc32c import crc32c

from .. import record, record_arrow
from ..record_columns import RecordColumns, decode
from ..view import RecordRun
from . import body_schema as schemas
from . import layout, packing
from .manifest import QueueSpan, TieredFile
from .schema import (COMPRESSION, DATA_ROW_GROUP, DATA_SCHEMA, DISPATCH_TYPE, INDEX_ROW_GROUP, INDEX_SCHEMA,
                     MICROS, with_data)

log = logging.getLogger(__name__)

_DAY_MS = 86_400_000
_SUBJECT = pa.scalar(b"sluice.subject", pa.binary())
_PACKED = pa.scalar(packing.BATCH_PROPERTY.encode(), pa.binary())
_DISPATCH_ITEM = DISPATCH_TYPE.value_type
_PREFIX = struct.Struct("<I4sIQ")  # total_size, magic + version + flags, crc32c, phys_offset
_MARK = record.MAGIC_BYTES + b"\0"  # flags must be 0
_HEX = np.frombuffer(b"0123456789ABCDEF", np.uint8)


@dataclass(frozen=True)
class DataFile:
    """One Parquet data file and what the manifest says of it."""

    info: TieredFile
    parquet: bytes


@dataclass(frozen=True)
class SegmentFiles:
    """The Parquet files of one segment."""

    files: tuple[DataFile, ...]
    index: bytes
    """The key-index file."""
    records: int


def record_positions(data: bytes, base: int, name: str) -> array:
    """Where each valid record of a segment's bytes starts; corrupt spans are logged and skipped.
    Checks what ``record.check`` checks (whole, magic, version, flags, offset, CRC32C) as one
    tuple compare per record: this loop runs once per record of the segment."""
    positions = array("q")
    append, unpack, view, end, pos = positions.append, _PREFIX.unpack_from, memoryview(data), len(data), 0
    while pos + record.HEADER_SIZE <= end:
        size = unpack(data, pos)[0]
        if record.HEADER_SIZE <= size and pos + size <= end and \
                unpack(data, pos) == (size, _MARK, crc32c(view[pos + 12:pos + size]), base + pos):
            append(pos)
            pos += size
            continue
        following = record.find_valid(data, pos, base)
        stop = end if following is None else following
        log.warning("segment %s: corrupt bytes at commit-log offsets %d to %d are not tiered", name,
                    base + pos, base + stop)
        pos = stop
    if pos < end:
        log.warning("segment %s: a truncated record at commit-log offset %d is not tiered", name, base + pos)
    return positions


def write_segment(data: bytes, base: int, name: str,
                  body_schema: Callable[[str], str | None] = lambda topic: None) -> SegmentFiles:
    """The Parquet files of the segment whose bytes, from commit-log offset ``base``, are ``data``."""
    positions = record_positions(data, base, name)
    columns = decode(RecordRun(data, base, positions, name))
    buffer = pa.py_buffer(data)
    topics = record_arrow.slices(buffer, columns.spans("topic")).cast(pa.string())
    log_offsets = base + np.frombuffer(positions, np.int64)
    table, record_of_row = _rows(columns, buffer, log_offsets, positions)
    files = []
    days = columns.store_ts // _DAY_MS
    topic_codes = pc.dictionary_encode(topics)
    codes = topic_codes.indices.to_numpy(zero_copy_only=False)
    for code, topic in enumerate(topic_codes.dictionary.to_pylist()):
        for day in np.unique(days[codes == code]):
            in_file = (codes == code) & (days == day)
            files.append(_data_file(table, record_of_row, in_file, columns, log_offsets, topic, int(day), base,
                                    body_schema))
    return SegmentFiles(tuple(files), _index(columns, buffer, topics, log_offsets), len(columns))


def _rows(columns: RecordColumns, buffer: pa.Buffer, log_offsets: np.ndarray,
          positions: array) -> tuple[pa.Table, np.ndarray]:
    """Every record's row (rows per body for packed batches), and the record of each row."""
    count = len(columns)
    properties = record_arrow.Properties(columns, buffer)
    body = record_arrow.slices(buffer, columns.spans("body"))
    sizes = columns.spans("body").stops - np.frombuffer(positions, np.int64)
    table = pa.table([
        pa.array(columns.queue_id.astype(np.int32)), pa.array(columns.queue_offset.astype(np.int64)),
        pa.nulls(count, pa.int32()),
        record_arrow.slices(buffer, columns.spans("msg_id")).cast(pa.string()),
        record_arrow.keys(columns, buffer), record_arrow.tags(buffer, columns.spans("tag")),
        properties.value(_SUBJECT).cast(pa.string()), properties.map(), body,
        pa.array(columns.born_ts * 1000).view(MICROS), pa.array(columns.store_ts * 1000).view(MICROS),
        pa.array(log_offsets), pa.array(sizes.astype(np.int32)), pa.array(columns.crc.astype(np.int64)),
        _dispatch(columns, buffer),
    ], schema=DATA_SCHEMA)
    record_of_row = np.arange(count)
    packed = properties.value(_PACKED)
    if packed.null_count < count:
        table, record_of_row = _unpacked(table, packed)
    return table, record_of_row


def _unpacked(table: pa.Table, packed: pa.Array) -> tuple[pa.Table, np.ndarray]:
    """``table`` with each record holding a well-formed packed batch repeated once per body,
    those rows' ``body`` and ``batch_index`` filled in (a Python loop over packed records only)."""
    count = len(table)
    body_column = table.column("body").combine_chunks()
    repeats = np.ones(count, np.int64)
    pieces: list[bytes] = []
    for row in np.flatnonzero(packed.is_valid().to_numpy(zero_copy_only=False)):
        parts = packing.unpack(body_column[int(row)].as_py())
        if parts is not None:
            repeats[row] = -len(parts)  # negative: unpacked into that many rows
            pieces += parts
    if (repeats > 0).all():
        return table, np.arange(count)
    sizes = np.abs(repeats)
    record_of_row = np.repeat(np.arange(count), sizes)
    expanded = np.repeat(repeats < 0, sizes)
    first_row = np.cumsum(sizes) - sizes
    batch_index = np.arange(len(record_of_row)) - first_row[record_of_row]
    pick = record_of_row.copy()  # a whole body: the record's own; a packed one: its piece
    pick[expanded] = count + np.arange(len(pieces))
    body = pa.concat_arrays([body_column, pa.array(pieces, pa.binary())]).take(pa.array(pick))
    result = table.take(pa.array(record_of_row))
    result = result.set_column(DATA_SCHEMA.get_field_index("body"), DATA_SCHEMA.field("body"), body)
    result = result.set_column(DATA_SCHEMA.get_field_index("batch_index"), DATA_SCHEMA.field("batch_index"),
                               pa.array(batch_index.astype(np.int32), mask=~expanded))
    return result, record_of_row


def _dispatch(columns: RecordColumns, buffer: pa.Buffer) -> pa.ListArray:
    """Every record's extra queues (fan-out targets), decoded in Python for those that have any."""
    starts, stops = columns.spans("dispatch")
    offsets = np.zeros(len(starts) + 1, np.int32)
    topics: list[str] = []
    queues: list[int] = []
    queue_offsets: list[int] = []
    data = columns.data
    for row in np.flatnonzero(stops > starts):
        for topic, queue, offset in record.iter_dispatch(data[starts[row]:stops[row]]):
            topics.append(topic)
            queues.append(queue)
            queue_offsets.append(offset)
        offsets[row + 1] = len(topics)
    np.maximum.accumulate(offsets, out=offsets)
    items = pa.StructArray.from_arrays([pa.array(topics, pa.string()), pa.array(queues, pa.int32()),
                                        pa.array(queue_offsets, pa.int64())], fields=list(_DISPATCH_ITEM))
    return pa.ListArray.from_arrays(pa.array(offsets), items, type=DISPATCH_TYPE)


def _data_file(table: pa.Table, record_of_row: np.ndarray, in_file: np.ndarray, columns: RecordColumns,
               log_offsets: np.ndarray, topic: str, day: int, base: int,
               body_schema: Callable[[str], str | None]) -> DataFile:
    """The data file of one topic and day: its rows, and the manifest's account of it."""
    rows = table.filter(pa.array(in_file[record_of_row]))
    schema_text = body_schema(topic)
    if schema_text is not None:
        data = schemas.parse_bodies(rows.column("body").combine_chunks(), schema_text)
        rows = rows.append_column(with_data(data.type).field("data"), data)
    sink = io.BytesIO()
    # One chunk per column: written from many small chunks, a column chunk holds many small
    # pages, which Spark's vectorized reader reads markedly slower (about 1.4x here).
    pq.write_table(rows.combine_chunks(), sink, compression=COMPRESSION, row_group_size=DATA_ROW_GROUP,
                   write_page_checksum=True)
    parquet = sink.getvalue()
    picked = np.flatnonzero(in_file)
    mine = log_offsets[picked]
    store_ts = columns.store_ts[picked]
    day_text = layout.day_of(day * _DAY_MS)
    info = TieredFile(layout.data_key(topic, day_text, base), topic, base, day_text, rows.num_rows, len(parquet),
                      int(mine[0]), int(mine[-1]), int(store_ts.min()), int(store_ts.max()),
                      _spans(topic, columns, picked, rows), schema_text)
    return DataFile(info, parquet)


def _spans(topic: str, columns: RecordColumns, picked: np.ndarray, rows: pa.Table) -> tuple[QueueSpan, ...]:
    """The queue offsets a file holds: its records' home queues and their fan-out targets."""
    spans: dict[tuple[str, int], tuple[int, int]] = {}
    queues, offsets = columns.queue_id[picked], columns.queue_offset[picked]
    for queue in np.unique(queues):
        mine = offsets[queues == queue]
        spans[(topic, int(queue))] = (int(mine.min()), int(mine.max()))
    dispatch = rows.column("dispatch").combine_chunks().flatten()
    if len(dispatch):
        for target in pa.table({"topic": dispatch.field("topic"), "queue": dispatch.field("queue"),
                                "offset": dispatch.field("offset")}).group_by(["topic", "queue"]).aggregate(
                [("offset", "min"), ("offset", "max")]).to_pylist():
            key = (target["topic"], target["queue"])
            first, last = spans.get(key, (target["offset_min"], target["offset_max"]))
            spans[key] = (min(first, target["offset_min"]), max(last, target["offset_max"]))
    return tuple(QueueSpan(t, q, first, last) for (t, q), (first, last) in sorted(spans.items()))


def _generated_ids(log_offsets: np.ndarray) -> pa.StringArray:
    """The id the store generates for a record at each offset: 16 uppercase hex digits."""
    digits = (log_offsets[:, None] >> np.arange(60, -4, -4)) & 0xF
    text = _HEX[digits.astype(np.intp)].tobytes()
    bounds = np.arange(0, 16 * len(log_offsets) + 1, 16, dtype=np.int32)
    return pa.Array.from_buffers(pa.string(), len(log_offsets), [None, pa.py_buffer(bounds), pa.py_buffer(text)])


def _index(columns: RecordColumns, buffer: pa.Buffer, topics: pa.StringArray, log_offsets: np.ndarray) -> bytes:
    """The key-index file: a row per producer-chosen message id and per business key."""
    msg_ids = record_arrow.slices(buffer, columns.spans("msg_id")).cast(pa.string())
    chosen = np.flatnonzero(pc.not_equal(msg_ids, _generated_ids(log_offsets)).to_numpy(zero_copy_only=False))
    key_offsets, _ = columns.keys()
    key_values = record_arrow.keys(columns, buffer).flatten()
    key_owner = np.repeat(np.arange(len(columns)), np.diff(key_offsets))
    owners = np.concatenate([chosen, key_owner]).astype(np.int64)
    store_ts = pa.array(columns.store_ts * 1000).view(MICROS)
    table = pa.table([
        pa.array(["id"] * len(chosen) + ["key"] * len(key_owner), pa.string()),
        pa.concat_arrays([msg_ids.take(pa.array(chosen, pa.int64())), key_values]),
        topics.take(pa.array(owners)), pa.array(log_offsets[owners]), store_ts.take(pa.array(owners)),
    ], schema=INDEX_SCHEMA)
    table = table.sort_by([("kind", "ascending"), ("value", "ascending"), ("topic", "ascending"),
                           ("log_offset", "descending")])
    sink = io.BytesIO()
    pq.write_table(table, sink, compression=COMPRESSION, row_group_size=INDEX_ROW_GROUP, write_page_checksum=True)
    return sink.getvalue()
