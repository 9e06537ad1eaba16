"""One tiering step's heavy half: a sealed segment's bytes to Parquet (``writer.py``) and its
data and index objects uploaded, in this process or in a worker process.

Converting a segment decodes every record, parses bodies and compresses Parquet: CPU work
that, in a broker's process, holds the interpreter lock its event loop needs. ``Worker`` runs
it in one separate process instead (spawned on first use), given only picklable inputs (the
segment file's path and range, the body schemas, where the tier is) and returning what the
manifest needs; the caller keeps the manifest commit, fencing and status. The worker exits
when its parent process dies, so a broker killed mid-step leaves no worker behind.
"""
from __future__ import annotations

import logging
import multiprocessing
import os
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass

from ..errors import StoreError
from . import layout
from .manifest import TieredFile
from .objects import ObjectStore, TierLocation
from .writer import write_segment

log = logging.getLogger(__name__)

PAUSE_AT_ENV = "SLUICE_TIER_PAUSE_AT"
PAUSE_FILE_ENV = "SLUICE_TIER_PAUSE_FILE"
_PARENT_CHECK_S = 0.5


@dataclass(frozen=True)
class Converted:
    """What one converted and uploaded segment adds to the manifest."""

    files: tuple[TieredFile, ...]
    index_key: str
    uploaded_bytes: int
    records: int


def convert(objects: ObjectStore, data: bytes, start: int, name: str,
            body_schema: Callable[[str], str | None]) -> Converted:
    """Write the Parquet files of the segment bytes ``data`` (from log offset ``start``) to
    ``objects``: data files first (the ``upload`` pause point after the first), then the index."""
    files = write_segment(data, start, name, body_schema)
    uploaded = 0
    for number, data_file in enumerate(files.files):
        objects.put(data_file.info.key, data_file.parquet)
        uploaded += len(data_file.parquet)
        if number == 0:
            pause_point("upload")
    index_key = layout.index_key(start)
    objects.put(index_key, files.index)
    uploaded += len(files.index)
    return Converted(tuple(f.info for f in files.files), index_key, uploaded, files.records)


@dataclass(frozen=True)
class Job:
    """A segment for the worker to convert: picklable."""

    path: str
    base: int
    """The segment file's first log offset."""
    start: int
    end: int
    schemas: Mapping[str, str]
    """Body schema text by topic (topics without one left out)."""
    location: TierLocation
    access_key: str
    secret_key: str


class Worker:
    """Converts segments in one worker process, started on first use; ``close`` stops it."""

    def __init__(self, location: TierLocation, access_key: str = "", secret_key: str = "") -> None:
        self.location = location
        self._keys = (access_key, secret_key)
        self._pool: ProcessPoolExecutor | None = None

    def convert(self, path: str, base: int, start: int, end: int, schemas: Mapping[str, str]) -> Converted:
        """Convert and upload the segment file ``path``'s records from ``start`` to ``end``;
        blocks until done and raises what the worker raised (StoreError and subclasses)."""
        if self._pool is None:
            self._pool = ProcessPoolExecutor(1, multiprocessing.get_context("spawn"), _watch_parent,
                                             (os.getpid(),))
        try:
            return self._pool.submit(_run, Job(path, base, start, end, dict(schemas), self.location,
                                               *self._keys)).result()
        except BrokenProcessPool as error:
            self.close()  # the next step starts a new one
            raise StoreError(f"the tiering worker process died ({error}); the step is retried "
                             "in a new one") from None

    def close(self) -> None:
        """Stop the worker process (after the job it runs, if any)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


_opened: dict[TierLocation, ObjectStore] = {}


def _run(job: Job) -> Converted:
    """In the worker: read the segment's bytes from its file, convert and upload them."""
    objects = _opened.get(job.location)
    if objects is None:
        objects = _opened[job.location] = job.location.open(job.access_key, job.secret_key)
    try:
        with open(job.path, "rb") as file:
            data = os.pread(file.fileno(), job.end - job.start, job.start - job.base)
    except OSError as error:
        raise StoreError(f"cannot read commit-log segment {job.path} ({error}): retention deleted "
                         "it before it was tiered (set the store's tier_floor)?") from None
    if len(data) != job.end - job.start:
        raise StoreError(f"commit-log segment {job.path} holds fewer bytes than it did when sealed "
                         f"({len(data)} of {job.end - job.start} from offset {job.start})")
    return convert(objects, data, job.start, os.path.basename(job.path), job.schemas.get)


def _watch_parent(parent: int) -> None:
    """In the worker, at start: exit as soon as the parent process is gone (killed, say), so no
    worker outlives its broker."""
    def watch() -> None:
        while os.getppid() == parent:
            threading.Event().wait(_PARENT_CHECK_S)
        os._exit(1)
    threading.Thread(target=watch, name="tier-parent-watch", daemon=True).start()


def pause_point(name: str) -> None:
    """For kill tests: at the point ``SLUICE_TIER_PAUSE_AT`` names, create the file
    ``SLUICE_TIER_PAUSE_FILE`` and block forever (the test then kills the process)."""
    if os.environ.get(PAUSE_AT_ENV) != name:
        return
    with open(os.environ[PAUSE_FILE_ENV], "w") as file:
        file.write(name)
    log.warning("tiering paused at %s (%s is set)", name, PAUSE_AT_ENV)
    threading.Event().wait()
