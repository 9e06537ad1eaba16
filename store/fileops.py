"""Every write the store makes to its files goes through here, checked.

A write loops until every byte is on its way to disk (a short write continues where it stopped;
a write that makes no progress raises), and every error names the file. Each call names its
*site* (``commitlog``, ``consumequeue``, ``index``, ``checkpoint``, ``preallocate``,
``compaction``, ``layout``, ``store``) and its operation (``open``, ``write``, ``sync``,
``truncate``, ``rename``, ``unlink``, ``allocate``, ``mkdir``), so that a test can install
another ``FileOps`` (see ``store/faults.py``) and make exactly one of them fail: short writes,
ENOSPC, EMFILE, EIO. Production uses plain ``os`` calls.

The functions of this module delegate to the one installed object; ``install`` replaces it.
"""
from __future__ import annotations

import ctypes
import errno
import mmap
import os
from collections.abc import Sequence

_IOV_MAX = 1024
_syncfs = getattr(ctypes.CDLL(None, use_errno=True), "syncfs", None)
"""libc's ``syncfs(fd)``, which Python's ``os`` lacks; None where libc has none."""


def _advance(views: list[memoryview], written: int) -> list[memoryview]:
    """``views`` without their first ``written`` bytes (after a partial write)."""
    while views and written >= len(views[0]):
        written -= len(views[0])
        views = views[1:]
    if views and written:
        views = [views[0][written:], *views[1:]]
    return views


def _take(views: list[memoryview], size: int) -> list[memoryview]:
    """The first ``size`` bytes of ``views``."""
    taken: list[memoryview] = []
    for view in views:
        if size <= 0:
            break
        taken.append(view[:size])
        size -= len(view)
    return taken


def _named(error: OSError, path: str) -> OSError:
    """``error`` with ``path`` as its file name, so that its message says which file failed."""
    if error.filename or not path:
        return error
    return type(error)(error.errno, error.strerror or os.strerror(error.errno or 0), path)


class FileOps:
    """Checked file operations over ``os``. Thread-safe (holds no state).

    ``admit`` is called before each system call; a test subclass overrides it to refuse the
    call (raise an ``OSError``) or to let a write through only partly (return fewer bytes).
    """

    def admit(self, site: str, op: str, path: str, size: int = 0) -> int:
        """How many of ``size`` bytes the next call of ``op`` at ``site`` may write."""
        return size

    def open(self, path: str, flags: int, mode: int = 0o644, *, site: str) -> int:
        self.admit(site, "open", path)
        return os.open(path, flags, mode)

    def pwrite(self, fd: int, data: bytes | bytearray | memoryview, offset: int, *, site: str,
               path: str) -> None:
        """Write all of ``data`` at ``offset``."""
        view = memoryview(data)
        while view:
            allowed = self.admit(site, "write", path, len(view))
            try:
                written = os.pwrite(fd, view[:allowed], offset)
            except OSError as error:
                raise _named(error, path) from None
            if written <= 0:
                raise OSError(errno.EIO, "a write made no progress", path)
            view, offset = view[written:], offset + written

    def pwritev(self, fd: int, views: Sequence[memoryview], offset: int, *, site: str,
                path: str) -> None:
        """Write all of ``views``, back to back, from ``offset``, with as few calls as possible."""
        pending = [view for view in views if len(view)]
        while pending:
            batch = pending[:_IOV_MAX]
            size = sum(map(len, batch))
            allowed = self.admit(site, "write", path, size)
            if allowed < size:
                batch = _take(batch, allowed)
            try:
                written = os.pwritev(fd, batch, offset)
            except OSError as error:
                raise _named(error, path) from None
            if written <= 0:
                raise OSError(errno.EIO, "a write made no progress", path)
            pending, offset = _advance(pending, written), offset + written

    def write(self, fd: int, data: bytes | bytearray | memoryview, *, site: str, path: str) -> None:
        """Write all of ``data`` at the file position."""
        view = memoryview(data)
        while view:
            allowed = self.admit(site, "write", path, len(view))
            try:
                written = os.write(fd, view[:allowed])
            except OSError as error:
                raise _named(error, path) from None
            if written <= 0:
                raise OSError(errno.EIO, "a write made no progress", path)
            view = view[written:]

    def fsync(self, fd: int, *, site: str, path: str) -> None:
        self.admit(site, "sync", path)
        try:
            os.fsync(fd)
        except OSError as error:
            raise _named(error, path) from None

    def fdatasync(self, fd: int, *, site: str, path: str) -> None:
        self.admit(site, "sync", path)
        try:
            os.fdatasync(fd)
        except OSError as error:
            raise _named(error, path) from None

    def syncfs(self, path: str, *, site: str) -> None:
        """Make every file written on the file system holding ``path`` durable, in one call
        however many files that is (Linux ``syncfs``; elsewhere ``sync``)."""
        self.admit(site, "sync", path)
        if _syncfs is None:
            os.sync()
            return
        fd = os.open(path, os.O_RDONLY)
        try:
            if _syncfs(fd) != 0:
                code = ctypes.get_errno()
                raise OSError(code, os.strerror(code), path)
        finally:
            os.close(fd)

    def msync(self, mm: mmap.mmap, *, site: str, path: str) -> None:
        self.admit(site, "sync", path)
        try:
            mm.flush()
        except OSError as error:
            raise _named(error, path) from None

    def ftruncate(self, fd: int, length: int, *, site: str, path: str) -> None:
        self.admit(site, "truncate", path)
        try:
            os.ftruncate(fd, length)
        except OSError as error:
            raise _named(error, path) from None

    def allocate(self, fd: int, offset: int, length: int, *, site: str, path: str) -> None:
        """Reserve disk blocks for [offset, offset + length): later writes there (through an
        mmap too) cannot run out of space."""
        self.admit(site, "allocate", path, length)
        try:
            os.posix_fallocate(fd, offset, length)
        except OSError as error:
            raise _named(error, path) from None

    def rename(self, source: str, target: str, *, site: str) -> None:
        """Rename ``source`` to ``target``, replacing it if it exists."""
        self.admit(site, "rename", target)
        os.replace(source, target)

    def unlink(self, path: str, *, site: str) -> None:
        self.admit(site, "unlink", path)
        os.unlink(path)

    def makedirs(self, path: str, *, site: str) -> None:
        """Create ``path`` and its missing parents; nothing to do if it exists."""
        if not os.path.isdir(path):
            self.admit(site, "mkdir", path)
            os.makedirs(path, exist_ok=True)


_installed = FileOps()


def install(ops: FileOps) -> FileOps:
    """Make ``ops`` serve every store file operation from now on; return the one it replaces."""
    global _installed
    previous, _installed = _installed, ops
    return previous


def installed() -> FileOps:
    """The object serving store file operations now."""
    return _installed


def open_file(path: str, flags: int, mode: int = 0o644, *, site: str) -> int:
    return _installed.open(path, flags, mode, site=site)


def pwrite(fd: int, data: bytes | bytearray | memoryview, offset: int, *, site: str, path: str) -> None:
    _installed.pwrite(fd, data, offset, site=site, path=path)


def pwritev(fd: int, views: Sequence[memoryview], offset: int, *, site: str, path: str) -> None:
    _installed.pwritev(fd, views, offset, site=site, path=path)


def write(fd: int, data: bytes | bytearray | memoryview, *, site: str, path: str) -> None:
    _installed.write(fd, data, site=site, path=path)


def fsync(fd: int, *, site: str, path: str) -> None:
    _installed.fsync(fd, site=site, path=path)


def fdatasync(fd: int, *, site: str, path: str) -> None:
    _installed.fdatasync(fd, site=site, path=path)


def syncfs(path: str, *, site: str) -> None:
    _installed.syncfs(path, site=site)


def msync(mm: mmap.mmap, *, site: str, path: str) -> None:
    _installed.msync(mm, site=site, path=path)


def ftruncate(fd: int, length: int, *, site: str, path: str) -> None:
    _installed.ftruncate(fd, length, site=site, path=path)


def allocate(fd: int, offset: int, length: int, *, site: str, path: str) -> None:
    _installed.allocate(fd, offset, length, site=site, path=path)


def rename(source: str, target: str, *, site: str) -> None:
    _installed.rename(source, target, site=site)


def unlink(path: str, *, site: str) -> None:
    _installed.unlink(path, site=site)


def remove_quietly(path: str, *, site: str) -> None:
    """Unlink ``path`` if it exists, for cleaning up after a failure: never raises."""
    try:
        _installed.unlink(path, site=site)
    except OSError:
        pass


def makedirs(path: str, *, site: str) -> None:
    _installed.makedirs(path, site=site)
