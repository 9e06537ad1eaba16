"""Starting a replica's store where a leader's log now begins (after retention deleted its start).

A follower replicates the log byte for byte from an offset both logs share. When the leader's
retention has deleted segments the follower never got (a brand-new node, or one that was down
too long), there is no such offset: the follower's store is replaced by an empty one whose log
begins at the leader's log start ``X`` and whose state matches the leader's as of that offset:

- every consume queue begins at the queue offset the leader's first record at or after ``X``
  has (placeholder entries below it point below ``X``, so they are never read: the queue's
  earliest offset is past them, as on the leader after retention);
- the leader's compacted copies of compacted topics (``compaction.py``), which hold the newest
  value of each key from the deleted segments too;
- the leader's epochs (``epochs.py``).

Replication then fills the log from ``X`` on, and the follower dispatches each record to its
queues at the same queue offsets as the leader. The key index has nothing below ``X`` (the
leader's retention dropped those keys too). ``take`` runs on the leader's open store,
``install`` on the follower's closed data directory.
"""
from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass, field
from typing import Protocol

from . import checkpoint, fileops, layout
from .commit_log import offset_name
from .consume_queue import ENTRY, topic_dir_name
from .epochs import FILE_NAME as EPOCHS_FILE, EpochFile

log = logging.getLogger(__name__)

_REPLACED = ("checkpoint", EPOCHS_FILE, "commitlog", "consumequeue", "index", "compacted")
"""What of a data directory ``install`` replaces, in this order (store.json, its geometry,
stays): without a checkpoint and epochs, a store left half replaced by a crash is scanned as it
is and its node, whose history then shares nothing with the leader's, gets a snapshot again."""
_PLACEHOLDER = ENTRY.pack(0, 0, 0)
"""A queue entry below the log start: points below it, never read."""


@dataclass
class StoreSnapshot:
    """What a follower needs to begin its log at ``log_start``."""

    log_start: int
    queues: list[tuple[str, int, int]] = field(default_factory=list)
    """(topic, queue id, queue offset of the first record at or after ``log_start``)."""
    compacted: dict[str, bytes] = field(default_factory=dict)
    """Compacted copies: path under ``compacted/`` -> the file's bytes."""
    epochs: bytes = b""
    """The leader's epochs file."""


class Snapshottable(Protocol):
    """What ``take`` needs of a leader's store (``FileStore`` has it)."""

    directory: str
    compaction: object

    @property
    def log_start(self) -> int: ...
    def compact(self, topic: str) -> int: ...
    def queue_starts(self) -> tuple[int, list[tuple[str, int, int]]]: ...


def take(store: Snapshottable) -> StoreSnapshot:
    """A snapshot of ``store`` at its log start; blocking (it writes fresh compacted copies)."""
    for topic in sorted(store.compaction.topics):
        store.compact(topic)
    log_start, queues = store.queue_starts()
    compacted: dict[str, bytes] = {}
    root = os.path.join(store.directory, "compacted")
    for folder, _, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            if name.endswith(".snapshot"):
                with open(path, "rb") as file:
                    compacted[os.path.relpath(path, root)] = file.read()
    try:
        with open(os.path.join(store.directory, EPOCHS_FILE), "rb") as file:
            epochs = file.read()
    except FileNotFoundError:
        epochs = b""
    return StoreSnapshot(log_start, queues, compacted, epochs)


def install(directory: str, snapshot: StoreSnapshot) -> None:
    """Replace the store in ``directory`` (closed) by an empty one beginning at the snapshot.

    Writes everything into a staging directory first, then swaps the store's parts for it by
    renames (see ``_REPLACED`` for a crash in between)."""
    entries_per_file = layout.queue_entries_per_file(directory, None)
    staging = os.path.join(directory, ".snapshot-staging")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        _stage(staging, snapshot, entries_per_file)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    for name in _REPLACED:
        path = os.path.join(directory, name)
        if os.path.isdir(path):
            shutil.rmtree(path)
        elif os.path.exists(path):
            os.unlink(path)
    for name in ("commitlog", "consumequeue", "compacted", "checkpoint", EPOCHS_FILE):
        source = os.path.join(staging, name)
        if os.path.exists(source):
            os.rename(source, os.path.join(directory, name))
    shutil.rmtree(staging)
    fileops.syncfs(directory, site="store")
    log.warning("the store now begins at offset %d, where the leader's log begins: %d queues and %d "
                "compacted copies taken from the leader", snapshot.log_start, len(snapshot.queues),
                len(snapshot.compacted))


def _stage(staging: str, snapshot: StoreSnapshot, entries_per_file: int) -> None:
    """Write the store ``snapshot`` describes into the directory ``staging``."""
    os.makedirs(os.path.join(staging, "commitlog"))
    with open(os.path.join(staging, "commitlog", offset_name(snapshot.log_start)), "wb"):
        pass  # the first segment, empty: the log begins and ends at log_start
    for topic, queue_id, first in snapshot.queues:
        if first == 0:
            continue  # nothing below the log start: the queue begins with its first record
        folder = os.path.join(staging, "consumequeue", topic_dir_name(topic), str(queue_id))
        os.makedirs(folder, exist_ok=True)
        base = first - first % entries_per_file
        with open(os.path.join(folder, offset_name(base)), "wb") as file:
            file.write(_PLACEHOLDER * (first - base))
    for relative, data in snapshot.compacted.items():
        path = os.path.normpath(os.path.join(staging, "compacted", relative))
        if not path.startswith(os.path.join(staging, "compacted") + os.sep):
            raise ValueError(f"a compacted copy named {relative!r} lies outside the store")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as file:
            file.write(data)
    if snapshot.epochs:
        with open(os.path.join(staging, EPOCHS_FILE), "wb") as file:
            file.write(snapshot.epochs)
        EpochFile(staging).truncate(snapshot.log_start)  # epochs begun later begin again as records come
    checkpoint.save(os.path.join(staging, "checkpoint"), checkpoint.Checkpoint(
        snapshot.log_start, snapshot.log_start, clean=True))
    fileops.syncfs(staging, site="store")
