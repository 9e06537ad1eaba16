"""Crash recovery: scan the log from the checkpoint, validate, truncate a torn tail, rebuild.

After a clean shutdown the checkpoint matches the files and nothing is scanned. Otherwise
every record from the checkpoint's ``derived_end`` on is validated (size, magic, CRC32C and
its own offset) and replayed through the dispatcher, which skips what queues already hold.

A record that fails validation is either a torn tail or corruption in the middle:
- if a valid record follows it, the bad bytes are corruption: they are logged, skipped and
  reported, and everything after them is kept (acknowledged records are never cut);
- if nothing valid follows in the last segment, it is a torn tail and is truncated.
Finally consume queues and key index drop entries that point past the truncated end.
"""
from __future__ import annotations

import logging
import os

from . import record
from .api import RecoveryReport
from .checkpoint import Checkpoint
from .commit_log import CommitLog, Segment
from .consume_queue import ConsumeQueues
from .dispatcher import Dispatcher, request_for

log = logging.getLogger(__name__)

_BATCH = 10_000


def recover(commit_log: CommitLog, queues: ConsumeQueues, dispatcher: Dispatcher,
            checkpoint: Checkpoint | None, index_rebuild_from: int | None) -> RecoveryReport:
    """Bring consume queues and key index in line with the log; return what was done."""
    end = commit_log.end_offset
    if (checkpoint is not None and checkpoint.clean and checkpoint.log_end == end
            and checkpoint.derived_end == end and index_rebuild_from is None):
        dispatcher.dispatched_end = end
        return RecoveryReport(clean=True)
    start = checkpoint.derived_end if checkpoint is not None else 0
    if index_rebuild_from is not None:
        start = min(start, index_rebuild_from)
    start = max(start, commit_log.min_offset)
    report = RecoveryReport()
    segments = commit_log.segments()
    for number, segment in enumerate(segments):
        if segment.end > start:
            cut = _scan_segment(segment, max(start, segment.base), dispatcher, report,
                                last=number == len(segments) - 1)
            if cut is not None:
                report.truncated_bytes = commit_log.truncate(cut)
                log.warning("truncated a torn tail of %d bytes at offset %d in segment %s",
                            report.truncated_bytes, cut, segment.name)
    new_end = commit_log.end_offset
    for queue in queues:
        queue.truncate_from_phys(new_end)
    dispatcher.key_index.truncate(new_end)
    dispatcher.dispatched_end = new_end
    log.info("recovered the store: scanned %d bytes, replayed %d records, truncated %d bytes, "
             "%d corrupt spans", report.scanned_bytes, report.replayed_records,
             report.truncated_bytes, len(report.corrupt_spans))
    return report


def _scan_segment(segment: Segment, start: int, dispatcher: Dispatcher, report: RecoveryReport,
                  last: bool) -> int | None:
    """Validate and replay one segment from ``start``; return the offset to truncate at, if any."""
    data = os.pread(segment.fd, segment.end - start, start - segment.base)
    report.scanned_bytes += len(data)
    pos, requests = 0, []
    while pos < len(data):
        size = record.check(data, pos, len(data), start + pos)
        if size:
            requests.append(request_for(record.decode(data, pos, start + pos, segment.name)))
            pos += size
            if len(requests) >= _BATCH:
                _flush(dispatcher, requests, report)
            continue
        following = record.find_valid(data, pos + 1, start)
        if following is None and last:
            _flush(dispatcher, requests, report)
            return start + pos
        following = len(data) if following is None else following
        report.corrupt_spans.append((segment.name, start + pos, start + following))
        log.error("corrupt bytes at offsets [%d, %d) of segment %s skipped; the records there "
                  "are lost, the rest of the store is served", start + pos, start + following,
                  segment.name)
        pos = following
    _flush(dispatcher, requests, report)
    return None


def _flush(dispatcher: Dispatcher, requests: list, report: RecoveryReport) -> None:
    dispatcher.dispatch(requests)
    report.replayed_records += len(requests)
    requests.clear()
