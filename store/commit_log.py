"""The commit log: one append-only byte stream for every topic, cut into segment files.

A segment file is named by the 20-digit commit-log offset of its first byte and holds at most
``segment_size`` bytes of whole records; offsets are contiguous across segments (a segment's
records end where the next segment begins). Files are usually preallocated (preallocator.py),
so the last segment's records end where its zeros begin, not at its file size: the store
learns that end from its checkpoint or from recovery's scan (``set_end``). Offsets of new
records are handed out by the store's append buffer (flusher.py); bytes reach the files on the
flusher thread (``write``/``sync``); reads use ``pread`` and may come from any thread.
"""
from __future__ import annotations

import bisect
import logging
import os
import threading
from dataclasses import dataclass

from . import fileops
from .api import Preallocation
from .durable_files import fsync_directory
from .preallocator import Preallocator

log = logging.getLogger(__name__)

_SITE = "commitlog"


def offset_name(offset: int) -> str:
    """File name for a file starting at ``offset``: 20 digits, zero padded."""
    return f"{offset:020d}"


def list_offset_files(directory: str) -> list[int]:
    """Sorted start offsets of the offset-named files in ``directory`` (empty if it is missing)."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return sorted(int(name) for name in names if len(name) == 20 and name.isdigit())


@dataclass(eq=False)
class Segment:
    """One commit-log file."""

    base: int
    path: str
    fd: int
    size: int

    @property
    def end(self) -> int:
        return self.base + self.size

    @property
    def name(self) -> str:
        return os.path.basename(self.path)


class CommitLog:
    """Segment files of the commit log, for writing or (``read_only=True``) for reading only."""

    def __init__(self, directory: str, segment_size: int, read_only: bool = False,
                 preallocate: Preallocation = "eager") -> None:
        self.directory = directory
        self.segment_size = segment_size
        self.read_only = read_only
        self._lock = threading.Lock()  # guards the segment list and fds against retention
        self._segments: list[Segment] = []
        self._bases: list[int] = []
        if not read_only:
            fileops.makedirs(directory, site=_SITE)
        self.preallocator: Preallocator | None = None
        bases = list_offset_files(directory)
        try:
            for index, base in enumerate(bases):
                self._open_segment(base, bases[index + 1] if index + 1 < len(bases) else None)
            eager = preallocate == "eager"
            self.preallocator = None if read_only else Preallocator(directory, segment_size, eager)
            if not read_only and not self._segments:
                # an eager log starts preallocated too; a lazy one with a growing file
                self._open_segment(0, create=True, wait=eager)
        except BaseException:
            self.close()
            raise

    # -- layout -------------------------------------------------------------------------

    @property
    def min_offset(self) -> int:
        """Offset of the oldest byte still on disk."""
        segments = self._segments
        return segments[0].base if segments else 0

    @property
    def end_offset(self) -> int:
        """Offset just past the last record written to the files."""
        segments = self._segments
        return segments[-1].end if segments else 0

    def file_end(self) -> int:
        """Offset just past the last segment file's last byte, preallocated zeros included."""
        segments = self._segments
        return segments[-1].base + os.fstat(segments[-1].fd).st_size if segments else 0

    def set_end(self, end: int) -> None:
        """Declare where the records of the last segment end (recovery): a preallocated file
        runs on in zeros, so its size does not say."""
        segment = self._segments[-1]
        segment.size = end - segment.base

    def segments(self) -> list[Segment]:
        """A snapshot of the segment list, oldest first."""
        with self._lock:
            return list(self._segments)

    def _open_segment(self, base: int, next_base: int | None = None, create: bool = False,
                      wait: bool = False) -> Segment:
        """Open a segment; until told otherwise (``set_end``), the last one is as long as its file.

        A new one takes the preallocated file if ready (``wait``: once it is). If creating it
        fails, nothing is left open and the call can simply be repeated.
        """
        path = os.path.join(self.directory, offset_name(base))
        if create and self.preallocator is not None:
            self.preallocator.take(path, wait)
        flags = os.O_RDONLY if self.read_only else os.O_RDWR | os.O_CREAT
        fd = fileops.open_file(path, flags, site=_SITE)
        if create:
            try:
                fsync_directory(self.directory, site=_SITE)
            except BaseException:
                os.close(fd)
                raise
        size = 0 if create else next_base - base if next_base is not None else os.fstat(fd).st_size
        segment = Segment(base, path, fd, size)
        self._segments.append(segment)
        self._bases.append(base)
        return segment

    def refresh(self) -> None:
        """Read-only mode: pick up segments and sizes a running writer has added since."""
        with self._lock:
            known = set(self._bases)
            for base in list_offset_files(self.directory):
                if base not in known and (not self._bases or base > self._bases[-1]):
                    try:
                        self._open_segment(base)
                    except FileNotFoundError:
                        continue
            for segment, following in zip(self._segments, self._segments[1:]):
                segment.size = following.base - segment.base
            if self._segments:
                self._segments[-1].size = os.fstat(self._segments[-1].fd).st_size

    # -- writing (append lock, then flusher thread) -----------------------------------------

    def write(self, base: int, views: list[memoryview], at: int) -> Segment:
        """Write ``views`` at commit-log offset ``at`` of the segment starting at ``base``
        (created if new), with as few ``pwritev`` calls as possible; the segment then ends
        where they end.

        Runs on the flusher thread; the caller then ``sync``s the returned segments. Writing the
        same bytes at the same offset again is harmless, so a write that failed part way is
        retried whole. Every syscall here gives up the interpreter lock, and a busy appender may
        hold it for a whole switch interval before it comes back, so the count of calls matters
        more than their size.
        """
        with self._lock:
            segment = self._segments[-1] if self._segments and self._segments[-1].base == base else None
            if segment is None:
                segment = self._open_segment(base, create=True)
        fileops.pwritev(segment.fd, views, at - base, site=_SITE, path=segment.path)
        segment.size = at - base + sum(map(len, views))
        if segment.size * 2 >= self.segment_size and self.preallocator is not None:
            self.preallocator.want()  # lazy: half full, time to prepare the next one
        return segment

    @staticmethod
    def sync(segments: list[Segment]) -> None:
        """fsync each segment (fdatasync: sizes are covered). Runs on the flusher thread."""
        for segment in segments:
            if segment.fd >= 0:  # -1: deleted by retention meanwhile
                fileops.fdatasync(segment.fd, site=_SITE, path=segment.path)

    # -- reading (any thread) --------------------------------------------------------------

    def read(self, offset: int, size: int) -> tuple[bytes, Segment]:
        """Read up to ``size`` bytes at ``offset`` from the one segment holding it.

        Raises FileNotFoundError if no segment holds ``offset`` (removed by retention or never
        written).
        """
        with self._lock:
            index = bisect.bisect_right(self._bases, offset) - 1
            if index < 0 or offset >= self._segments[index].end:
                raise FileNotFoundError(f"no commit-log segment holds offset {offset}")
            segment = self._segments[index]
            return os.pread(segment.fd, min(size, segment.end - offset), offset - segment.base), segment

    # -- recovery and retention ------------------------------------------------------------

    def truncate(self, offset: int) -> int:
        """Cut every byte at or after ``offset``; return how many bytes were removed."""
        removed = 0
        with self._lock:
            while self._segments and self._segments[-1].base >= offset and (
                    self._segments[-1].base > offset or len(self._segments) > 1):
                segment = self._segments.pop()
                self._bases.pop()
                removed += segment.size
                os.close(segment.fd)
                fileops.unlink(segment.path, site=_SITE)
            if self._segments and self._segments[-1].end > offset:
                segment = self._segments[-1]
                removed += segment.end - offset
                segment.size = offset - segment.base
                fileops.ftruncate(segment.fd, segment.size, site=_SITE, path=segment.path)
                fileops.fsync(segment.fd, site=_SITE, path=segment.path)
        return removed

    def delete_oldest(self) -> Segment:
        """Delete the oldest segment (never the active one) and return it. Used by retention."""
        with self._lock:
            if len(self._segments) < 2:
                raise ValueError("the active segment is never deleted")
            segment = self._segments.pop(0)
            self._bases.pop(0)
            os.close(segment.fd)
            segment.fd = -1
            fileops.unlink(segment.path, site=_SITE)
        log.info("retention deleted commit-log segment %s (%d bytes)", segment.name, segment.size)
        return segment

    def close(self) -> None:
        if self.preallocator is not None:
            self.preallocator.close()
        with self._lock:
            for segment in self._segments:
                os.close(segment.fd)
            self._segments.clear()
            self._bases.clear()
