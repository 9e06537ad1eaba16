"""Crash recovery: scan the log from the checkpoint, validate, truncate a torn tail, rebuild.

After a clean shutdown the checkpoint matches the files and nothing is scanned. Otherwise
every record from the checkpoint's ``derived_end`` on is validated (size, magic, CRC32C and
its own offset) and replayed through the dispatcher, which skips what queues already hold.

A record that fails validation is either a torn tail or corruption in the middle:
- if a valid record follows it, the bad bytes are corruption: they are logged, skipped and
  reported, and everything after them is kept (acknowledged records are never cut);
- if nothing valid follows in the last segment, it is a torn tail and is truncated.
Finally consume queues and key index drop entries that point past the truncated end.

Recovery needs no free disk space: what it cannot write now (queue entries, keys, the cut of a
torn tail) is kept in memory or put off (``Dispatcher.replay``), so a store opens and serves
reads on a full disk, and the store writes the rest once it can.
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
    segments = commit_log.segments()
    last_base = segments[-1].base if segments else 0
    if (checkpoint is not None and checkpoint.clean and index_rebuild_from is None
            and checkpoint.derived_end == checkpoint.log_end
            and last_base <= checkpoint.log_end <= commit_log.file_end()):
        if segments:
            commit_log.set_end(checkpoint.log_end)
        dispatcher.dispatched_end = checkpoint.log_end
        return RecoveryReport(clean=True)
    start = checkpoint.derived_end if checkpoint is not None else 0
    if index_rebuild_from is not None:
        start = min(start, index_rebuild_from)
    start = max(start, commit_log.min_offset)
    report = RecoveryReport()
    for number, segment in enumerate(segments):
        if segment.end > start:
            end = _scan_segment(segment, max(start, segment.base), dispatcher, report,
                                last=number == len(segments) - 1)
            if end is not None:
                _end_log(commit_log, segment, report, *end)
    new_end = commit_log.end_offset
    for queue in queues:
        queue.truncate_from_phys(new_end)
    dispatcher.key_index.truncate(new_end)
    dispatcher.dispatched_end = new_end
    log.info("recovered the store: scanned %d bytes, replayed %d records, truncated %d bytes, "
             "%d corrupt spans", report.scanned_bytes, report.replayed_records,
             report.truncated_bytes, len(report.corrupt_spans))
    return report


def _end_log(commit_log: CommitLog, segment: Segment, report: RecoveryReport, end: int, torn: int) -> None:
    """The records of the last segment stop at ``end``; ``torn`` bytes of garbage follow them."""
    if not torn:
        commit_log.set_end(end)  # only preallocated zeros follow
        return
    report.truncated_bytes = torn
    try:
        commit_log.truncate(end)
    except OSError as error:  # the log ends at ``end`` all the same: new records overwrite the rest
        log.warning("could not cut a torn tail of %d bytes at offset %d in segment %s (%s); the "
                    "log ends there and appends overwrite it", torn, end, segment.name, error)
        return
    log.warning("truncated a torn tail of %d bytes at offset %d in segment %s", torn, end, segment.name)


def _scan_segment(segment: Segment, start: int, dispatcher: Dispatcher, report: RecoveryReport,
                  last: bool) -> tuple[int, int] | None:
    """Validate and replay one segment from ``start``.

    For the last segment, return (end of its records, bytes of garbage after them) when they
    stop before the end of the file; zeros after them are preallocated space, not garbage.
    """
    data = os.pread(segment.fd, segment.end - start, start - segment.base)
    report.scanned_bytes += len(data)
    requests: list = []
    try:
        for kind, pos, extent in record.scan(data, start, last):
            if kind == "record":
                requests.append(request_for(record.decode(data, pos, start + pos, segment.name)))
                if len(requests) >= _BATCH:
                    _flush(dispatcher, requests, report)
            elif kind == "end":
                return start + pos, extent
            else:
                report.corrupt_spans.append((segment.name, start + pos, start + extent))
                log.error("corrupt bytes at offsets [%d, %d) of segment %s skipped; the records "
                          "there are lost, the rest of the store is served", start + pos,
                          start + extent, segment.name)
        return None
    finally:
        _flush(dispatcher, requests, report)


def _flush(dispatcher: Dispatcher, requests: list, report: RecoveryReport) -> None:
    dispatcher.replay(requests)
    report.replayed_records += len(requests)
    requests.clear()
