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
_SITE = "snapshot"
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
            fileops.unlink(path, site=_SITE)
    for name in ("commitlog", "consumequeue", "compacted", "checkpoint", EPOCHS_FILE):
        source = os.path.join(staging, name)
        if os.path.exists(source):
            fileops.rename(source, os.path.join(directory, name), site=_SITE)
    shutil.rmtree(staging)
    fileops.syncfs(directory, site=_SITE)
    log.warning("the store now begins at offset %d, where the leader's log begins: %d queues and %d "
                "compacted copies taken from the leader", snapshot.log_start, len(snapshot.queues),
                len(snapshot.compacted))


def _stage(staging: str, snapshot: StoreSnapshot, entries_per_file: int) -> None:
    """Write the store ``snapshot`` describes into the directory ``staging``."""
    _write(os.path.join(staging, "commitlog", offset_name(snapshot.log_start)), b"")  # the log begins
    # and ends at log_start
    for topic, queue_id, first in snapshot.queues:
        if first == 0:
            continue  # nothing below the log start: the queue begins with its first record
        base = first - first % entries_per_file
        _write(os.path.join(staging, "consumequeue", topic_dir_name(topic), str(queue_id), offset_name(base)),
               _PLACEHOLDER * (first - base))
    for relative, data in snapshot.compacted.items():
        path = os.path.normpath(os.path.join(staging, "compacted", relative))
        if not path.startswith(os.path.join(staging, "compacted") + os.sep):
            raise ValueError(f"a compacted copy named {relative!r} lies outside the store")
        _write(path, data)
    if snapshot.epochs:
        _write(os.path.join(staging, EPOCHS_FILE), snapshot.epochs)
        EpochFile(staging).truncate(snapshot.log_start)  # epochs begun later begin again as records come
    checkpoint.save(os.path.join(staging, "checkpoint"), checkpoint.Checkpoint(
        snapshot.log_start, snapshot.log_start, clean=True))
    fileops.syncfs(staging, site=_SITE)


def _write(path: str, data: bytes) -> None:
    """A new file holding ``data`` (made durable by the ``syncfs`` that follows)."""
    fileops.makedirs(os.path.dirname(path), site=_SITE)
    fd = fileops.open_file(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, site=_SITE)
    try:
        fileops.write(fd, data, site=_SITE, path=path)
    finally:
        os.close(fd)
