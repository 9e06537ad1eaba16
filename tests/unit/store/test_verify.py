"""`sluice store verify` checks every consume-queue entry against the log, not only the log."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from store import record
from store.api import StoreConfig
from store.consume_queue import ENTRY, ENTRY_SIZE
from store.file_store import FileStore
from store.reader import StoreReader

REPO = Path(__file__).resolve().parents[3]
CONFIG = StoreConfig(segment_size=8192, queue_entries_per_file=16, index_slot_count=97, index_max_entries=64)


@pytest.fixture
def data_dir(tmp_path) -> str:
    """A cleanly closed store: 40 records in t/0 and t/1, every third also fanned out to fan/0."""
    directory = str(tmp_path / "data")
    with FileStore(directory, CONFIG) as store:
        for i in range(80):
            result = store.append("t", f"record {i}".encode() * 5, queue_id=i % 2,
                                  extra_queues=(("fan", 0),) if i % 3 == 0 else ())
        assert store.wait_durable(result.end_offset, timeout=60)
    return directory


def problems(directory: str) -> list[str]:
    reader = StoreReader(directory)
    try:
        return reader.verify()
    finally:
        reader.close()


def overwrite_entry(directory: str, queue: str, offset: int, entry: bytes) -> None:
    path = os.path.join(directory, "consumequeue", queue, f"{offset - offset % 16:020d}")
    with open(path, "r+b") as file:
        file.seek((offset % 16) * ENTRY_SIZE)
        file.write(entry)


def read_entry(directory: str, queue: str, offset: int) -> tuple[int, int, int]:
    path = os.path.join(directory, "consumequeue", queue, f"{offset - offset % 16:020d}")
    with open(path, "rb") as file:
        file.seek((offset % 16) * ENTRY_SIZE)
        return ENTRY.unpack(file.read(ENTRY_SIZE))


def test_an_entry_lost_to_a_short_write_is_reported_when_the_log_holds_its_record(data_dir):
    """What a short consume-queue write left after a crash: a hole of zeros (size 0) in the
    queue file although the record is intact in the log."""
    overwrite_entry(data_dir, "t/0", 5, bytes(ENTRY_SIZE))
    found = problems(data_dir)
    assert len(found) == 1 and "'t'/0 offset 5" in found[0] and "marked lost (size 0)" in found[0]
    done = subprocess.run([sys.executable, "-m", "sluice.cli", "store", "verify", data_dir],
                          capture_output=True, text=True, cwd=REPO, timeout=60)
    assert done.returncode == 1 and done.stdout.splitlines() == found


def test_an_entry_past_the_end_of_the_log_is_reported(data_dir):
    phys, size, tag = read_entry(data_dir, "t/1", 39)
    overwrite_entry(data_dir, "t/1", 39, ENTRY.pack(phys + 10_000, size, tag))
    found = problems(data_dir)
    assert len(found) == 1 and "'t'/1 offset 39" in found[0] and "past the end" in found[0]


def test_an_entry_pointing_at_another_queues_record_is_reported(data_dir):
    overwrite_entry(data_dir, "t/0", 3, ENTRY.pack(*read_entry(data_dir, "t/1", 3)))
    found = problems(data_dir)
    assert len(found) == 1 and "'t'/0 offset 3" in found[0] and "not dispatched to this queue" in found[0]


def test_an_entry_with_the_wrong_size_or_offset_is_reported(data_dir):
    phys, size, tag = read_entry(data_dir, "fan/0", 2)
    overwrite_entry(data_dir, "fan/0", 2, ENTRY.pack(phys, size + 1, tag))
    overwrite_entry(data_dir, "fan/0", 4, ENTRY.pack(phys + 1, size, tag))
    found = problems(data_dir)
    assert len(found) == 2
    assert "'fan'/0 offset 2" in found[0] and f"says {size + 1} bytes" in found[0]
    assert "'fan'/0 offset 4" in found[1] and "no valid record" in found[1]


def store_verify(directory: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sluice.cli", "store", "verify", directory],
                          capture_output=True, text=True, cwd=REPO, timeout=60)


def segment_names(directory: str) -> list[str]:
    return sorted(name for name in os.listdir(os.path.join(directory, "commitlog")) if name.isdigit())


def tear_the_tail(directory: str) -> tuple[str, int, int]:
    """What a crash in the middle of a write leaves: the first part of a record after the last
    one (no queue entry points at it), cut in its body, and no clean checkpoint. Returns the
    segment's name, the offset and the size of the part."""
    segments = segment_names(directory)
    reader = StoreReader(directory)
    try:
        end = reader.log.end_offset
    finally:
        reader.close()
    whole = record.encode(end, 0, 99, 0, 0, b"t", b"id", b"", b"", b"", b"", b"z" * 200)
    torn = whole[:len(whole) - 100]
    with open(os.path.join(directory, "commitlog", segments[-1]), "r+b") as file:
        file.seek(end - int(segments[-1]))
        file.write(torn)
    os.remove(os.path.join(directory, "checkpoint"))
    return segments[-1], end, len(torn)


def test_a_torn_tail_is_reported_as_such_and_is_no_problem(data_dir):
    segment, offset, size = tear_the_tail(data_dir)
    assert problems(data_dir) == []
    done = store_verify(data_dir)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines() == [
        f"segment {segment}: torn tail of {size} bytes at offset {offset} (a write cut short by a "
        "crash), cut at the next start", "ok"]
    with FileStore(data_dir, CONFIG) as store:  # the next start cuts it
        assert store.recovery.truncated_bytes == size
    assert store_verify(data_dir).stdout == "ok\n"


def test_corruption_in_the_middle_is_a_problem_beside_a_torn_tail(data_dir):
    _, _, size = tear_the_tail(data_dir)
    segment = segment_names(data_dir)[0]
    with open(os.path.join(data_dir, "commitlog", segment), "r+b") as file:
        file.seek(300)
        file.write(b"\xff" * 8)
    done = store_verify(data_dir)
    assert done.returncode == 1, done.stdout
    lines = done.stdout.splitlines()
    assert f"torn tail of {size} bytes" in lines[0] and "cut at the next start" in lines[0]
    assert any(f"segment {segment}: corrupt bytes" in line for line in lines[1:])
    assert "ok" not in lines
