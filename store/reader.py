"""StoreReader: read a data directory with no broker in the process (Spark executors, CLI).

It takes no lock and repairs nothing: it may run beside a live broker. Consume queues are
written after the log, so every entry it sees points at bytes already in a segment. The broker
writes queue entries out at least every ``checkpoint_interval_ms`` (or at once with
``FileStore.checkpoint()``); call ``refresh`` to see what it appended since. Key lookups are not offered here (the key
index belongs to the writer); queue reads, ``read_at`` and time lookups are, and reads of many
records at once as columns (``read_columns``).

When the broker tiers sealed segments to object storage (``<data>/tier.json`` names where), the
reader opens that tier too, with credentials from the environment (``SLUICE_TIER_S3_ACCESS_KEY``
and ``SLUICE_TIER_S3_SECRET_KEY``, else boto3's own chain): history the broker's local retention
deleted is read from there, and tiered messages can be looked up by id and key.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

from . import checkpoint, layout
from .commit_log import CommitLog
from .consume_queue import ConsumeQueues
from .view import StoreView
from .verify import Verification, check, verify

if TYPE_CHECKING:
    from .record_columns import RecordColumns
    from .tier.reader import TierReader

log = logging.getLogger(__name__)


class StoreReader(StoreView):
    """A read-only view of the store in ``directory``."""

    def __init__(self, directory: str, max_open_queue_files: int = 256) -> None:
        """Open the store in ``directory``; queue files are opened as they are read, at most
        ``max_open_queue_files`` at once."""
        if not os.path.isdir(directory):
            raise FileNotFoundError(f"{directory} is not a directory")
        self.directory = directory
        entries = layout.queue_entries_per_file(directory, None)
        super().__init__(
            CommitLog(os.path.join(directory, "commitlog"), segment_size=1 << 62, read_only=True),
            ConsumeQueues(os.path.join(directory, "consumequeue"), entries, read_only=True,
                          max_open_queue_files=max_open_queue_files),
            key_index=None,
            tier=_open_tier(directory),
        )
        self.consume_queues.advance_min(self.log.min_offset)

    def refresh(self) -> None:
        """Pick up segments, queues and entries written since opening (or the last refresh),
        and the tier's newest manifest."""
        self.log.refresh()
        self.consume_queues.discover()
        for queue in self.consume_queues:
            queue.refresh()
        self.consume_queues.advance_min(self.log.min_offset)
        if self.tier is not None:
            _refresh(self.tier)

    def read_columns(self, topic: str, queue_id: int, queue_offset: int, max_count: int,
                     max_bytes: int = 16 << 20) -> Iterator[RecordColumns]:
        """Up to ``max_count`` records of a queue from ``queue_offset``, as columns: one
        ``RecordColumns`` per run of records read with one pread (record_columns.py; needs
        numpy), decoded as it is iterated. Checked and ended as ``read_runs`` is: stops before a
        corrupt record, raises CorruptRecordError at once if the first one is corrupt and
        OffsetOutOfRangeError below the earliest retained offset; a run holding a record whose
        sections do not add up raises CorruptRecordError when reached. Nothing at the end of the
        queue."""
        from .record_columns import decode  # numpy: only column readers load it

        return map(decode, self.read_runs(topic, queue_id, queue_offset, max_count, max_bytes))

    def close(self) -> None:
        """Close the segment and queue files it holds open."""
        self.log.close()
        self.consume_queues.close()

    def describe(self) -> dict:
        """A summary for operators: log extent, checkpoint, every queue's offset range."""
        point = checkpoint.load(os.path.join(self.directory, "checkpoint"))
        segments = self.log.segments()
        return {
            "directory": os.path.abspath(self.directory),
            "commit_log": {"segments": len(segments), "min_offset": self.log.min_offset,
                           "end_offset": self.log.end_offset,
                           "bytes": sum(segment.size for segment in segments)},
            "checkpoint": point.__dict__ if point else None,
            "queues": [{"topic": topic, "queue_id": queue_id,
                        "min_offset": self.queue_range(topic, queue_id)[0],
                        "max_offset": self.queue_range(topic, queue_id)[1]}
                       for topic, queue_id in self.queues()],
        }

    def verify(self) -> list[str]:
        """Check every record of the log and every queue entry against the log (see verify.py);
        return one line per problem (empty: all good).

        Zeros after the last record of the last segment are preallocated space, and a torn
        tail there is what a crash leaves: neither is damage (``check`` reports the torn tail).
        """
        return verify(self)

    def check(self) -> Verification:
        """``verify``'s problems, and the torn tail if there is one."""
        return check(self)


def _open_tier(directory: str) -> TierReader | None:
    """The tier named in ``<directory>/tier.json``, its manifest loaded; None if there is none."""
    from .tier.objects import load_location  # pyarrow and boto3: only readers of a tier load them
    from .tier.reader import TierReader

    location = load_location(directory)
    if location is None:
        return None
    tier = TierReader(location.open())
    _refresh(tier)
    return tier


def _refresh(tier: TierReader) -> None:
    """Load the tier's newest manifest; if the object store cannot be read, say so and go on
    with what was loaded before (local reads never depend on it)."""
    from .errors import StoreError

    try:
        tier.refresh()
    except StoreError as error:
        log.warning("the tier at %s cannot be read now (%s): serving the local log and the tier's "
                    "last manifest; refresh() tries again", tier.objects.description, error)
