"""Persistent hash index from a message key to commit-log physical offsets.

Modeled on RocketMQ's ``IndexFile``: a directory of fixed-size files, each a hash table of
``slot_count`` slots whose entries are chained newest-first through a "previous entry" link.
It is derived data, rebuilt from the commit log when lost, so it is never fsynced per add.

Keys are hashed with BLAKE2b keyed by a random 16-byte secret of their file, truncated to 64
bits. Without the secret nobody can compute keys that share a hash or a slot, so one topic's
keys cannot be made to pile onto another's (a plain CRC32C can be collided at will: it is
linear). A lookup still yields *candidates*, which the caller verifies by reading the record,
and walks a key's chain to its end when asked: no cap on candidates that fail verification.

Files are named by the 20-digit zero-padded phys offset of their first entry
(``00000000000000001234``). A file is created at its full size with ``os.ftruncate``
(sparse) and accessed through ``mmap``; disk blocks are reserved (``posix_fallocate``) for the
header and slots at creation and for the entries a chunk ahead of the next one, so no page is
ever touched before it has room on disk: a full disk is an ``OSError`` from the reservation,
never a SIGBUS from the mapping. All integers are little-endian::

    +-------------------+-----------------------------+------------------------------+
    |  header 72 bytes  |  slot_count slots x 4 bytes | max_entries entries x 28 B   |
    +-------------------+-----------------------------+------------------------------+

    header (72 bytes; bytes 32..72 are rewritten in the mmap on every add)
    +--------+---------+-------+------------+-------------+-------------+
    | magic  | version | flags | slot_count | max_entries | hash_secret |
    | "SKIX" | u16 = 2 | u16 0 | u32        | u32         | 16 bytes    |
    | @0     | @4      | @6    | @8         | @12         | @16         |
    +--------+---------+-------+------------+-------------+-------------+
    +-------------+----------+--------------+------------+----------+--------+
    | entry_count | reserved | begin_offset | end_offset | begin_ts | end_ts |
    | u32         | u32 0    | u64          | u64        | i64 ms   | i64 ms |
    | @32         | @36      | @40          | @48        | @56      | @64    |
    +-------------+----------+--------------+------------+----------+--------+
    hash_secret  = random bytes drawn when the file is created: the BLAKE2b key of its hashes;
    begin_offset = lowest phys offset in the file (= the file name);
    end_offset   = highest phys offset in the file + 1 (exclusive);
    begin_ts / end_ts = min / max store timestamp of the file's entries.

    slot i (4 bytes): u32 number (1-based) of the newest entry with hash % slot_count == i;
    0 = empty.

    entry n (28 bytes) at 72 + slot_count*4 + (n-1)*28
    +-----------+-------------+-------------+------------+
    | key_hash  | phys_offset | store_ts_ms | prev_entry |
    | u64       | u64         | i64         | u32        |
    | @0        | @8          | @16         | @24        |
    +-----------+-------------+-------------+------------+
    key_hash = first 8 bytes of BLAKE2b(key, key=hash_secret); prev_entry = previous head of
    the slot (0 = end of chain).

Version 1 files (CRC32C hashes, 56-byte header, 24-byte entries) fail the version check at open
and are discarded like damaged ones: recovery replays the log from the first of them
(``needs_rebuild_from``), so an upgraded store rebuilds its index once, at its first start.

Invariants: offsets are added in non-decreasing order; all keys of one record go into one file;
a file is never empty. Files other than the newest are msynced when the next file is created,
so after a crash only the newest file can be torn; on open each file's header is checked
against its first and last entries, and a bad file is discarded together with every newer one.
"""
from __future__ import annotations

import array
import bisect
import errno
import hashlib
import logging
import mmap
import os
import struct
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from types import TracebackType
from typing import NamedTuple

from . import fileops
from .api import KeyCursor
from .commit_log import list_offset_files, offset_name
from .errors import InvalidCursorError

__all__ = ["KeyIndex", "MAGIC", "VERSION", "HEADER_SIZE", "SLOT_SIZE", "ENTRY_SIZE"]

_log = logging.getLogger(__name__)

MAGIC = b"SKIX"
VERSION = 2
SECRET_SIZE = 16
_STATIC = struct.Struct("<4sHHII16s")  # magic, version, flags, slot_count, max_entries, secret
_DYNAMIC = struct.Struct("<IIQQqq")  # entry_count, reserved, begin, end, begin_ts, end_ts
_SLOT = struct.Struct("<I")
_ENTRY = struct.Struct("<QQqI")  # key_hash, phys_offset, store_ts_ms, prev_entry
HEADER_SIZE = _STATIC.size + _DYNAMIC.size  # 72
SLOT_SIZE = _SLOT.size  # 4
ENTRY_SIZE = _ENTRY.size  # 28
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


def key_hasher(secret: bytes) -> Callable[[bytes], int]:
    """The hash function of a file whose secret is ``secret``: key bytes -> u64."""
    keyed = hashlib.blake2b(digest_size=8, key=secret)
    from_bytes = int.from_bytes

    def key_hash(key: bytes) -> int:
        h = keyed.copy()
        h.update(key)
        return from_bytes(h.digest(), "little")

    return key_hash


class _Walk(NamedTuple):
    """Where a walk over one key's chains goes on: entry ``entry`` of file ``begin`` (None: the
    head of the key's chain there; 0: that chain is done), skipping ``last`` (the offset handed
    out last, which the next entry may repeat)."""

    begin: int
    entry: int | None
    last: int


class _IndexFile:
    """One mmapped index file; its header fields are mirrored in attributes."""

    __slots__ = ("path", "mm", "slot_count", "max_entries", "entries_at", "hash",
                 "count", "begin", "end", "begin_ts", "end_ts", "allocated")

    def __init__(self, path: str, mm: mmap.mmap, slot_count: int, max_entries: int,
                 secret: bytes) -> None:
        self.path, self.mm = path, mm
        self.slot_count, self.max_entries = slot_count, max_entries
        self.entries_at = HEADER_SIZE + slot_count * SLOT_SIZE
        self.hash = key_hasher(secret)
        """The file's hash function: key bytes -> u64."""
        self.count = self.begin = self.end = self.begin_ts = self.end_ts = 0
        self.allocated = 0
        """Bytes from the start of the file known to have disk blocks reserved."""

    @classmethod
    def create(cls, path: str, slot_count: int, max_entries: int) -> _IndexFile:
        """Create a file of full size with blocks reserved for header and slots and a fresh
        secret, and map it (the mmap keeps its own fd). On failure no file is left behind."""
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
        secret = os.urandom(SECRET_SIZE)
        _STATIC.pack_into(mm, 0, MAGIC, VERSION, 0, slot_count, max_entries, secret)
        created = cls(path, mm, slot_count, max_entries, secret)
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
        """Map an existing file; raise ValueError if it is malformed or of another version."""
        fd = fileops.open_file(path, os.O_RDWR, site=_SITE)
        try:
            size = os.fstat(fd).st_size
            head = os.pread(fd, HEADER_SIZE, 0)
            if len(head) < 8:
                raise ValueError(f"file of {size} bytes is shorter than the header")
            magic, version = struct.unpack_from("<4sH", head)
            if magic != MAGIC or version != VERSION:
                raise ValueError(f"bad magic {magic!r} or version {version} (this build writes "
                                 f"version {VERSION})")
            if len(head) < HEADER_SIZE:
                raise ValueError(f"file of {size} bytes is shorter than the header")
            _, _, _, slots, entries, secret = _STATIC.unpack_from(head)
            if slots < 1 or entries < 1 or size != _file_size(slots, entries):
                raise ValueError(f"size {size} does not match {slots} slots, {entries} entries")
            f = cls(path, mmap.mmap(fd, size), slots, entries, secret)
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

    def head(self, h: int) -> int:
        """Number of the newest entry in hash ``h``'s slot (0: none)."""
        return _unpack_slot(self.mm, HEADER_SIZE + (h % self.slot_count) * SLOT_SIZE)[0]

    def append(self, keys: Sequence[bytes], offset: int, ts: int) -> None:
        """Append one entry per key (room already checked) and rewrite the header."""
        mm, slots, n, key_hash = self.mm, self.slot_count, self.count, self.hash
        pos = self.entries_at + n * ENTRY_SIZE
        for key in keys:
            h = key_hash(key)
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

    def collect(self, h: int, n: int, lo: int, hi: int, last: int, room: int,
                out: list[KeyCursor]) -> tuple[int, int]:
        """Walk hash h's chain newest first from entry n, appending up to ``room`` candidates
        with lo <= ts <= hi whose offset is not ``last`` (a record naming a key twice has two
        entries, next to each other in the chain). Return (the entry to go on from, 0 when
        the chain ended; the offset handed out last)."""
        mm, base = self.mm, self.entries_at - ENTRY_SIZE
        bound = self.count + 1  # chain numbers strictly decrease: a torn file cannot loop
        while 0 < n < bound:
            if room <= 0:
                return n, last
            eh, offset, ts, prev = _unpack_entry(mm, base + n * ENTRY_SIZE)
            if eh == h and lo <= ts <= hi and offset != last:
                out.append(KeyCursor(offset, n))
                last = offset
                room -= 1
            bound, n = n, prev
        return 0, last

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

    ``candidates`` and ``lookup`` return *candidates*: offsets whose entry has the key's
    64-bit keyed hash. Another key sharing it is astronomically unlikely and cannot be forged
    without the file's secret, but the caller still reads each record and compares its keys.
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
        """Up to ``limit`` distinct candidate offsets for ``key``, newest first (the first
        ``limit`` of ``candidates``)."""
        if limit <= 0:
            return []
        out = []
        for candidate in self.candidates(key, begin_ts_ms, end_ts_ms, page=limit):
            out.append(candidate.offset)
            if len(out) >= limit:
                break
        return out

    def candidates(self, key: bytes, begin_ts_ms: int | None = None, end_ts_ms: int | None = None,
                   after: KeyCursor | None = None, page: int = 64) -> Iterator[KeyCursor]:
        """Every candidate of ``key``, newest first, each offset once; after ``after`` (a
        candidate of the same key handed out before) when given.

        ``begin_ts_ms``/``end_ts_ms`` (inclusive) filter by store timestamp; files whose range
        misses the window are skipped whole. Candidates may be collisions: verify each by
        reading the record. The lock is taken for ``page`` candidates at a time, not held
        between them, so a long walk never stalls the dispatcher. InvalidCursorError when
        ``after`` names no entry of ``key`` (the index was rebuilt since, or it was made up);
        when retention removed its file, nothing older is left and nothing comes.
        """
        lo = _TS_MIN if begin_ts_ms is None else begin_ts_ms
        hi = _TS_MAX if end_ts_ms is None else end_ts_ms
        page = max(1, page)
        with self._lock:
            self._check_open()
            walk = self._start(key, after)
        while walk is not None:
            found: list[KeyCursor] = []
            with self._lock:
                self._check_open()
                walk = self._walk(key, lo, hi, walk, page, found)
            yield from found

    def _start(self, key: bytes, after: KeyCursor | None) -> _Walk | None:
        """Where a walk for ``key`` begins: the newest file's chain, or just past ``after``."""
        if not self._files:
            return None
        if after is None:
            return _Walk(self._files[-1].begin, None, -1)
        i = bisect.bisect_right(self._files, after.offset, key=_begin_of) - 1
        if i < 0:
            return None  # retention removed its file, and every older one
        f = self._files[i]
        if not (0 < after.entry <= f.count
                and f.entry(after.entry)[:2] == (f.hash(key), after.offset)):
            raise InvalidCursorError(f"cursor {after.offset}.{after.entry} names no entry of this "
                                     "key (the key index was rebuilt since, or it was made up)")
        return _Walk(f.begin, f.entry(after.entry)[3], after.offset)

    def _walk(self, key: bytes, lo: int, hi: int, walk: _Walk, room: int,
              out: list[KeyCursor]) -> _Walk | None:
        """Collect up to ``room`` candidates into ``out`` from ``walk`` on, through older
        files; where to go on, or None when every chain ended."""
        files = self._files
        i = bisect.bisect_left(files, walk.begin, key=_begin_of)
        entry, last = walk.entry, walk.last
        if i == len(files) or files[i].begin != walk.begin:
            i, entry = i - 1, None  # its file was removed: go on with the next older one
        while i >= 0:
            f = files[i]
            if f.end_ts >= lo and f.begin_ts <= hi:
                h = f.hash(key)
                entry, last = f.collect(h, f.head(h) if entry is None else entry, lo, hi, last,
                                        room - len(out), out)
                if entry:
                    return _Walk(f.begin, entry, last)
            i, entry = i - 1, None
        return None

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


def _begin_of(f: _IndexFile) -> int:
    return f.begin
