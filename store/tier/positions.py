"""Where each queue's records sit in one tiered data file: for its home queues and the queues
its records were fanned out to (dispatch targets), the queue offsets in order with each
record's log offset, size and store time. Built from a few small columns of the whole file."""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .manifest import TieredFile
from .rebuild import TierDataError

COLUMNS = ("queue", "offset", "log_offset", "log_size", "store_ts", "dispatch")


class Positions(NamedTuple):
    """One queue's records in one file, by queue offset."""

    offsets: np.ndarray
    logs: np.ndarray
    sizes: np.ndarray
    stamps: np.ndarray
    """Store times, ms."""


def build(file: TieredFile, table: pa.Table) -> tuple[dict[tuple[str, int], Positions], int]:
    """Every queue's positions in ``file`` (read as ``table``, the ``COLUMNS``) and their bytes."""
    for name in COLUMNS:
        if table.column(name).null_count:
            raise TierDataError(file.key, f"column {name} holds nulls")
    logs = _ints(table, "log_offset")
    if len(logs) == 0:
        return {}, 0
    if np.any(np.diff(logs) < 0) or logs[0] < file.log_first or logs[-1] > file.log_last:
        raise TierDataError(file.key, "its rows are not sorted by log offset within the manifest's "
                                      f"range [{file.log_first}, {file.log_last}]")
    first = np.flatnonzero(np.r_[True, np.diff(logs) != 0])  # a record's first row
    logs, sizes = logs[first], _ints(table, "log_size")[first]
    stamps = _ints(table, "store_ts")[first] // 1000
    out: dict[tuple[str, int], Positions] = {}
    _group(file.key, out, [file.topic], np.zeros(len(first), np.int64), _ints(table, "queue")[first],
           _ints(table, "offset")[first], logs, sizes, stamps)
    targets = table.column("dispatch").combine_chunks().take(pa.array(first))
    flat = pc.list_flatten(targets)
    if len(flat):
        if flat.null_count or any(flat.field(name).null_count for name in ("topic", "queue", "offset")):
            raise TierDataError(file.key, "a dispatch target holds nulls")
        owner = pc.list_parent_indices(targets).to_numpy()
        topics = flat.field("topic").dictionary_encode()
        _group(file.key, out, topics.dictionary.to_pylist(), topics.indices.to_numpy(),
               flat.field("queue").to_numpy().astype(np.int64), flat.field("offset").to_numpy().astype(np.int64),
               logs[owner], sizes[owner], stamps[owner])
    return out, sum(p.offsets.nbytes * 4 + 100 for p in out.values())


def _ints(table: pa.Table, name: str) -> np.ndarray:
    column = table.column(name)
    if pa.types.is_timestamp(column.type):
        column = column.cast(pa.int64())
    return column.to_numpy().astype(np.int64)


def _group(file_key: str, out: dict[tuple[str, int], Positions], names: list[str], codes: np.ndarray, queues: np.ndarray,
           offsets: np.ndarray, logs: np.ndarray, sizes: np.ndarray, stamps: np.ndarray) -> None:
    """Add records to their queues (topic ``names[codes[i]]``, ``queues[i]``), sorted by queue offset."""
    group = codes.astype(np.int64) << 32 | (queues & 0xFFFFFFFF)
    order = np.lexsort((offsets, group))
    group = group[order]
    bounds = np.flatnonzero(np.r_[True, np.diff(group) != 0, True])
    for start, stop in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        rows = order[start:stop]
        key = (names[int(group[start] >> 32)], int(queues[rows[0]]))
        found = Positions(offsets[rows], logs[rows], sizes[rows], stamps[rows])
        if np.any(np.diff(found.logs) <= 0):
            raise TierDataError(file_key, f"queue {key[1]} of {key[0]}: its offsets do not grow with the log "
                                          "offsets of their records, as the log assigns them")
        if key in out:
            merged = [np.concatenate((a, b)) for a, b in zip(out[key], found)]
            again = np.argsort(merged[0], kind="stable")
            found = Positions(*(column[again] for column in merged))
        out[key] = found
