"""Retention: delete whole commit-log segments, oldest first, past an age or total-size limit.

The active (newest) segment is never deleted, nor, in a tiered store (``tier_floor``), one not
yet wholly in the tier: an object store that is down keeps segments on disk. Compacted topics
are compacted first, so their newest value per key outlives the segments it came from. Consume
queues then drop files that only point below the new log start and report their new earliest
offsets; the key index drops files the same way. Runs under the store's cycle lock (no flusher batch in flight).
"""
from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from .api import RetentionReport, StoreConfig


class Retainable(Protocol):
    """The parts of a file store retention works on (``FileStore`` has them)."""

    log: Any
    compaction: Any
    dispatcher: Any
    consume_queues: Iterable[Any]
    key_index: Any
    tier_floor: Callable[[], int] | None


def expired_segments(segments: list[tuple[int, int, float]], config: StoreConfig, now_ms: int,
                     dispatched_end: int, tiered_end: int | None = None) -> int:
    """How many of the oldest segments, given as (size, end offset, last write in ms), must go:
    never one ending past ``dispatched_end`` or, for a tiered store, past ``tiered_end``."""
    total = sum(size for size, _, _ in segments)
    count = 0
    for size, end, written_ms in segments[:-1]:
        too_old = config.retention_max_age_ms is not None and now_ms - written_ms > config.retention_max_age_ms
        too_big = config.retention_max_bytes is not None and total > config.retention_max_bytes
        if not (too_old or too_big) or end > dispatched_end or (tiered_end is not None and end > tiered_end):
            break
        total -= size
        count += 1
    return count


def apply_retention(store: Retainable, config: StoreConfig, now_ms: int | None = None) -> RetentionReport:
    """Apply the limits of ``config`` to ``store`` once."""
    now = int(time.time() * 1000) if now_ms is None else now_ms
    report = RetentionReport(log_min_offset=store.log.min_offset)
    segments = [(s.size, s.end, os.fstat(s.fd).st_mtime * 1000) for s in store.log.segments()]
    floor = store.tier_floor
    count = expired_segments(segments, config, now, store.dispatcher.dispatched_end,
                             None if floor is None else floor())
    if not count:
        return report
    for topic in store.compaction.topics:
        store.compaction.compact(topic)
    for _ in range(count):
        segment = store.log.delete_oldest()
        report.deleted_segments.append(segment.name)
        report.deleted_bytes += segment.size
    report.log_min_offset = store.log.min_offset
    for queue in store.consume_queues:
        queue.delete_before(report.log_min_offset)
    store.key_index.delete_before(report.log_min_offset)
    return report
