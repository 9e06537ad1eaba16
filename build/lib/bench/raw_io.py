"""Raw limits of the machine's disk, measured with plain ``os.write`` and fsync in Python."""
from __future__ import annotations

import os
import time
from pathlib import Path

from .report import Sample

MIB = 1 << 20


def _open_fresh(path: Path) -> int:
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)


def sequential_write(path: Path, total_bytes: int, seconds: float) -> Sample:
    """``os.write`` 1 MiB buffers until ``total_bytes`` or ``seconds``, then one fsync (timed)."""
    buffer = os.urandom(MIB)
    fd = _open_fresh(path)
    try:
        written = 0
        start = time.perf_counter()
        deadline = start + seconds
        while written < total_bytes and time.perf_counter() < deadline:
            written += os.write(fd, buffer)
        os.fsync(fd)
        elapsed = time.perf_counter() - start
    finally:
        os.close(fd)
        path.unlink()
    return Sample(written // MIB, written, written, elapsed)


def fsync_per_record(path: Path, record_size: int, seconds: float, max_count: int) -> Sample:
    """``os.write`` one record then ``os.fdatasync``, in a loop; the rate is appends/s."""
    buffer = os.urandom(record_size)
    fd = _open_fresh(path)
    try:
        count = 0
        start = time.perf_counter()
        deadline = start + seconds
        while count < max_count and time.perf_counter() < deadline:
            os.write(fd, buffer)
            os.fdatasync(fd)
            count += 1
        elapsed = time.perf_counter() - start
    finally:
        os.close(fd)
        path.unlink()
    return Sample(count, count * record_size, count * record_size, elapsed)
