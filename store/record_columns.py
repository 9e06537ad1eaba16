"""Columnar decoding of record runs: where every field of thousands of records lies, at once.

For readers that turn records into columns (the Spark source). ``decode`` takes a ``RecordRun``
(``StoreView.read_runs``: validated records and the log bytes around them) and reads all its
record headers (record.py) as one numpy record array; the result says where each section of
each record lies in the run's bytes, without copying any. The keys and properties sections, a
variable number of items per record, are walked one item per step for all records together.
Decoding record by record (``record.decode``) costs microseconds of Python each; this costs a
few numpy calls per run. Imported only where columns are wanted (``StoreReader.read_columns``,
the tier writer), not on the broker's append path.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from .errors import CorruptRecordError
from .record import HEADER, HEADER_SIZE
from .record_run import RecordRun

_HEADER = np.dtype({
    "names": ["size", "magic", "version", "flags", "crc", "phys", "queue_id", "queue_offset",
              "born_ts", "store_ts", "topic_len", "msg_id_len", "tag_len", "keys_len", "props_len",
              "dispatch_len", "body_len"],
    "formats": ["<" + code for code in HEADER.format.lstrip("<")],
})
"""The record header (record.py) as a numpy record."""
assert _HEADER.itemsize == HEADER_SIZE

SECTIONS = ("topic", "msg_id", "tag", "keys", "properties", "dispatch", "body")
"""A record's sections after its header, in the order they are written."""
_LENGTHS = ("topic_len", "msg_id_len", "tag_len", "keys_len", "props_len", "dispatch_len", "body_len")
_KEY_WIDTHS = (2,)  # repeated { u16 len, key }
_PROPERTY_WIDTHS = (2, 4)  # repeated { u16 len, name, u32 len, value }
_EMPTY = np.zeros(0, np.int64)  # np.concatenate needs at least one array


class Spans(NamedTuple):
    """One field of every record: ``data[starts[i]:stops[i]]`` is record i's (int64 arrays,
    ascending and not overlapping)."""

    starts: np.ndarray
    stops: np.ndarray


class Items(NamedTuple):
    """The items of one kind of section of every record: record i holds items
    ``offsets[i]:offsets[i + 1]`` (int32, ``count + 1`` of them), in the order written, and
    ``strings[k]`` locates the k-th string of each item (keys have one, properties two: name and
    value)."""

    offsets: np.ndarray
    strings: tuple[Spans, ...]


@dataclass(frozen=True, eq=False)
class RecordColumns:
    """The records of one run of a queue, field by field. Each field is ``Spans`` into ``data``
    (strings are UTF-8); timestamps are int64 arrays of ms since the epoch."""

    data: bytes
    """The run's log bytes; every span points into them."""
    born_ts: np.ndarray
    store_ts: np.ndarray
    queue_id: np.ndarray
    """Home queue id of every record (uint32)."""
    queue_offset: np.ndarray
    """Home queue offset of every record (uint64)."""
    crc: np.ndarray
    """Every record's CRC32C from its header (uint32; ``read_runs`` checked it)."""
    base: int
    """Commit-log offset of ``data[0]``."""
    segment: str
    """The segment file the bytes came from (for error messages)."""
    _edges: np.ndarray
    """Section k of record i is ``data[_edges[k, i]:_edges[k + 1, i]]`` (k indexes SECTIONS)."""

    def __len__(self) -> int:
        return len(self.born_ts)

    def spans(self, section: str) -> Spans:
        """Where ``section`` (one of ``SECTIONS``) of every record lies."""
        k = SECTIONS.index(section)
        return Spans(self._edges[k], self._edges[k + 1])

    def keys(self) -> Items:
        """Every record's keys. Raises CorruptRecordError if a key overruns its section."""
        return self._items("keys", _KEY_WIDTHS)

    def properties(self) -> Items:
        """Every record's properties (name, value). Raises CorruptRecordError if one overruns
        its section."""
        return self._items("properties", _PROPERTY_WIDTHS)

    def _items(self, section: str, widths: tuple[int, ...]) -> Items:
        """Decode sections whose items are each a sequence of strings, every one after its
        little-endian length of the given byte width. Step k takes the k-th item of every
        record that has one."""
        begin, end = self.spans(section)
        raw = np.frombuffer(self.data, np.uint8)
        starts: list[list[np.ndarray]] = [[] for _ in widths]
        stops: list[list[np.ndarray]] = [[] for _ in widths]
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
            raise CorruptRecordError(self.base + int(begin[bad[0]]), f"its {section} overrun their section",
                                     self.segment)
        owner = np.concatenate([_EMPTY, *owners])
        order = np.argsort(owner, kind="stable")  # record by record, items in the order written
        strings = tuple(Spans(np.concatenate([_EMPTY, *first])[order], np.concatenate([_EMPTY, *last])[order])
                        for first, last in zip(starts, stops))
        offsets = np.zeros(len(begin) + 1, np.int32)
        np.cumsum(np.bincount(owner, minlength=len(begin)), out=offsets[1:])
        return Items(offsets, strings)


def decode(run: RecordRun) -> RecordColumns:
    """The records of ``run`` as columns. Raises CorruptRecordError for a record whose section
    lengths do not add up to its size (``read_runs`` checked its CRC, so only a writer bug makes
    one)."""
    starts = np.frombuffer(run.positions, np.int64)
    raw = np.frombuffer(run.data, np.uint8)
    if len(raw) >= HEADER_SIZE:
        windows = np.lib.stride_tricks.sliding_window_view(raw, HEADER_SIZE)
        head = windows[starts].view(_HEADER).ravel()  # one row copy per record
    else:
        head = np.zeros(0, _HEADER)
    edges = np.empty((len(_LENGTHS) + 1, len(starts)), np.int64)  # filled in place: a third of
    edges[0] = starts + HEADER_SIZE                                  # the time of stacking copies
    for k, name in enumerate(_LENGTHS, 1):
        edges[k] = head[name]
    np.cumsum(edges, axis=0, out=edges)
    bad = np.flatnonzero(edges[-1] != starts + head["size"])
    if bad.size:
        raise CorruptRecordError(run.base + int(starts[bad[0]]), "its section lengths do not add up "
                                 "to its size", run.segment)
    return RecordColumns(run.data, head["born_ts"], head["store_ts"], head["queue_id"], head["queue_offset"],
                         head["crc"], run.base, run.segment, edges)
