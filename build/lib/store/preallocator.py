"""Prepare the next commit-log segment file ahead of time, fully written with zeros.

fdatasync of a write that grows a file must also commit the file's new size to the journal;
a write into blocks that already exist need not, and measured here that made group commits
about half again as fast. So, as RocketMQ's AllocateMappedFileService does, a background
thread writes the next segment file in full (``next.tmp``), fsyncs it and renames it to
``next.prealloc``; a roll renames that to the segment's 20-digit name. Until one is ready a
roll creates an ordinary, growing file.
"""
from __future__ import annotations

import logging
import os
import threading

log = logging.getLogger(__name__)

_READY = "next.prealloc"
_PARTIAL = "next.tmp"
_CHUNK = 1 << 20


class Preallocator:
    """Keeps one zero-filled segment file ready in ``directory``. Runs its own thread."""

    def __init__(self, directory: str, segment_size: int) -> None:
        self.directory = directory
        self.segment_size = segment_size
        self._ready = os.path.join(directory, _READY)
        self._partial = os.path.join(directory, _PARTIAL)
        self._wanted = threading.Event()
        self._prepared = threading.Event()
        self._stopping = False
        self._discard_leftovers()
        self._thread = threading.Thread(target=self._run, name="sluice-store-preallocator", daemon=True)
        self._wanted.set()
        self._thread.start()

    def _discard_leftovers(self) -> None:
        """A partial file from a crash, or a ready one of another size, is thrown away."""
        if os.path.exists(self._partial):
            os.remove(self._partial)
        if os.path.exists(self._ready) and os.path.getsize(self._ready) != self.segment_size:
            os.remove(self._ready)

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Block until the next segment file is prepared (or preparing it failed)."""
        return self._prepared.wait(timeout)

    def take(self, path: str, wait: bool = False) -> bool:
        """Rename the prepared file to ``path`` if one is ready (or, with ``wait``, once it is);
        True if it was. Runs on the flusher thread, or at open for a new store's first segment."""
        if wait:
            self._prepared.wait()
        self._prepared.clear()
        try:
            os.rename(self._ready, path)
        except FileNotFoundError:
            return False
        finally:
            self._wanted.set()
        return True

    def _run(self) -> None:
        while True:
            self._wanted.wait()
            self._wanted.clear()
            if self._stopping:
                return
            try:
                if not os.path.exists(self._ready):
                    self._prepare()
            except OSError:
                log.exception("could not prepare the next commit-log segment; rolls will "
                              "create growing files (check free disk space)")
            finally:
                self._prepared.set()

    def _prepare(self) -> None:
        zeros = bytes(_CHUNK)
        fd = os.open(self._partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            remaining = self.segment_size
            while remaining and not self._stopping:
                remaining -= os.write(fd, zeros[:min(_CHUNK, remaining)])
            os.fsync(fd)
        finally:
            os.close(fd)
        if self._stopping:
            os.remove(self._partial)
            return
        os.rename(self._partial, self._ready)

    def close(self) -> None:
        """Stop the thread (an unfinished file is removed)."""
        self._stopping = True
        self._wanted.set()
        self._thread.join()
        self._prepared.set()
