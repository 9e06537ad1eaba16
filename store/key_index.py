"""Persistent hash index from a message key to commit-log physical offsets.

Modeled on RocketMQ's ``IndexFile``: a directory of fixed-size files, each a hash table of
``slot_count`` slots whose entries are chained newest-first through a "previous entry" link.
It is derived data, rebuilt from the commit log when lost, so it is never fsynced per add.

Files are named by the 20-digit zero-padded phys offset of their first entry
(``00000000000000001234``). A file is created at its full size with ``os.ftruncate``
(sparse) and accessed through ``mmap``; disk blocks are reserved (``posix_fallocate``) for the
header and slots at creation and for the entries a chunk ahead of the next one, so no page is
ever touched before it has room on disk: a full disk is an ``OSError`` from the reservation,
never a SIGBUS from the mapping. All integers are little-endian::

    +-------------------+-----------------------------+------------------------------+
    |  header 56 bytes  |  slot_count slots x 4 bytes | max_entries entries x 24 B   |
    +-------------------+-----------------------------+------------------------------+

    header (56 bytes; bytes 16..56 are rewritten in the mmap on every add)
    +--------+---------+-------+------------+-------------+-------------+----------+
    | magic  | version | flags | slot_count | max_entries | entry_count | reserved |
    | "SKIX" | u16 = 1 | u16 0 | u32        | u32         | u32         | u32 0    |
    | @0     | @4      | @6    | @8         | @12         | @16         | @20      |
    +--------+---------+-------+------------+-------------+-------------+----------+
    +--------------+------------+----------+--------+
    | begin_offset | end_offset | begin_ts | end_ts |
    | u64          | u64        | i64 ms   | i64 ms |
    | @24          | @32        | @40      | @48    |
    +--------------+------------+----------+--------+
    begin_offset = lowest phys offset in the file (= the file name);
    end_offset   = highest phys offset in the file + 1 (exclusive);
    begin_ts / end_ts = min / max store timestamp of the file's entries.

    slot i (4 bytes): u32 number (1-based) of the newest entry with hash % slot_count == i;
    0 = empty.

    entry n (24 bytes) at 56 + slot_count*4 + (n-1)*24
    +-----------+-------------+-------------+------------+
    | key_hash  | phys_offset | store_ts_ms | prev_entry |
    | u32       | u64         | i64         | u32        |
    | @0        | @4          | @12         | @20        |
    +-----------+-------------+-------------+------------+
    key_hash = crc32c(key); prev_entry = previous head of the slot (0 = end of chain).

Invariants: offsets are added in non-decreasing order; all keys of one record go into one file;
a file is never empty. Files other than the newest are msynced when the next file is created,
so after a crash only the newest file can be torn; on open each file's header is checked
against its first and last entries, and a bad file is discarded together with every newer one.
"""
from __future__ import annotations

import array
import bisect
import errno
import logging
import mmap
import os
import struct
import sys
import threading
from collections.abc import Sequence
from types import TracebackType

from crc32c import crc32c

from . import fileops
from .commit_log import list_offset_files, offset_name

__all__ = ["KeyIndex", "MAGIC", "VERSION", "HEADER_SIZE", "SLOT_SIZE", "ENTRY_SIZE"]

_log = logging.getLogger(__name__)

MAGIC = b"SKIX"
VERSION = 1
_STATIC = struct.Struct("<4sHHII")  # magic, version, flags, slot_count, max_entries
_DYNAMIC = struct.Struct("<IIQQqq")  # entry_count, reserved, begin, end, begin_ts, end_ts
_SLOT = struct.Struct("<I")
_ENTRY = struct.Struct("<IQqI")  # key_hash, phys_offset, store_ts_ms, prev_entry
HEADER_SIZE = _STATIC.size + _DYNAMIC.size  # 56
SLOT_SIZE = _SLOT.size  # 4
ENTRY_SIZE = _ENTRY.size  # 24
_DYNAMIC_AT = _STATIC.size
_U32_MAX = 0xFFFF_FFFF
_SITE = "index"
_RESERVE_AHEAD = 1 << 20  # entry bytes reserved on disk beyond those in use
_TS_MIN, _TS_MAX = -(1 << 63), (1 << 63) - 1

_pack_entry = _ENTRY.pack_into
_unpack_entry = _ENTRY.unpack_from
_pack_slot = _SLOT.pack_into
_unpack_slot = _SLOT.unpack_from
_pack_dynamic = _DYNAMIC.pack_into


def _file_size(slot_count: int, max_entries: int) -> int:
    return HEADER_SIZE + slot_count * SLOT_SIZE + max_entries * ENTRY_SIZE


class _IndexFile:
    """One mmapped index file; its header fields are mirrored in attributes."""

    __slots__ = ("path", "mm", "slot_count", "max_entries", "entries_at",
                 "count", "begin", "end", "begin_ts", "end_ts", "allocated")

    def __init__(self, path: str, mm: mmap.mmap, slot_count: int, max_entries: int) -> None:
        self.path, self.mm = path, mm
        self.slot_count, self.max_entries = slot_count, max_entries
        self.entries_at = HEADER_SIZE + slot_count * SLOT_SIZE
        self.count = self.begin = self.end = self.begin_ts = self.end_ts = 0
        self.allocated = 0
        """Bytes from the start of the file known to have disk blocks reserved."""

    @classmethod
    def create(cls, path: str, slot_count: int, max_entries: int) -> _IndexFile:
        """Create a file of full size with blocks reserved for header and slots, and map it
        (the mmap keeps its own fd). On failure no file is left behind."""
        size = _file_size(slot_count, max_entries)
        fd = fileops.open_file(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, site=_SITE)
        try:
            fileops.ftruncate(fd, size, site=_SITE, path=path)
            reserved = min(size, HEADER_SIZE + slot_count * SLOT_SIZE + _RESERVE_AHEAD)
            fileops.allocate(fd, 0, reserved, site=_SITE, path=path)
            mm = mmap.mmap(fd, size)
        except BaseException:
            fileops.remove_quietly(path, site=_SITE)
            raise
        finally:
            os.close(fd)
        _STATIC.pack_into(mm, 0, MAGIC, VERSION, 0, slot_count, max_entries)
        created = cls(path, mm, slot_count, max_entries)
        created.allocated = reserved
        return created

    def reserve(self, entries: int) -> None:
        """Make sure disk blocks are reserved for the first ``entries`` entries (and a chunk
        beyond, if the disk has room), from the start of the file: raises OSError (ENOSPC)
        rather than let a write to the mapping fault.

        A reopened file starts from ``allocated = 0``: reserving blocks it already has takes no
        space, so on a full disk it still adds entries up to what was reserved before."""
        needed = self.entries_at + entries * ENTRY_SIZE
        if needed <= self.allocated:
            return
        target = min(len(self.mm), needed + _RESERVE_AHEAD)
        fd = fileops.open_file(self.path, os.O_RDWR, site=_SITE)
        try:
            try:
                fileops.allocate(fd, self.allocated, target - self.allocated, site=_SITE,
                                 path=self.path)
            except OSError as error:
                if error.errno != errno.ENOSPC:
                    raise
                target = needed  # no room for the chunk beyond: what is needed may be reserved
                fileops.allocate(fd, self.allocated, target - self.allocated, site=_SITE,
                                 path=self.path)
        finally:
            os.close(fd)
        self.allocated = target

    @classmethod
    def open(cls, path: str) -> _IndexFile:
        """Map an existing file; raise ValueError if it is malformed."""
        fd = fileops.open_file(path, os.O_RDWR, site=_SITE)
        try:
            size = os.fstat(fd).st_size
            head = os.pread(fd, HEADER_SIZE, 0)
            if len(head) < HEADER_SIZE:
                raise ValueError(f"file of {size} bytes is shorter than the header")
            magic, version, _, slots, entries = _STATIC.unpack_from(head)
            if magic != MAGIC or version != VERSION:
                raise ValueError(f"bad magic {magic!r} or version {version}")
            if slots < 1 or entries < 1 or size != _file_size(slots, entries):
                raise ValueError(f"size {size} does not match {slots} slots, {entries} entries")
            f = cls(path, mmap.mmap(fd, size), slots, entries)
        finally:
            os.close(fd)
        f.count, _, f.begin, f.end, f.begin_ts, f.end_ts = _DYNAMIC.unpack_from(f.mm, _DYNAMIC_AT)
        return f

    def check(self) -> None:
        """Raise ValueError unless the header agrees with the first and last entries."""
        if not 0 < self.count <= self.max_entries:
            raise ValueError(f"entry_count {self.count} out of range")
        if self.entry(1)[1] != self.begin or self.entry(self.count)[1] + 1 != self.end:
            raise ValueError("header offsets disagree with the entries")

    def entry(self, n: int) -> tuple[int, int, int, int]:
        """Entry number n (1-based): (key_hash, phys_offset, store_ts_ms, prev_entry)."""
        return _unpack_entry(self.mm, self.entries_at + (n - 1) * ENTRY_SIZE)

    def append(self, keys: Sequence[bytes], offset: int, ts: int) -> None:
        """Append one entry per key (room already checked) and rewrite the header."""
        mm, slots, n = self.mm, self.slot_count, self.count
        pos = self.entries_at + n * ENTRY_SIZE
        for key in keys:
            h = crc32c(key)
            at = HEADER_SIZE + (h % slots) * SLOT_SIZE
            _pack_entry(mm, pos, h, offset, ts, _unpack_slot(mm, at)[0])
            n += 1
            _pack_slot(mm, at, n)
            pos += ENTRY_SIZE
        if self.count == 0:
            self.begin, self.begin_ts, self.end_ts = offset, ts, ts
        elif ts < self.begin_ts:
            self.begin_ts = ts
        elif ts > self.end_ts:
            self.end_ts = ts
        self.count, self.end = n, offset + 1
        _pack_dynamic(mm, _DYNAMIC_AT, n, 0, self.begin, self.end, self.begin_ts, self.end_ts)

    def collect(self, h: int, lo: int, hi: int, limit: int, seen: set[int], out: list[int]) -> None:
        """Walk hash h's chain newest first, appending unseen offsets with lo <= ts <= hi."""
        mm, base = self.mm, self.entries_at - ENTRY_SIZE
        n = _unpack_slot(mm, HEADER_SIZE + (h % self.slot_count) * SLOT_SIZE)[0]
        bound = self.count + 1  # chain numbers strictly decrease: a torn file cannot loop
        while 0 < n < bound and len(out) < limit:
            eh, offset, ts, prev = _unpack_entry(mm, base + n * ENTRY_SIZE)
            if eh == h and lo <= ts <= hi and offset not in seen:
                seen.add(offset)
                out.append(offset)
            bound, n = n, prev

    def truncate_to(self, offset: int) -> None:
        """Drop entries with phys_offset >= offset; begin < offset < end must hold."""
        keep = bisect.bisect_left(range(1, self.count + 1), offset, key=self._offset_of)
        for n in range(self.count, keep, -1):  # newest first: entry n is its slot's head
            h, _, _, prev = self.entry(n)
            _pack_slot(self.mm, HEADER_SIZE + (h % self.slot_count) * SLOT_SIZE, prev)
        self.count, self.end = keep, self.entry(keep)[1] + 1
        self.begin_ts = self.end_ts = self.entry(1)[2]
        for n in range(2, keep + 1):
            ts = self.entry(n)[2]
            self.begin_ts, self.end_ts = min(self.begin_ts, ts), max(self.end_ts, ts)
        _pack_dynamic(self.mm, _DYNAMIC_AT, keep, 0, self.begin, self.end,
                      self.begin_ts, self.end_ts)

    def _offset_of(self, n: int) -> int:
        return self.entry(n)[1]

    def repair_slots(self) -> int:
        """Point every slot back at an entry the header counts; return how many were repaired.

        ``append`` writes an entry, then its slot, then the header: a process killed in between
        leaves a slot naming an entry past ``count``, which would hide that slot's whole chain.
        The entries it names were written first, so their ``prev`` links lead back.
        """
        slots = array.array("I")
        slots.frombytes(self.mm[HEADER_SIZE:self.entries_at])
        if sys.byteorder == "big":
            slots.byteswap()
        repaired = 0
        for index, n in enumerate(slots):
            if n > self.count:
                while n > self.count:
                    n = self.entry(n)[3] if n <= self.max_entries else 0
                _pack_slot(self.mm, HEADER_SIZE + index * SLOT_SIZE, n)
                repaired += 1
        return repaired

    def remove(self) -> None:
        """Unmap and delete the file."""
        self.mm.close()
        fileops.unlink(self.path, site=_SITE)


class KeyIndex:
    """Hash index from key bytes to commit-log phys offsets, in a directory of index files.

    ``lookup`` returns *candidates*: offsets whose entry has the same 32-bit key hash, which
    may be hash collisions. The caller must read each record and compare its keys.
    All methods are serialized by an internal lock. Existing files keep the geometry stored
    in their header; ``slot_count`` and ``max_entries`` apply to files created from now on.

    ``needs_rebuild_from`` is the begin offset (file name) of the first file discarded as
    invalid on open, else None; replaying the log from ``max_offset`` re-adds what was lost.
    """

    def __init__(self, directory: str, slot_count: int = 1_000_003,
                 max_entries: int = 4_000_000) -> None:
        """Open (creating if needed) the index in ``directory``, discarding bad files."""
        if not (0 < slot_count <= _U32_MAX and 0 < max_entries < _U32_MAX):
            raise ValueError("slot_count and max_entries must be in 1..2**32-2")
        self._dir, self._slot_count, self._max_entries = directory, slot_count, max_entries
        self._files: list[_IndexFile] = []
        self._lock = threading.Lock()
        self._closed = False
        self.needs_rebuild_from: int | None = None
        fileops.makedirs(directory, site=_SITE)
        self._load()
        self._max_offset = self._files[-1].end if self._files else 0

    @property
    def max_offset(self) -> int:
        """1 + the highest phys offset currently indexed, 0 if the index is empty."""
        return self._max_offset

    def add(self, key: bytes, phys_offset: int, store_ts_ms: int) -> None:
        """Index one key of the record at ``phys_offset``; same as ``add_many([key], ...)``."""
        self.add_many((key,), phys_offset, store_ts_ms)

    def add_many(self, keys: Sequence[bytes], phys_offset: int, store_ts_ms: int) -> None:
        """Index all keys of the record at ``phys_offset`` (stored in one file).

        Offsets must be non-decreasing across calls. A call with ``phys_offset <
        max_offset`` (already indexed: log replay) or with no keys does nothing.
        """
        with self._lock:
            if self._closed:
                raise ValueError("KeyIndex is closed")
            if phys_offset < self._max_offset or not keys:
                if phys_offset < 0:
                    raise ValueError(f"negative phys_offset {phys_offset}")
                return
            writable = self._writable(len(keys), phys_offset)
            writable.reserve(writable.count + len(keys))
            writable.append(keys, phys_offset, store_ts_ms)
            self._max_offset = phys_offset + 1

    def lookup(self, key: bytes, limit: int = 64, begin_ts_ms: int | None = None,
               end_ts_ms: int | None = None) -> list[int]:
        """Return up to ``limit`` distinct candidate offsets for ``key``, newest first.

        Candidates share the key's crc32c hash and may be collisions: verify each by
        reading the record. ``begin_ts_ms``/``end_ts_ms`` (inclusive) filter by store
        timestamp; files whose timestamp range misses the window are skipped whole.
        """
        lo = _TS_MIN if begin_ts_ms is None else begin_ts_ms
        hi = _TS_MAX if end_ts_ms is None else end_ts_ms
        h, out, seen = crc32c(key), [], set()
        with self._lock:
            self._check_open()
            for f in reversed(self._files):
                if len(out) >= limit:
                    break
                if f.end_ts >= lo and f.begin_ts <= hi:
                    f.collect(h, lo, hi, limit, seen, out)
        return out

    def flush(self) -> None:
        """msync the newest file, the only one with unflushed changes."""
        with self._lock:
            self._check_open()
            if self._files:
                newest = self._files[-1]
                fileops.msync(newest.mm, site=_SITE, path=newest.path)

    def truncate(self, offset: int) -> None:
        """Drop every entry with ``phys_offset >= offset`` (torn commit-log tail)."""
        with self._lock:
            self._check_open()
            while self._files and self._files[-1].begin >= offset:
                self._files.pop().remove()
            if self._files and self._files[-1].end > offset:
                self._files[-1].truncate_to(offset)
            self._max_offset = self._files[-1].end if self._files else 0

    def delete_before(self, offset: int) -> int:
        """Delete the files whose entries are all below ``offset``; return how many."""
        with self._lock:
            self._check_open()
            deleted = 0
            while self._files and self._files[0].end <= offset:
                self._files.pop(0).remove()
                deleted += 1
            self._max_offset = self._files[-1].end if self._files else 0
            return deleted

    def close(self) -> None:
        """Flush and unmap every file. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._files:
                newest = self._files[-1]
                try:
                    fileops.msync(newest.mm, site=_SITE, path=newest.path)
                except OSError as error:  # the last checkpoint flushed what it claims
                    _log.warning("could not flush key index file %s on close: %s", newest.path, error)
            for f in self._files:
                f.mm.close()
            self._files.clear()

    def __enter__(self) -> KeyIndex:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError("KeyIndex is closed")

    def _writable(self, needed: int, offset: int) -> _IndexFile:
        """The newest file if it has room for ``needed`` entries, else a new one."""
        last = self._files[-1] if self._files else None
        if last is not None and last.count + needed <= last.max_entries:
            return last
        if needed > self._max_entries:
            raise ValueError(f"{needed} keys exceed max_entries {self._max_entries}")
        if last is not None:  # full files stay untouched from now on
            fileops.msync(last.mm, site=_SITE, path=last.path)
        new = _IndexFile.create(os.path.join(self._dir, offset_name(offset)),
                                self._slot_count, self._max_entries)
        self._files.append(new)
        return new

    def _load(self) -> None:
        """Map every index file in name order, stopping at the first bad one."""
        names = [offset_name(offset) for offset in list_offset_files(self._dir)]
        for i, name in enumerate(names):
            try:
                self._files.append(self._open_checked(name))
            except ValueError as exc:
                self._discard(names[i:], exc)
                break
        if self._files and (repaired := self._files[-1].repair_slots()):
            _log.warning("key index file %s: repaired %d slots left by an interrupted add",
                         self._files[-1].path, repaired)

    def _open_checked(self, name: str) -> _IndexFile:
        f = _IndexFile.open(os.path.join(self._dir, name))
        try:
            f.check()
            if f.begin != int(name):
                raise ValueError(f"begin_offset {f.begin} differs from the file name")
            if self._files and self._files[-1].end > f.begin:
                raise ValueError("offsets overlap the previous file")
        except ValueError:
            f.mm.close()
            raise
        return f

    def _discard(self, names: list[str], exc: ValueError) -> None:
        """Delete a bad file and every newer one: the log must be replayed from there."""
        _log.warning("key index file %s is invalid (%s): discarding it and %d newer file(s)",
                     os.path.join(self._dir, names[0]), exc, len(names) - 1)
        for name in names:
            fileops.unlink(os.path.join(self._dir, name), site=_SITE)
        self.needs_rebuild_from = int(names[0])
