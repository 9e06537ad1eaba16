"""Errors raised by the store. Expected outcomes (end of queue, segment roll) are return values."""
from __future__ import annotations

import errno as errno_codes


class StoreError(Exception):
    """Base class of every store error."""

    appended: list = []
    """For a refused ``append_batch``: results of the messages before the refused one, which
    were appended."""


class CorruptRecordError(StoreError):
    """A record failed validation when read; names the file and offset so an operator can act."""

    def __init__(self, offset: int, reason: str, segment: str = "") -> None:
        where = f"segment {segment} " if segment else ""
        super().__init__(
            f"corrupt record at commit-log offset {offset} ({where}): {reason}; "
            "the record is skipped, the rest of the store is served"
        )
        self.offset = offset
        self.segment = segment
        self.reason = reason


class OffsetOutOfRangeError(StoreError):
    """A queue offset below the earliest retained offset was asked for."""

    def __init__(self, topic: str, queue_id: int, offset: int, min_offset: int, max_offset: int) -> None:
        super().__init__(
            f"offset {offset} of {topic}/{queue_id} is out of range "
            f"[{min_offset}, {max_offset}); retention removed older messages, "
            f"resume from {min_offset}"
        )
        self.topic = topic
        self.queue_id = queue_id
        self.offset = offset
        self.min_offset = min_offset
        self.max_offset = max_offset


class RecordTooLargeError(StoreError):
    """A record does not fit in one commit-log segment."""


class InvalidRecordError(StoreError):
    """An append was refused because a field is out of bounds (too long, missing key, ...)."""


class ReplicaGapError(StoreError):
    """Replicated bytes that do not start where this log ends: ``expected`` is where they must."""

    def __init__(self, offset: int, expected: int) -> None:
        super().__init__(f"replicated bytes start at offset {offset}, but this log ends at {expected}; "
                         f"fetch from {expected}")
        self.offset = offset
        self.expected = expected


class InvalidCursorError(StoreError):
    """A lookup was asked to go on from a cursor this store did not hand out for that key (or
    no longer knows: its key index was rebuilt since)."""


class TierFetchNeeded(StoreError):
    """A read would fetch tiered objects from object storage, inside ``Store.cached_only()``
    (a thread that must not wait on object storage): run it again where it may wait."""


class StoreClosedError(StoreError):
    """The store was used after close()."""


class StoreLockedError(StoreError):
    """Another process holds the data directory."""


class StoreDegradedError(StoreError):
    """The store cannot write right now: the disk is full, descriptors ran out or the disk
    failed. Appends are refused and unfinished durability waits fail until it can write again;
    it retries by itself and resumes without a restart. ``errno`` is the failing call's."""

    def __init__(self, message: str, errno: int | None = None) -> None:
        super().__init__(message)
        self.errno = errno


_ADVICE = {
    errno_codes.ENOSPC: "the disk is full: free space on it; writes resume by themselves",
    errno_codes.EDQUOT: "the disk quota is used up: free space or raise the quota; writes resume by themselves",
    errno_codes.EMFILE: ("the process ran out of file descriptors: raise its limit (ulimit -n) or "
                         "lower store.max_open_queue_files; writes resume by themselves"),
    errno_codes.ENFILE: ("the system ran out of file descriptors: close other programs' files or "
                         "raise fs.file-max; writes resume by themselves"),
    errno_codes.EIO: "the disk reported an I/O error: check it (dmesg, SMART); writes are retried",
    errno_codes.EROFS: "the file system is read-only: remount it read-write; writes are retried",
}


def describe_write_failure(error: OSError) -> str:
    """One line for operators: which write failed, why, and what to do about it."""
    name = errno_codes.errorcode.get(error.errno or 0, "unknown error")
    where = f" on {error.filename}" if error.filename else ""
    advice = _ADVICE.get(error.errno or 0, "writes are retried")
    return f"the store cannot write ({name}: {error.strerror or error}{where}); {advice}"
