"""Unit tests for store.key_index: real index files in a temporary directory."""
from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

import pytest
from crc32c import crc32c
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import store.key_index
from store.api import KeyCursor
from store.errors import InvalidCursorError
from store.key_index import ENTRY_SIZE, HEADER_SIZE, SLOT_SIZE, KeyIndex, key_hasher

# Two keys with the same crc32c: an index hashing with CRC32C alone could not tell them apart.
COLLIDING = (b"key-1371838", b"key-2000402")


def index_files(directory: Path) -> list[str]:
    """Names of the index files in `directory`, oldest first."""
    return sorted(n for n in os.listdir(directory) if n.isdigit())


def file_secret(path: Path) -> bytes:
    """The hash secret in an index file's header."""
    return path.read_bytes()[16:32]


def fill(idx: KeyIndex, count: int, start: int = 0, step: int = 10) -> None:
    """Add records k0..k{count-1} at offsets start, start+step, ... with ts = offset."""
    for i in range(count):
        idx.add(b"k%d" % i, start + i * step, start + i * step)


def test_round_trip(tmp_path: Path) -> None:
    with KeyIndex(str(tmp_path), slot_count=101, max_entries=100) as idx:
        idx.add(b"alpha", 0, 1000)
        idx.add_many([b"beta", b"gamma"], 57, 1001)
        assert idx.lookup(b"alpha") == [0]
        assert idx.lookup(b"beta") == [57]
        assert idx.lookup(b"gamma") == [57]
        assert idx.lookup(b"missing") == []
        assert idx.max_offset == 58


def test_file_layout(tmp_path: Path) -> None:
    with KeyIndex(str(tmp_path), slot_count=7, max_entries=5) as idx:
        idx.add(b"a", 1234, 1)
    assert index_files(tmp_path) == ["00000000000000001234"]
    size = (tmp_path / "00000000000000001234").stat().st_size
    assert size == HEADER_SIZE + 7 * SLOT_SIZE + 5 * ENTRY_SIZE == 72 + 28 + 140


def test_slot_collisions_keep_separate_chains(tmp_path: Path) -> None:
    with KeyIndex(str(tmp_path), slot_count=3, max_entries=10_000) as idx:
        for i in range(300):
            idx.add_many([b"key%d" % (i % 50)], i, i)
        for k in range(50):
            expected = [i for i in reversed(range(300)) if i % 50 == k]
            assert idx.lookup(b"key%d" % k) == expected


def test_crc32c_collisions_are_not_candidates_of_each_other(tmp_path: Path) -> None:
    a, b = COLLIDING
    assert a != b and crc32c(a) == crc32c(b)
    with KeyIndex(str(tmp_path), slot_count=11, max_entries=100) as idx:
        idx.add(a, 10, 1)
        idx.add(b, 20, 2)
        assert idx.lookup(a) == [10]
        assert idx.lookup(b) == [20]


def test_hash_collisions_are_returned_as_candidates(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(store.key_index, "key_hasher", lambda secret: crc32c)  # a weak hash
    a, b = COLLIDING
    with KeyIndex(str(tmp_path), slot_count=11, max_entries=100) as idx:
        idx.add(a, 10, 1)
        idx.add(b, 20, 2)
        assert idx.lookup(a) == [20, 10]
        assert idx.lookup(b) == [20, 10]


def test_every_file_hashes_with_a_secret_of_its_own(tmp_path: Path) -> None:
    with KeyIndex(str(tmp_path), slot_count=3, max_entries=4) as idx:
        fill(idx, 10)  # files 0, 40, 80
    secrets = {file_secret(tmp_path / name) for name in index_files(tmp_path)}
    assert len(secrets) == 3 and all(len(s) == 16 for s in secrets)
    hashes = {key_hasher(s)(b"k1") for s in secrets}
    assert len(hashes) == 3 and all(h.bit_length() <= 64 for h in hashes)


def test_candidates_go_on_from_a_cursor(tmp_path: Path) -> None:
    with KeyIndex(str(tmp_path), slot_count=3, max_entries=4) as idx:
        for i in range(10):
            idx.add_many([b"k", b"k", b"own%d" % i], i * 100, i)  # a key twice: one candidate
        everything = list(idx.candidates(b"k", page=3))
        assert [c.offset for c in everything] == [i * 100 for i in reversed(range(10))]
        for at in range(10):
            rest = list(idx.candidates(b"k", after=everything[at], page=2))
            assert rest == everything[at + 1:]
        assert list(idx.candidates(b"k", begin_ts_ms=3, end_ts_ms=6, after=everything[4])) == everything[5:7]


def test_a_cursor_must_name_an_entry_of_the_key(tmp_path: Path) -> None:
    with KeyIndex(str(tmp_path), slot_count=3, max_entries=4) as idx:
        fill(idx, 10)
        [k3] = idx.candidates(b"k3")
        for forged in (KeyCursor(k3.offset, k3.entry + 1), KeyCursor(k3.offset + 1, k3.entry),
                       KeyCursor(35, 1), KeyCursor(10**9, 1)):
            with pytest.raises(InvalidCursorError):
                list(idx.candidates(b"k3", after=forged))
        with pytest.raises(InvalidCursorError):
            list(idx.candidates(b"k4", after=k3))
        assert list(idx.candidates(b"k3", after=k3)) == []


def test_a_cursor_into_a_file_retention_removed_ends_the_walk(tmp_path: Path) -> None:
    with KeyIndex(str(tmp_path), slot_count=3, max_entries=4) as idx:
        for i in range(10):
            idx.add(b"k", i * 10, i)  # files 0, 40, 80
        walk = idx.candidates(b"k", page=1)
        assert [next(walk).offset for _ in range(5)] == [90, 80, 70, 60, 50]
        old = next(idx.candidates(b"k", begin_ts_ms=0, end_ts_ms=1))
        idx.delete_before(40)
        assert [c.offset for c in walk] == [40]
        assert list(idx.candidates(b"k", after=old)) == []


def test_a_version_1_file_is_discarded_for_a_rebuild(tmp_path: Path) -> None:
    with KeyIndex(str(tmp_path), slot_count=3, max_entries=4) as idx:
        fill(idx, 10)  # files 0, 40, 80
    for name in index_files(tmp_path):
        with open(tmp_path / name, "r+b") as f:
            f.seek(4)
            f.write((1).to_bytes(2, "little"))
    with KeyIndex(str(tmp_path), slot_count=3, max_entries=4) as idx:
        assert idx.needs_rebuild_from == 0 and index_files(tmp_path) == [] and idx.max_offset == 0
        fill(idx, 10)
        assert all(idx.lookup(b"k%d" % i) == [i * 10] for i in range(10))


def test_newest_first_limit_and_dedup(tmp_path: Path) -> None:
    with KeyIndex(str(tmp_path), slot_count=5, max_entries=1000) as idx:
        for off in range(0, 100, 5):
            idx.add_many([b"k", b"other", b"k"], off, off)  # duplicate key in one record
        assert idx.lookup(b"k") == list(range(95, -1, -5))
        assert idx.lookup(b"k", limit=3) == [95, 90, 85]
        assert idx.lookup(b"k", limit=0) == []


def test_rolls_across_files_and_lookup_spans_them(tmp_path: Path) -> None:
    with KeyIndex(str(tmp_path), slot_count=3, max_entries=4) as idx:
        for i in range(10):
            idx.add_many([b"shared", b"own%d" % i], i * 100, i)
        assert index_files(tmp_path) == ["%020d" % o for o in (0, 200, 400, 600, 800)]
        assert idx.lookup(b"shared") == [i * 100 for i in reversed(range(10))]
        assert idx.lookup(b"shared", limit=5) == [900, 800, 700, 600, 500]
        assert all(idx.lookup(b"own%d" % i) == [i * 100] for i in range(10))


def test_record_keys_never_split_across_files(tmp_path: Path) -> None:
    with KeyIndex(str(tmp_path), slot_count=3, max_entries=4) as idx:
        idx.add_many([b"a", b"b", b"c"], 0, 0)
        idx.add_many([b"d", b"e"], 5, 0)  # does not fit in the 1 free entry
        assert index_files(tmp_path) == ["%020d" % 0, "%020d" % 5]
        with pytest.raises(ValueError, match="exceed max_entries"):
            idx.add_many([b"1", b"2", b"3", b"4", b"5"], 9, 0)


def test_reopen_finds_everything(tmp_path: Path) -> None:
    with KeyIndex(str(tmp_path), slot_count=3, max_entries=4) as idx:
        fill(idx, 10)
    with KeyIndex(str(tmp_path), slot_count=3, max_entries=4) as idx:
        assert idx.max_offset == 91
        assert idx.needs_rebuild_from is None
        assert all(idx.lookup(b"k%d" % i) == [i * 10] for i in range(10))
        idx.add(b"k0", 100, 100)
        assert idx.lookup(b"k0") == [100, 0]


def test_reopen_with_other_geometry_reads_old_files(tmp_path: Path) -> None:
    with KeyIndex(str(tmp_path), slot_count=3, max_entries=4) as idx:
        fill(idx, 6)
    with KeyIndex(str(tmp_path), slot_count=17, max_entries=50) as idx:
        fill(idx, 3, start=100)
        assert idx.lookup(b"k1") == [110, 10]
        assert len(index_files(tmp_path)) == 3


def test_replay_is_idempotent(tmp_path: Path) -> None:
    with KeyIndex(str(tmp_path), slot_count=3, max_entries=4) as idx:
        fill(idx, 10)
        idx.add_many([b"x", b"y"], 90, 90)  # same offset as the last record: skipped
        idx.flush()
        before = {n: (tmp_path / n).read_bytes() for n in index_files(tmp_path)}
        fill(idx, 10)
        assert {n: (tmp_path / n).read_bytes() for n in index_files(tmp_path)} == before
        assert idx.lookup(b"x") == [] and idx.max_offset == 91
    with KeyIndex(str(tmp_path), slot_count=3, max_entries=4) as idx:
        fill(idx, 10)
        assert idx.lookup(b"k3") == [30]


def test_empty_key_list_is_a_no_op(tmp_path: Path) -> None:
    with KeyIndex(str(tmp_path), slot_count=3, max_entries=4) as idx:
        idx.add_many([], 5, 5)
        assert idx.max_offset == 0 and index_files(tmp_path) == []


def test_truncate_within_newest_file(tmp_path: Path) -> None:
    with KeyIndex(str(tmp_path), slot_count=2, max_entries=100) as idx:
        for off in range(20):
            idx.add_many([b"even" if off % 2 == 0 else b"odd", b"all"], off, 1000 + off)
        idx.truncate(13)
        assert idx.max_offset == 13
        assert idx.lookup(b"all") == list(range(12, -1, -1))
        assert idx.lookup(b"odd") == [11, 9, 7, 5, 3, 1]
        assert idx.lookup(b"all", begin_ts_ms=1010) == [12, 11, 10]  # header ts range fixed
        idx.add(b"odd", 13, 5000)
        assert idx.lookup(b"odd", limit=2) == [13, 11]
    with KeyIndex(str(tmp_path), slot_count=2, max_entries=100) as idx:
        assert idx.lookup(b"even") == [12, 10, 8, 6, 4, 2, 0]
        assert idx.lookup(b"all", begin_ts_ms=1012, end_ts_ms=4999) == [12]


def test_truncate_across_files_then_add(tmp_path: Path) -> None:
    with KeyIndex(str(tmp_path), slot_count=3, max_entries=4) as idx:
        fill(idx, 10)  # files start at 0, 40, 80
        idx.truncate(45)
        assert index_files(tmp_path) == ["%020d" % 0, "%020d" % 40]
        assert idx.max_offset == 41
        assert [i for i in range(10) if idx.lookup(b"k%d" % i)] == [0, 1, 2, 3, 4]
        idx.add(b"k9", 45, 45)
        idx.add(b"k9", 46, 46)
        assert idx.lookup(b"k9") == [46, 45]
        idx.truncate(40)
        assert index_files(tmp_path) == ["%020d" % 0] and idx.max_offset == 31
        idx.truncate(0)
        assert index_files(tmp_path) == [] and idx.max_offset == 0
        fill(idx, 2)
        assert idx.lookup(b"k1") == [10]


def test_truncate_past_the_end_changes_nothing(tmp_path: Path) -> None:
    with KeyIndex(str(tmp_path), slot_count=3, max_entries=4) as idx:
        fill(idx, 5)
        idx.truncate(41)
        assert idx.max_offset == 41 and idx.lookup(b"k4") == [40]


def test_delete_before_removes_whole_old_files(tmp_path: Path) -> None:
    with KeyIndex(str(tmp_path), slot_count=3, max_entries=4) as idx:
        fill(idx, 10)  # files [0..30], [40..70], [80, 90]
        assert idx.delete_before(30) == 0  # offset 30 is still needed
        assert idx.delete_before(31) == 1
        assert index_files(tmp_path) == ["%020d" % 40, "%020d" % 80]
        assert [i for i in range(10) if idx.lookup(b"k%d" % i)] == [4, 5, 6, 7, 8, 9]
        assert idx.max_offset == 91
    with KeyIndex(str(tmp_path), slot_count=3, max_entries=4) as idx:
        assert idx.lookup(b"k0") == [] and idx.lookup(b"k4") == [40]
        assert idx.delete_before(10**6) == 2
        assert index_files(tmp_path) == [] and idx.max_offset == 0
        assert idx.lookup(b"k9") == []
        fill(idx, 1, start=1000)
        assert idx.lookup(b"k0") == [1000]


def test_time_range_filters_entries_and_files(tmp_path: Path) -> None:
    with KeyIndex(str(tmp_path), slot_count=3, max_entries=4) as idx:
        for i in range(12):
            idx.add(b"k", i, 1000 + i * 10)
        assert idx.lookup(b"k", begin_ts_ms=1030, end_ts_ms=1050) == [5, 4, 3]
        assert idx.lookup(b"k", begin_ts_ms=1095) == [11, 10]
        assert idx.lookup(b"k", end_ts_ms=1015) == [1, 0]
        assert idx.lookup(b"k", begin_ts_ms=2000) == []
        assert idx.lookup(b"k", begin_ts_ms=1000, end_ts_ms=1110, limit=2) == [11, 10]


def test_time_range_with_unordered_timestamps(tmp_path: Path) -> None:
    with KeyIndex(str(tmp_path), slot_count=3, max_entries=4) as idx:
        for off, ts in enumerate([50, 10, 40, 20, 30, 5]):
            idx.add(b"k", off, ts)
        assert idx.lookup(b"k", begin_ts_ms=5, end_ts_ms=10) == [5, 1]
        assert idx.lookup(b"k", begin_ts_ms=35) == [2, 0]


def corrupt_magic(path: Path) -> None:
    """Overwrite the file's magic number."""
    with open(path, "r+b") as f:
        f.write(b"XXXX")


def test_bad_magic_discards_file_and_newer_ones(tmp_path: Path, caplog) -> None:
    with KeyIndex(str(tmp_path), slot_count=3, max_entries=4) as idx:
        fill(idx, 10)  # files 0, 40, 80
    corrupt_magic(tmp_path / ("%020d" % 40))
    with caplog.at_level(logging.WARNING, logger="store.key_index"):
        idx = KeyIndex(str(tmp_path), slot_count=3, max_entries=4)
    with idx:
        assert "%020d" % 40 in caplog.text and "bad magic" in caplog.text
        assert idx.needs_rebuild_from == 40
        assert index_files(tmp_path) == ["%020d" % 0]
        assert idx.max_offset == 31
        assert idx.lookup(b"k8") == [] and idx.lookup(b"k3") == [30]
        fill(idx, 10)  # replay from the log: skips what is still indexed
        assert all(idx.lookup(b"k%d" % i) == [i * 10] for i in range(10))


@pytest.mark.parametrize("damage", ["truncate", "torn_header", "empty", "wrong_name"])
def test_other_invalid_files_are_discarded(tmp_path: Path, damage: str) -> None:
    with KeyIndex(str(tmp_path), slot_count=3, max_entries=4) as idx:
        fill(idx, 6)  # files 0, 40
    path = tmp_path / ("%020d" % 40)
    if damage == "truncate":
        os.truncate(path, 100)
    elif damage == "torn_header":
        with open(path, "r+b") as f:
            f.seek(32)
            f.write((3).to_bytes(4, "little"))  # entry_count 3, but end_offset says 51
    elif damage == "empty":
        path.write_bytes(b"")
    else:
        path.rename(tmp_path / ("%020d" % 41))
    with KeyIndex(str(tmp_path), slot_count=3, max_entries=4) as idx:
        assert idx.needs_rebuild_from in (40, 41)
        assert index_files(tmp_path) == ["%020d" % 0] and idx.max_offset == 31


def test_overlapping_file_is_discarded(tmp_path: Path) -> None:
    with KeyIndex(str(tmp_path / "a"), slot_count=3, max_entries=4) as idx:
        fill(idx, 3)  # one file, offsets 0..20
    with KeyIndex(str(tmp_path / "b"), slot_count=3, max_entries=4) as idx:
        idx.add(b"x", 15, 0)
    (tmp_path / "b" / ("%020d" % 15)).rename(tmp_path / "a" / ("%020d" % 15))
    with KeyIndex(str(tmp_path / "a"), slot_count=3, max_entries=4) as idx:
        assert idx.needs_rebuild_from == 15 and idx.max_offset == 21


def test_corrupt_chain_cannot_loop(tmp_path: Path) -> None:
    with KeyIndex(str(tmp_path), slot_count=3, max_entries=4) as idx:
        idx.add(b"k", 0, 0)
        idx.add(b"k", 1, 0)
    with open(tmp_path / ("%020d" % 0), "r+b") as f:
        f.seek(HEADER_SIZE + 3 * SLOT_SIZE + 24)  # prev_entry of entry 1
        f.write((2).to_bytes(4, "little"))  # points forward, to entry 2
    with KeyIndex(str(tmp_path), slot_count=3, max_entries=4) as idx:
        assert idx.lookup(b"k") == [1, 0]


def test_unrelated_files_are_ignored(tmp_path: Path) -> None:
    (tmp_path / "README").write_text("not an index file")
    with KeyIndex(str(tmp_path), slot_count=3, max_entries=4) as idx:
        fill(idx, 2)
    with KeyIndex(str(tmp_path / "sub" / "dir"), slot_count=3, max_entries=4) as idx:
        assert idx.max_offset == 0
    assert (tmp_path / "README").exists()


def test_closed_index_rejects_calls(tmp_path: Path) -> None:
    idx = KeyIndex(str(tmp_path), slot_count=3, max_entries=4)
    fill(idx, 2)
    idx.close()
    idx.close()
    for call in (lambda: idx.add(b"a", 99, 0), lambda: idx.lookup(b"a"), idx.flush,
                 lambda: idx.truncate(0), lambda: idx.delete_before(0)):
        with pytest.raises(ValueError, match="closed"):
            call()


def test_invalid_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        KeyIndex(str(tmp_path), slot_count=0)
    with KeyIndex(str(tmp_path), slot_count=3, max_entries=4) as idx:
        with pytest.raises(ValueError, match="negative"):
            idx.add(b"a", -1, 0)


# ---- property test against a model ---------------------------------------------------------

KEYS = [b"a", b"b", b"c", b"d", b"e", *COLLIDING]
add_op = st.tuples(st.just("add"), st.lists(st.sampled_from(KEYS), max_size=3),
                   st.integers(0, 3), st.integers(0, 50))
lookup_op = st.tuples(st.just("lookup"), st.sampled_from(KEYS), st.integers(0, 8),
                      st.one_of(st.none(), st.integers(0, 50)),
                      st.one_of(st.none(), st.integers(0, 50)))
truncate_op = st.tuples(st.just("truncate"), st.integers(0, 40))
reopen_op = st.tuples(st.just("reopen"))
operations = st.lists(st.one_of(add_op, add_op, add_op, lookup_op, lookup_op,
                                truncate_op, reopen_op), max_size=60)


class Model:
    """The index as a plain list of (key, offset, ts) entries in insertion order."""

    def __init__(self) -> None:
        self.entries: list[tuple[bytes, int, int]] = []

    @property
    def max_offset(self) -> int:
        return self.entries[-1][1] + 1 if self.entries else 0

    def add_many(self, keys: list[bytes], offset: int, ts: int) -> None:
        if keys and offset >= self.max_offset:
            self.entries += [(k, offset, ts) for k in keys]

    def lookup(self, key: bytes, limit: int, lo: int | None, hi: int | None) -> list[int]:
        out: list[int] = []
        for k, offset, ts in reversed(self.entries):
            ok = k == key and (lo is None or ts >= lo) and (hi is None or ts <= hi)
            if ok and offset not in out and len(out) < limit:
                out.append(offset)
        return out

    def truncate(self, offset: int) -> None:
        self.entries = [e for e in self.entries if e[1] < offset]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=operations)
def test_matches_model(ops: list[tuple]) -> None:
    model, offset = Model(), 0
    with tempfile.TemporaryDirectory() as directory:
        idx = KeyIndex(directory, slot_count=3, max_entries=5)
        try:
            for op in ops:
                if op[0] == "add":
                    _, keys, step, ts = op
                    offset += step  # non-decreasing; step 0 replays the previous offset
                    idx.add_many(keys, offset, ts)
                    model.add_many(keys, offset, ts)
                elif op[0] == "lookup":
                    _, key, limit, lo, hi = op
                    assert idx.lookup(key, limit, lo, hi) == model.lookup(key, limit, lo, hi)
                elif op[0] == "truncate":
                    idx.truncate(op[1])
                    model.truncate(op[1])
                    offset = min(offset, op[1])
                else:
                    idx.close()
                    idx = KeyIndex(directory, slot_count=3, max_entries=5)
                    assert idx.needs_rebuild_from is None
                assert idx.max_offset == model.max_offset
            for key in KEYS:
                assert idx.lookup(key, 100) == model.lookup(key, 100, None, None)
        finally:
            idx.close()


def interrupt_an_add(directory: Path, keys: list[bytes], offset: int) -> None:
    """Do to the newest file what a process killed inside ``add_many`` leaves behind: the
    entries and their slots written, the header (entry count) not yet."""
    import mmap
    import struct

    path = directory / index_files(directory)[-1]
    key_hash = key_hasher(file_secret(path))
    with open(path, "r+b") as file, mmap.mmap(file.fileno(), 0) as mm:
        slot_count, = struct.unpack_from("<I", mm, 8)
        count, = struct.unpack_from("<I", mm, 32)
        entries_at = HEADER_SIZE + slot_count * SLOT_SIZE
        for key in keys:
            h = key_hash(key)
            slot_at = HEADER_SIZE + (h % slot_count) * SLOT_SIZE
            head, = struct.unpack_from("<I", mm, slot_at)
            struct.pack_into("<QQqI", mm, entries_at + count * ENTRY_SIZE, h, offset, offset, head)
            count += 1
            struct.pack_into("<I", mm, slot_at, count)


def test_an_add_cut_short_by_a_crash_hides_no_older_entry(tmp_path: Path, caplog) -> None:
    with KeyIndex(str(tmp_path), slot_count=7, max_entries=1000) as idx:
        fill(idx, 50)  # k0..k49 at 0, 10, ..., 490: every slot has a long chain
    interrupt_an_add(tmp_path, [b"k3", b"k40"], 500)
    with caplog.at_level(logging.WARNING), KeyIndex(str(tmp_path), slot_count=7, max_entries=1000) as idx:
        assert any("repaired" in record.getMessage() for record in caplog.records)
        assert idx.max_offset == 491
        assert idx.lookup(b"k3") == [30] and idx.lookup(b"k40") == [400]
        assert all(idx.lookup(b"k%d" % i) == [i * 10] for i in range(50))
        idx.add_many([b"k3", b"k40"], 500, 500)  # recovery replays the interrupted record
        assert idx.lookup(b"k3") == [500, 30] and idx.lookup(b"k40") == [500, 400]
