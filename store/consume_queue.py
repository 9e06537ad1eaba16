"""Consume queues: per (topic, queue id), fixed-size entries pointing into the commit log.

A consumer seeks by queue offset in O(1): entry ``n`` of a queue lives in the file whose name
is the 20-digit queue offset of its first entry, at byte ``(n - base) * ENTRY_SIZE``.

    offset size  field
    ------ ----  -------------------------------------------------------------
       0     8   phys_offset   u64, commit-log offset of the record
       8     4   size          u32, record size in bytes; 0 marks an entry whose record
                               was lost to corruption (phys_offset is where it was)
      12     8   tag_hash      u64, CRC32C of the tag (0: no tag), for tag filtering
    ENTRY_SIZE = 20

Files live in ``consumequeue/<escaped topic>/<queue id>/``. They are derived data: the
dispatcher fills them from the log, skips entries it already has (replay is idempotent) and
recovery rebuilds whatever the checkpoint does not cover. Entries are appended on the
flusher thread; reads use ``pread`` from any thread.
"""
from __future__ import annotations

import bisect
import logging
import os
import struct
import threading
from collections.abc import Iterable, Iterator
from urllib.parse import quote, unquote

from . import fileops
from .commit_log import list_offset_files, offset_name
from .descriptors import DescriptorCache
from .errors import InvalidRecordError

log = logging.getLogger(__name__)

ENTRY = struct.Struct("<QIQ")
ENTRY_SIZE = ENTRY.size
_WRITE_AT = 4096  # buffered entry bytes that trigger a write (about 200 entries)
_SITE = "consumequeue"
Entry = tuple[int, int, int]
"""(phys_offset, size, tag_hash)"""


def topic_dir_name(topic: str) -> str:
    """A file-system-safe, reversible directory name for ``topic``."""
    name = quote(topic, safe="")
    if not topic or name in (".", "..") or len(name) > 200:
        raise InvalidRecordError(f"topic name {topic!r} is empty, reserved or too long")
    return name


class ConsumeQueue:
    """The entries of one queue. Writes happen on the flusher thread only; files are opened
    through the store's descriptor cache, never held."""

    def __init__(self, directory: str, topic: str, queue_id: int, entries_per_file: int,
                 files: DescriptorCache, read_only: bool = False) -> None:
        self.directory = directory
        self.topic = topic
        self.queue_id = queue_id
        self.entries_per_file = entries_per_file
        self.read_only = read_only
        self._files = files
        self._lock = threading.Lock()  # guards the file list against retention, and each file's use
        self._bases = list_offset_files(directory)
        self._pending = bytearray()
        self._dirty: set[int] = set()
        self.max_offset = self._bases[-1] + self._file_entries(self._bases[-1]) if self._bases else 0
        self.min_offset = self._bases[0] if self._bases else 0
        self._written = self.max_offset  # entries below this are in the files

    def _path(self, base: int) -> str:
        return os.path.join(self.directory, offset_name(base))

    def _file_entries(self, base: int) -> int:
        """Whole entries in a file; a torn partial entry is cut (writer) or ignored (reader)."""
        path = self._path(base)
        size = os.stat(path).st_size
        if size % ENTRY_SIZE and not self.read_only:
            log.warning("cutting a torn entry off %s", path)
            with self._files.use(path) as fd:
                fileops.ftruncate(fd, size - size % ENTRY_SIZE, site=_SITE, path=path)
        return min(size // ENTRY_SIZE, self.entries_per_file)

    # -- writing (flusher thread) ----------------------------------------------------------

    def put(self, queue_offset: int, phys_offset: int, size: int, tag_hash: int) -> bool:
        """Add one entry; False if the queue already has it (replay). Gaps become lost entries."""
        if queue_offset < self.max_offset:
            return False
        if queue_offset > self.max_offset:
            missing = queue_offset - self.max_offset
            log.error("%s/%d: %d entries before offset %d were lost to corruption",
                      self.topic, self.queue_id, missing, queue_offset)
            self._pending += ENTRY.pack(phys_offset, 0, 0) * missing
        self._pending += ENTRY.pack(phys_offset, size, tag_hash)
        self.max_offset = queue_offset + 1
        return True

    def write_pending(self, force: bool) -> bool:
        """Write buffered entries to their files once ``_WRITE_AT`` bytes gathered (or ``force``).

        Runs on the flusher thread (or at a checkpoint, under the store's cycle lock); returns
        whether nothing is left buffered. Until written, ``read`` serves entries from memory.
        If a write fails, the entries stay buffered and count as unwritten: the next call
        writes them again, to the same places.
        """
        if not self._pending:
            return True
        if not force and len(self._pending) < _WRITE_AT:
            return False
        with self._lock:
            data, offset = memoryview(bytes(self._pending)), self._written
            while data:
                base = offset - offset % self.entries_per_file
                count = min(len(data) // ENTRY_SIZE, base + self.entries_per_file - offset)
                path = self._path(base)
                starts_file = not self._bases or self._bases[-1] != base
                if starts_file:  # recovery may have put off making the directory
                    fileops.makedirs(self.directory, site=_SITE)
                with self._files.use(path) as fd:
                    fileops.pwrite(fd, data[:count * ENTRY_SIZE], (offset - base) * ENTRY_SIZE,
                                   site=_SITE, path=path)
                if starts_file:
                    self._bases.append(base)
                self._dirty.add(base)
                data, offset = data[count * ENTRY_SIZE:], offset + count
            self._pending = bytearray()
            self._written = offset
        return True

    def take_dirty(self) -> list[int]:
        """Files written since the last call (under the store's cycle lock)."""
        dirty, self._dirty = self._dirty, set()
        return sorted(dirty)

    def mark_dirty(self, bases: list[int]) -> None:
        """Files ``take_dirty`` returned whose fsync failed: the next checkpoint syncs them."""
        self._dirty.update(bases)

    def sync_files(self, bases: list[int]) -> None:
        """fdatasync the given files; holds the queue lock so retention cannot remove them meanwhile."""
        with self._lock:
            present = set(self._bases)
            for base in bases:
                if base in present:
                    path = self._path(base)
                    with self._files.use(path) as fd:
                        fileops.fdatasync(fd, site=_SITE, path=path)

    def truncate_from_phys(self, end: int) -> int:
        """Drop tail entries whose record does not end before ``end``; return how many.
        Entries still buffered (recovery on a full disk) are cut in memory."""
        dropped = 0
        while self.max_offset > self.min_offset:
            phys, size, _ = self.read(self.max_offset - 1, 1)[0]
            if phys + size <= end and size:
                break
            self._set_max(self.max_offset - 1)
            dropped += 1
        return dropped

    def _set_max(self, offset: int) -> None:
        """Cut the queue to end at ``offset``; the oldest file always stays."""
        with self._lock:
            if offset >= self._written:  # only buffered entries go
                del self._pending[(offset - self._written) * ENTRY_SIZE:]
                self.max_offset = offset
                return
            self._pending.clear()
            while len(self._bases) > 1 and self._bases[-1] >= offset:
                self._remove(self._bases[-1])
                self._bases.pop()
            if self._bases:
                base = self._bases[-1]
                path = self._path(base)
                with self._files.use(path) as fd:
                    fileops.ftruncate(fd, max(0, offset - base) * ENTRY_SIZE, site=_SITE, path=path)
        self.max_offset = self._written = offset

    def _remove(self, base: int) -> None:
        """Close and delete one file (the caller holds the queue lock and drops it from the list)."""
        path = self._path(base)
        self._files.forget(path)
        fileops.unlink(path, site=_SITE)
        self._dirty.discard(base)

    # -- reading (any thread) --------------------------------------------------------------

    def read(self, queue_offset: int, max_count: int) -> list[Entry]:
        """Entries from ``queue_offset``, at most ``max_count``, never crossing a file."""
        with self._lock:
            if queue_offset >= self._written:
                count = min(max_count, self.max_offset - queue_offset)
                if count <= 0:
                    return []
                start = (queue_offset - self._written) * ENTRY_SIZE
                return list(ENTRY.iter_unpack(self._pending[start:start + count * ENTRY_SIZE]))
            index = bisect.bisect_right(self._bases, queue_offset) - 1
            if index < 0:
                return []
            base = self._bases[index]
            count = min(max_count, base + self.entries_per_file - queue_offset, self._written - queue_offset)
            with self._files.use(self._path(base)) as fd:
                data = os.pread(fd, count * ENTRY_SIZE, (queue_offset - base) * ENTRY_SIZE)
        return list(ENTRY.iter_unpack(data[:len(data) - len(data) % ENTRY_SIZE]))

    def refresh(self) -> None:
        """Read-only mode: pick up entries a running writer has added since."""
        with self._lock:
            before, self._bases = self._bases, list_offset_files(self.directory)
            for base in set(before).difference(self._bases):
                self._files.forget(self._path(base))
            self.min_offset = max(self.min_offset, self._bases[0]) if self._bases else self.min_offset
            if self._bases:
                self.max_offset = self._written = self._bases[-1] + self._file_entries(self._bases[-1])

    # -- retention -------------------------------------------------------------------------

    def delete_before(self, log_min: int) -> int:
        """Drop whole files of entries pointing below ``log_min``; move ``min_offset``; return files deleted.

        The newest file always stays, so ``max_offset`` survives a restart.
        """
        deleted = 0
        while len(self._bases) > 1:
            base, next_base = self._bases[0], self._bases[1]
            last = self.read(next_base - 1, 1)
            if last and last[0][0] >= log_min:
                break
            with self._lock:
                self._remove(base)
                self._bases.pop(0)
            deleted += 1
        self.advance_min(log_min)
        return deleted

    def advance_min(self, log_min: int) -> None:
        """Move ``min_offset`` past entries whose records lie below ``log_min`` (deleted by
        retention): on opening a store or reader, and after each retention pass."""
        if self._bases and self.min_offset < self._bases[0]:
            self.min_offset = self._bases[0]  # the files holding the oldest entries are gone
        first = self.read(self.min_offset, 1)
        if first and first[0][0] < log_min:
            self.min_offset = self._first_at_or_after(log_min)

    def _first_at_or_after(self, log_min: int) -> int:
        """Smallest queue offset whose record is at or after ``log_min`` (binary search)."""
        low, high = max(self.min_offset, self._bases[0] if self._bases else 0), self.max_offset
        while low < high:
            middle = (low + high) // 2
            entry = self.read(middle, 1)
            if entry and entry[0][0] >= log_min:
                high = middle
            else:
                low = middle + 1
        return low



class ConsumeQueues:
    """Every consume queue under ``consumequeue/``, created on first use; their files share one
    cache of at most ``max_open_queue_files`` descriptors, and queues found on disk open no file
    until read."""

    def __init__(self, directory: str, entries_per_file: int, read_only: bool = False,
                 max_open_queue_files: int = 256) -> None:
        self.directory = directory
        self.entries_per_file = entries_per_file
        self.read_only = read_only
        self.files = DescriptorCache(max_open_queue_files, os.O_RDONLY if read_only else os.O_RDWR | os.O_CREAT,
                                     _SITE)
        self._queues: dict[tuple[str, int], ConsumeQueue] = {}
        self._lock = threading.Lock()
        self._touched: set[ConsumeQueue] = set()
        self.discover()

    def discover(self) -> None:
        """Open every queue found on disk that is not open yet."""
        try:
            topic_dirs = os.listdir(self.directory)
        except FileNotFoundError:
            return
        for topic_dir in topic_dirs:
            topic = unquote(topic_dir)
            for queue_dir in os.listdir(os.path.join(self.directory, topic_dir)):
                if queue_dir.isdigit() and (topic, int(queue_dir)) not in self._queues:
                    self.get(topic, int(queue_dir), create=False)

    def get(self, topic: str, queue_id: int, create: bool = True,
            make_dir: bool = True) -> ConsumeQueue | None:
        """The queue, created if ``create`` (writer only), else None when it does not exist.
        A new queue's directory is made now, or with ``make_dir=False`` (recovery) when its
        first entries are written."""
        key = (topic, queue_id)
        queue = self._queues.get(key)
        if queue is None:
            path = os.path.join(self.directory, topic_dir_name(topic), str(queue_id))
            if not os.path.isdir(path):
                if not create or self.read_only:
                    return None
                if make_dir:
                    fileops.makedirs(path, site=_SITE)
            with self._lock:
                queue = self._queues.get(key) or self._queues.setdefault(
                    key, ConsumeQueue(path, topic, queue_id, self.entries_per_file, self.files, self.read_only))
        return queue

    def __iter__(self) -> Iterator[ConsumeQueue]:
        with self._lock:
            return iter(list(self._queues.values()))

    def touch(self, topic: str, queue_id: int, touched: dict[tuple[str, int], ConsumeQueue],
              make_dir: bool = True) -> ConsumeQueue:
        """The queue (created if new), noted in ``touched`` and among those to write (flusher thread)."""
        queue = touched[(topic, queue_id)] = (self._queues.get((topic, queue_id))
                                              or self.get(topic, queue_id, make_dir=make_dir))
        self._touched.add(queue)
        return queue

    def write_pending(self, force: bool = False,
                      batch: Iterable[ConsumeQueue] | None = None) -> None:
        """Write the buffered entries of the queues of ``batch`` (those one dispatch touched)
        that gathered enough of them, or with ``force`` of every queue with buffered entries.
        A dispatch looks at its own queues only, so its cost does not grow with the number of
        queues waiting for a checkpoint."""
        if force:
            self._touched = {queue for queue in self._touched if not queue.write_pending(True)}
            return
        for queue in self._touched if batch is None else batch:
            if queue.write_pending(False):
                self._touched.discard(queue)

    def take_dirty(self) -> list[tuple[ConsumeQueue, list[int]]]:
        """Every queue's files written since the last call (under the store's cycle lock)."""
        return [(queue, bases) for queue in self if (bases := queue.take_dirty())]

    def advance_min(self, log_min: int) -> None:
        """``ConsumeQueue.advance_min`` for every queue; nothing to do while the log is whole."""
        if log_min > 0:
            for queue in self:
                queue.advance_min(log_min)

    def close(self) -> None:
        """Close every queue file (the queues must not be used afterwards)."""
        self.files.close()
