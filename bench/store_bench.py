"""The store benchmark: Sluice's FileStore next to the raw limits of the same disk.

Measured in one run, on the filesystem of the benchmark's data directory:

- raw limits: sequential 1 MiB writes with one fsync; write + fdatasync per record;
- ``async`` flush: one writer appending (single records and batches of 64);
- ``sync`` flush with group commit: 1 and 64 writers, each waiting for durability before its
  next append: uvloop tasks appending one by one, uvloop tasks whose appends are batched per
  loop iteration (as the broker core does), and OS threads;
- catch-up read of one queue after a close and reopen.

Each Sluice-vs-raw group runs ``repeats`` times, alternating raw and Sluice runs, and the
table shows medians, since a shared machine is noisy.
"""
from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from store import FileStore
from store.api import FlushPolicy

from . import raw_io
from . import store_workloads as work
from .report import Report, Sample, Target

Log = Callable[[str], None]

SMALL, KIB, PAGE = 100, 1024, 4096
WRITERS = 64
BATCH = 64
ASYNC_TARGET = 0.5  # async 1 KiB log MB/s over raw sequential MB/s
SYNC_TARGET = 20.0  # 64 durable writers over raw fsync-per-record
READ_TARGET = 300_000  # catch-up records/s


@dataclass(frozen=True)
class Settings:
    """How long and how much each measurement runs."""

    records: int = 1_000_000
    """Records written for, and read back by, the catch-up read."""
    seconds: float = 3.0
    """Time bound of one timed run."""
    repeats: int = 3
    sequential_bytes: int = 1 << 30
    max_appends: int = 10_000_000
    """Count bound of one timed run (the time bound usually comes first)."""
    quick: bool = False

    @classmethod
    def smoke(cls, records: int | None = None) -> Settings:
        """A smoke run of a few seconds."""
        return cls(records=records or 20_000, seconds=0.25, repeats=1,
                   sequential_bytes=32 << 20, max_appends=20_000, quick=True)


def size_label(size: int) -> str:
    """100 -> '100 B', 1024 -> '1 KiB'."""
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale and size % scale == 0:
            return f"{size // scale} {unit}"
    return f"{size} B"


class StoreBench:
    """One run of the store benchmark in ``workdir``."""

    def __init__(self, settings: Settings, workdir: Path, log: Log) -> None:
        self.settings = settings
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.log = log
        self.started = time.perf_counter()
        self.report = Report(_title(settings, workdir))
        self._declare_rows()

    # -- table layout ---------------------------------------------------------------------

    def _declare_rows(self) -> None:
        declare = self.report.declare
        declare("raw-seq", "raw sequential write (1 MiB os.write, 1 fsync)", "1 MiB")
        for size in (SMALL, KIB, PAGE):
            declare(f"raw-fsync-{size}", "raw os.write + fdatasync per record", size_label(size))
        declare("async-100", "sluice async: append, 1 writer", size_label(SMALL))
        declare("async-1024", "sluice async: append, 1 writer", size_label(KIB))
        declare("async-batch-1024", f"sluice async: append_batch({BATCH}), 1 writer", size_label(KIB))
        for size in (SMALL, KIB):
            label = size_label(size)
            declare(f"sync-1-{size}", "sluice sync: 1 writer (uvloop)", label)
            declare(f"sync-tasks-{size}", f"sluice sync: {WRITERS} uvloop tasks, append each", label)
            declare(f"sync-batched-{size}", f"sluice sync: {WRITERS} uvloop tasks, batched per tick", label)
            declare(f"sync-threads-{size}", f"sluice sync: {WRITERS} threads, wait_durable", label)
        declare("fill", f"catch-up fill: async append_batch({BATCH}), 1 queue", size_label(SMALL))
        declare("read", f"catch-up read: read(max_count={work.READ_MAX_COUNT}), 1 queue", size_label(SMALL))

    # -- running ----------------------------------------------------------------------------

    def run(self) -> Report:
        """Every group of measurements, then the targets."""
        self._async_group()
        for size in (SMALL, KIB):
            self._sync_group(size)
        self._raw_fsync_group(PAGE)
        self._catch_up_group()
        self.report.targets = self._targets()
        if self.settings.quick:
            self.report.notes.append("--quick is a smoke run: its counts are too small for the figures "
                                     "or PASS/MISS to mean anything")
        return self.report

    def _measure(self, key: str, run: int, action: Callable[[], Sample], runs: int | None = None) -> Sample:
        """Run one timed measurement, record it and print a progress line."""
        sample = action()
        self.report.add(key, sample)
        row = self.report.rows[key]
        elapsed = time.perf_counter() - self.started
        self.log(f"[store {elapsed:6.1f}s] run {run + 1}/{runs or self.settings.repeats}  {row.name} "
                 f"[{row.size}]: {sample.records_per_s:,.0f} records/s, "
                 f"{sample.log_mb_per_s:,.1f} MB/s ({sample.records:,} in {sample.seconds:.2f}s"
                 + (f", {sample.records_per_commit} records/fsync)" if sample.group_commits else ")"))
        return sample

    def _path(self, name: str, run: int) -> Path:
        return self.workdir / f"{name}-{run}"

    def _async_group(self) -> None:
        """Raw sequential writes alternating with async-flush appends."""
        s = self.settings
        small, kib = work.make_body(SMALL), work.make_body(KIB)
        for run in range(s.repeats):
            self._measure("raw-seq", run, lambda: raw_io.sequential_write(
                self._path("raw-seq", run), s.sequential_bytes, s.seconds))
            for key, action in (
                    ("async-100", lambda store: work.async_appends(store, small, s.seconds, s.max_appends)),
                    ("async-1024", lambda store: work.async_appends(store, kib, s.seconds, s.max_appends)),
                    ("async-batch-1024", lambda store: work.async_batches(
                        store, kib, BATCH, s.seconds, s.max_appends))):
                self._measure_store(key, run, "async", action)

    def _sync_group(self, size: int) -> None:
        """Raw fsync-per-record alternating with sync-flush durable writers."""
        s, body = self.settings, work.make_body(size)
        for run in range(s.repeats):
            self._raw_fsync(size, run)
            for key, action in (
                    (f"sync-1-{size}", lambda store: work.sync_tasks(store, body, 1, s.seconds, s.max_appends)),
                    (f"sync-tasks-{size}", lambda store: work.sync_tasks(
                        store, body, WRITERS, s.seconds, s.max_appends)),
                    (f"sync-batched-{size}", lambda store: work.sync_tasks(
                        store, body, WRITERS, s.seconds, s.max_appends, batched=True)),
                    (f"sync-threads-{size}", lambda store: work.sync_threads(
                        store, body, WRITERS, s.seconds, s.max_appends))):
                self._measure_store(key, run, "sync", action)

    def _raw_fsync_group(self, size: int) -> None:
        for run in range(self.settings.repeats):
            self._raw_fsync(size, run)

    def _raw_fsync(self, size: int, run: int) -> None:
        key, s = f"raw-fsync-{size}", self.settings
        self._measure(key, run, lambda: raw_io.fsync_per_record(self._path(key, run), size, s.seconds,
                                                                s.max_appends))

    def _measure_store(self, key: str, run: int, flush: FlushPolicy,
                       action: Callable[[FileStore], Sample]) -> None:
        """Time ``action`` on a fresh store (opening and closing it are not timed)."""
        def timed() -> Sample:
            with work.fresh_store(self._path(key, run), flush) as store:
                return action(store)
        self._measure(key, run, timed)

    def _catch_up_group(self) -> None:
        """Fill one queue, then close, reopen and read it all, ``repeats`` times."""
        directory, count = self.workdir / "catch-up", self.settings.records
        with work.fresh_store(directory, "async") as writer:
            self._measure("fill", 0, lambda: work.fill_queue(writer, work.make_body(SMALL), count), runs=1)
            start = time.perf_counter()
            writer.close()
            close_seconds = time.perf_counter() - start
            opens = [self._read_back(directory, count, run) for run in range(self.settings.repeats)]
        self.report.notes.append(
            f"catch-up: closing the filled store took {close_seconds:.2f}s; reopening it took "
            f"{sorted(opens)[(len(opens) - 1) // 2]:.2f}s (median); reads are page-cache warm")

    def _read_back(self, directory: Path, count: int, run: int) -> float:
        """Reopen the store, read the queue back, close; return the reopen time."""
        store, open_seconds = work.open_store(directory)
        try:
            self._measure("read", run, lambda: work.catch_up_read(store, count))
        finally:
            store.close()
        return open_seconds

    # -- targets ----------------------------------------------------------------------------

    def _targets(self) -> list[Target]:
        median = self.report.median
        targets: list[Target] = []
        raw_seq = median("raw-seq")
        for key, name in (("async-1024", "async append 1 KiB"),
                          ("async-batch-1024", f"async append_batch({BATCH}) 1 KiB")):
            sample = median(key)
            if raw_seq and sample:
                share = sample.log_mb_per_s / raw_seq.log_mb_per_s
                targets.append(Target(f"{name}: log MB/s vs raw sequential",
                                      f"{sample.log_mb_per_s:,.1f}/{raw_seq.log_mb_per_s:,.1f} = {share:.0%}",
                                      f">= {ASYNC_TARGET:.0%}", share >= ASYNC_TARGET))
        for size in (SMALL, KIB):
            raw = median(f"raw-fsync-{size}")
            for kind in ("batched", "tasks", "threads"):
                sample = median(f"sync-{kind}-{size}")
                if raw and sample:
                    ratio = sample.records_per_s / raw.records_per_s
                    targets.append(Target(
                        f"sync {WRITERS} {kind} {size_label(size)} / raw fsync-per-record",
                        f"{sample.records_per_s:,.0f}/{raw.records_per_s:,.0f} = {ratio:.1f}x",
                        f">= {SYNC_TARGET:.0f}x", ratio >= SYNC_TARGET))
        read = median("read")
        if read:
            targets.append(Target("catch-up read 100 B records/s", f"{read.records_per_s:,.0f}",
                                  f">= {READ_TARGET:,}", read.records_per_s >= READ_TARGET))
        return targets


def _title(settings: Settings, workdir: Path) -> str:
    return "\n".join([
        f"store benchmark: data dir {workdir} ({_filesystem(workdir)}), {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}",
        f"{settings.repeats} run(s) per measurement, each bounded to {settings.seconds:g}s or a count; "
        "figures are medians; MB = 10^6 bytes",
        "log MB/s: record bytes appended to the commit log (sum of AppendResult.size); "
        "payload MB/s: bodies only",
    ])


def _filesystem(path: Path) -> str:
    """File-system type holding ``path`` (from /proc/mounts), or '?'."""
    try:
        with open("/proc/mounts") as mounts:
            entries = [line.split() for line in mounts]
    except OSError:
        return "?"
    resolved, best = str(path.resolve()), ("", "?")
    for entry in entries:
        mount_point, fs_type = entry[1], entry[2]
        if (resolved == mount_point or resolved.startswith(mount_point.rstrip("/") + "/")) \
                and len(mount_point) > len(best[0]):
            best = (mount_point, fs_type)
    return best[1]


def run_section(settings: Settings, workdir: Path, log: Log) -> Report:
    """Run the store benchmark in ``workdir`` and return its report."""
    return StoreBench(settings, workdir, log).run()
