"""The checked file-operations layer: short writes continue, errors name the file, and no store
write bypasses it."""
from __future__ import annotations

import errno
import os
import re
from pathlib import Path

import pytest

from store import fileops
from store.faults import Fault

STORE = Path(__file__).resolve().parents[3] / "store"


@pytest.mark.parametrize("call", ["pwrite", "pwritev", "write"])
def test_short_writes_continue_until_every_byte_is_written(tmp_path, faults, call):
    faults.add(Fault("test", "write"))  # every call writes half of what it is given
    path = str(tmp_path / "file")
    data = os.urandom(100_000)
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    try:
        if call == "pwrite":
            fileops.pwrite(fd, data, 10, site="test", path=path)
        elif call == "pwritev":
            views = [memoryview(data)[i:i + 333] for i in range(0, len(data), 333)]
            fileops.pwritev(fd, views, 10, site="test", path=path)
        else:
            os.lseek(fd, 10, os.SEEK_SET)
            fileops.write(fd, data, site="test", path=path)
    finally:
        os.close(fd)
    assert faults.faults[0].calls > 10, "the writes were not short"
    assert Path(path).read_bytes() == bytes(10) + data


def test_a_filling_disk_writes_what_fits_then_fails_naming_the_file(tmp_path, faults):
    faults.add(Fault("test", "write", errno.ENOSPC, after_bytes=1000))
    path = str(tmp_path / "file")
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    try:
        with pytest.raises(OSError) as error:
            fileops.pwrite(fd, b"x" * 4096, 0, site="test", path=path)
    finally:
        os.close(fd)
    assert error.value.errno == errno.ENOSPC and error.value.filename == path
    assert os.path.getsize(path) == 1000


def test_a_write_that_makes_no_progress_raises(tmp_path):
    class Stuck(fileops.FileOps):
        def admit(self, site, op, path, size=0):
            return 0

    previous = fileops.install(Stuck())
    path = str(tmp_path / "file")
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    try:
        with pytest.raises(OSError) as error:
            fileops.pwrite(fd, b"data", 0, site="test", path=path)
    finally:
        os.close(fd)
        fileops.install(previous)
    assert error.value.errno == errno.EIO and "no progress" in str(error.value)


def test_no_store_write_bypasses_the_layer():
    """Every write, sync, truncate, rename, unlink, allocation and directory creation in store/
    goes through store/fileops.py, so fault injection reaches it and short writes are handled."""
    bare = re.compile(r"\bos\.(pwrite|pwritev|write|fsync|fdatasync|ftruncate|rename|replace|unlink|"
                      r"remove|posix_fallocate|makedirs|mkdir)\(|\.mm\.flush\(|\bos\.open\(")
    offenders = [f"{path.name}:{number}: {line.strip()}"
                 for path in sorted(STORE.glob("*.py")) if path.name not in ("fileops.py",)
                 for number, line in enumerate(path.read_text().splitlines(), 1) if bare.search(line)]
    assert offenders == []
