"""A bounded cache of open file descriptors, so that open files stay few whatever the file count.

Consume queues are one directory of files each, and a broker may hold hundreds of thousands of
queues (one per MQTT persistent session). Their files are opened through one ``DescriptorCache``
per store: at most ``capacity`` stay open, least recently used closed first. A descriptor in use
(``with cache.use(path) as fd``) is never closed under its user; a file about to be deleted is
``forget``-ed first. Opening a file when the process is out of descriptors (EMFILE, ENFILE)
closes half of the idle ones and tries once more.
"""
from __future__ import annotations

import errno
import os
import threading
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager

from . import fileops

_OUT_OF_DESCRIPTORS = (errno.EMFILE, errno.ENFILE)


class _Open:
    __slots__ = ("fd", "users", "forgotten")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.users = 0
        self.forgotten = False


class DescriptorCache:
    """Descriptors by path, opened with ``flags`` on first use. Thread-safe."""

    def __init__(self, capacity: int, flags: int, site: str) -> None:
        if capacity < 1:
            raise ValueError(f"a descriptor cache needs room for at least one file, not {capacity}; "
                             "raise store.max_open_queue_files")
        self.capacity = capacity
        self.flags = flags
        self.site = site
        self._lock = threading.Lock()
        self._open: OrderedDict[str, _Open] = OrderedDict()

    def __len__(self) -> int:
        return len(self._open)

    @contextmanager
    def use(self, path: str) -> Iterator[int]:
        """The descriptor of ``path`` (opened if need be), kept open until the block ends."""
        entry = self._acquire(path)
        try:
            yield entry.fd
        finally:
            with self._lock:
                entry.users -= 1
                if entry.forgotten and not entry.users:
                    os.close(entry.fd)

    def _acquire(self, path: str) -> _Open:
        with self._lock:
            entry = self._open.get(path)
            if entry is None:
                entry = self._open[path] = _Open(self._open_file(path))
                entry.users = 1
                self._shrink_to(self.capacity)
            else:
                self._open.move_to_end(path)
                entry.users += 1
            return entry

    def _open_file(self, path: str) -> int:
        try:
            return fileops.open_file(path, self.flags, site=self.site)
        except OSError as error:
            if error.errno not in _OUT_OF_DESCRIPTORS:
                raise
        self._shrink_to(len(self._open) // 2)
        return fileops.open_file(path, self.flags, site=self.site)

    def release_idle(self) -> None:
        """Close half of the idle descriptors: another part of the process ran out of them."""
        with self._lock:
            self._shrink_to(len(self._open) // 2)

    def _shrink_to(self, size: int) -> None:
        """Close idle descriptors, least recently used first, until at most ``size`` are open."""
        excess = len(self._open) - size
        for path in list(self._open):
            if excess <= 0:
                break
            entry = self._open[path]
            if not entry.users:
                del self._open[path]
                os.close(entry.fd)
                excess -= 1

    def forget(self, path: str) -> None:
        """Close ``path``'s descriptor (once its users are done): the file is being removed."""
        with self._lock:
            entry = self._open.pop(path, None)
            if entry is not None:
                entry.forgotten = True
                if not entry.users:
                    os.close(entry.fd)

    def close(self) -> None:
        """Close every descriptor not in use."""
        with self._lock:
            for entry in self._open.values():
                entry.forgotten = True
                if not entry.users:
                    os.close(entry.fd)
            self._open.clear()
