"""Errors raised by the store. Expected outcomes (end of queue, segment roll) are return values."""
from __future__ import annotations


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


class StoreClosedError(StoreError):
    """The store was used after close()."""


class StoreLockedError(StoreError):
    """Another process holds the data directory."""
