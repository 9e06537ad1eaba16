"""A run of validated records read with one pread of the log: what ``StoreView.read_runs``
returns and ``record_columns.decode`` turns into columns."""
from __future__ import annotations

from array import array
from typing import NamedTuple


class RecordRun(NamedTuple):
    """Validated records of one queue read with one pread of the log (``StoreView.read_runs``)."""

    data: bytes
    """The log bytes from ``base``: the records, and whatever lies between them."""
    base: int
    """Commit-log offset of ``data[0]``."""
    positions: array
    """``array("q")``: where each record starts in ``data``, in queue order."""
    segment: str
    """Name of the segment file the bytes came from (for error messages)."""
