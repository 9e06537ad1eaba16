"""Tiering a test store with the real Tierer, and the records of a segment as the log holds them."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

from store import record
from store.tier import writer
from store.tier.manifest import Manifest
from store.tier.tierer import Tierer


def tier_segments(store, objects, count: int) -> Manifest:
    """Tier up to ``count`` more sealed segments of ``store`` into ``objects`` (the newest
    manifest); local retention then keeps what is not tiered, as in the broker."""
    tierer = Tierer(store, objects)
    for _ in range(count):
        if tierer.tier_once() is None:
            break
    store.tier_floor = lambda: tierer.tiered_end
    return tierer.manifest


@contextlib.contextmanager
def row_groups(rows: int) -> Iterator[None]:
    """Data and index files written with row groups of ``rows`` (many groups in small tests)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(writer, "DATA_ROW_GROUP", rows)
        patch.setattr(writer, "INDEX_ROW_GROUP", rows)
        yield


def segment_records(store, segment) -> list[record.StoredMessage]:
    """Every record of ``segment``, in log order."""
    data, _ = store.log.read(segment.base, segment.size)
    return [record.decode(data, pos, segment.base + pos) for kind, pos, size
            in record.scan(data, segment.base, last=False) if kind == "record"]
