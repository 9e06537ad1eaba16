"""Cutting a closed store's log back to an offset: a rejoining replica keeps only what it
shares with the leader (``epochs.consistent_point``) before it opens the store and catches up.

The cut removes whole segments past the offset and shortens the one holding it; the epochs
file forgets the epochs that started past it; the checkpoint is rewritten as unclean and
reaching no further, so the next open's recovery drops queue entries and keys that pointed
past the cut and rebuilds nothing it does not have to.
"""
from __future__ import annotations

import logging
import os

from . import checkpoint
from .commit_log import CommitLog
from .epochs import EpochFile
from .errors import StoreError

log = logging.getLogger(__name__)


class TruncationRefused(StoreError):
    """The cut would remove records already confirmed to clients: the replica halts instead."""


def truncate_log(directory: str, offset: int, segment_size: int, confirmed: int = 0) -> None:
    """Cut the closed store in ``directory`` at ``offset``.

    ``confirmed`` is the highest confirm offset this replica has seen: a cut below it would
    lose acknowledged records, so it is refused (Kafka's and RocketMQ's rule; an operator must
    decide, e.g. by replacing this node's data with a copy of the leader's).
    """
    if offset < confirmed:
        raise TruncationRefused(
            f"the leader's log and this node's part at offset {offset}, below offset {confirmed} "
            "that was already confirmed to clients; not truncating. The group has lost confirmed "
            "records: compare the nodes' logs (sluice data verify) before replacing this node's data")
    path = os.path.join(directory, "checkpoint")
    found = checkpoint.load(path)
    commit_log = CommitLog(os.path.join(directory, "commitlog"), segment_size, preallocate="lazy")
    try:
        if found is not None and found.clean and commit_log.segments():
            commit_log.set_end(min(found.log_end, commit_log.file_end()))
        if offset < commit_log.file_end():
            commit_log.truncate(offset)
    finally:
        commit_log.close()
    derived = min(found.derived_end, offset) if found is not None else 0
    checkpoint.save(path, checkpoint.Checkpoint(min(found.log_end, offset) if found else 0, derived, clean=False))
    EpochFile(directory).truncate(offset)
    log.warning("truncated the log at offset %d, where it parts from the leader's", offset)
