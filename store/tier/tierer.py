"""The tierer: copies a FileStore's sealed, fully confirmed segments to the tier, oldest first.

One step (``tier_once``) writes a segment's data files (deterministic keys), then its index
file, then commits a new manifest version naming them. A crash or failure anywhere before the
commit leaves objects no manifest names: never read, overwritten by the retry, and deleted by
the orphan sweep once the tiered end has passed them. Only then may local retention delete the
segment (``FileStore.tier_floor`` is the manifest's ``tiered_end``). A newer leader's manifest
(a higher epoch) fences this writer: ``ManifestConflict``, and nothing is deleted. Not thread
safe: one thread runs one tierer.
"""
from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from . import layout
from . import manifest as manifests
from .manifest import Manifest, ManifestConflict, TieredSegment
from ..errors import StoreError
from .convert import Converted, Worker, convert, pause_point
from .objects import ObjectStore

if TYPE_CHECKING:
    from ..commit_log import Segment
    from ..file_store import FileStore

log = logging.getLogger(__name__)

KEPT_MANIFESTS = 16
"""Manifest versions kept; older ones are deleted after each commit."""
_READ_CHUNK = 8 << 20


@dataclass
class TopicTierStatus:
    """What the tier holds of one topic."""

    files: int = 0
    rows: int = 0
    bytes: int = 0


@dataclass
class TierStatus:
    """The tier as the writer sees it; JSON-able (``dataclasses.asdict``)."""

    enabled: bool
    description: str
    tiered_end: int
    segments: int
    files: int
    bytes: int
    topics: dict[str, TopicTierStatus]
    pending_segments: int
    pending_bytes: int
    oldest_pending_age_ms: int | None
    """How long ago the oldest segment waiting to be tiered was last written (sealed)."""
    last_success_ms: int | None
    last_error: str | None
    epoch: int
    fenced: bool
    """A newer leader's manifest was found: this writer tiers no more."""
    uploaded_bytes: int = 0
    """Bytes uploaded since start (data and index files)."""
    errors: int = 0
    """Failed steps since start."""

    @classmethod
    def disabled(cls) -> TierStatus:
        """The status of a store that is not tiered."""
        return cls(enabled=False, description="", tiered_end=0, segments=0, files=0, bytes=0, topics={},
                   pending_segments=0, pending_bytes=0, oldest_pending_age_ms=None, last_success_ms=None,
                   last_error=None, epoch=0, fenced=False)


@dataclass
class _Counters:
    uploaded_bytes: int = 0
    errors: int = 0
    last_success_ms: int | None = None
    last_error: str | None = None
    fenced: bool = False
    loaded: bool = False
    sweep: bool = True
    """Orphans may exist: at start (a crashed step) and after a failed step."""


class Tierer:
    """Tiers the sealed, fully confirmed segments of one FileStore, oldest first.

    With a ``worker`` (a broker), each segment is converted and uploaded in the worker's
    process, so this process's interpreter lock stays free for its event loop; the worker
    then needs every topic's body schema at once (``body_schemas``). Without one, in this
    thread. ``close`` stops the worker."""

    def __init__(self, store: FileStore, objects: ObjectStore, *,
                 body_schema: Callable[[str], str | None] = lambda topic: None,
                 epoch: Callable[[], int] = lambda: 0, worker: Worker | None = None,
                 body_schemas: Callable[[], Mapping[str, str]] = dict) -> None:
        self.store = store
        self.objects = objects
        self.body_schema = body_schema
        self.epoch = epoch
        self.worker = worker
        self.body_schemas = body_schemas
        self.manifest: Manifest | None = None
        """The newest committed manifest (None before the first, or until it could be read)."""
        self._state = _Counters()

    @property
    def tiered_end(self) -> int:
        """Commit-log offset below which every record is in the tier (0 before any)."""
        return self.manifest.tiered_end if self.manifest is not None else 0

    def refresh(self) -> Manifest | None:
        """Reload the newest manifest from the object store."""
        self.manifest = manifests.load_latest(self.objects)
        self._state.loaded = True
        return self.manifest

    def pending(self) -> list[Segment]:
        """Segments waiting to be tiered: sealed (not the active one), durable and, for a
        replicated store, confirmed on every in-sync replica, and not yet in the tier."""
        limit = self.store.durable_offset
        confirmed = self.store.confirm_limit
        if confirmed is not None:
            limit = min(limit, confirmed)
        tiered_end = self.tiered_end
        return [segment for segment in self.store.log.segments()[:-1]
                if tiered_end < segment.end <= limit]

    def tier_once(self) -> TieredSegment | None:
        """Tier the oldest pending segment; None if nothing is pending. Raises
        ObjectStoreError (ManifestConflict when fenced or beaten to the commit), or StoreError
        if the segment cannot be read."""
        try:
            return self._tier_once()
        except StoreError as error:
            self._failed(error)
            raise

    def _tier_once(self) -> TieredSegment | None:
        if not self._state.loaded:
            self.refresh()
        self._check_epoch()
        pending = self.pending()
        if not pending:
            return None
        segment = pending[0]
        start = max(segment.base, self.tiered_end)  # a log cut elsewhere than the tier's: the rest
        files = self._convert(segment, start)
        self._state.uploaded_bytes += files.uploaded_bytes
        pause_point("manifest")
        now = int(time.time() * 1000)
        tiered = TieredSegment(start, segment.end, tuple(f.key for f in files.files), files.index_key, now)
        previous = self.manifest
        self._commit(Manifest(
            1 if previous is None else previous.version + 1, self.epoch(), segment.end,
            (() if previous is None else previous.segments) + (tiered,),
            (() if previous is None else previous.files) + files.files))
        log.info("tiered segment %s (%d records, %d files) to %s", segment.name, files.records,
                 len(files.files), self.objects.description)
        self._sweep_orphans()
        return tiered

    def _convert(self, segment: Segment, start: int) -> Converted:
        """The segment's records from ``start`` as Parquet objects in the tier."""
        if self.worker is None:
            return convert(self.objects, self._read(start, segment.end), start, segment.name, self.body_schema)
        return self.worker.convert(segment.path, segment.base, start, segment.end, self.body_schemas())

    def close(self) -> None:
        """Stop the worker process, if any."""
        if self.worker is not None:
            self.worker.close()

    def _read(self, start: int, end: int) -> bytes:
        """The log's bytes from ``start`` to ``end`` (one segment), a chunk at a time so no
        long read holds the log's lock."""
        chunks = []
        offset = start
        while offset < end:
            try:
                chunk = self.store.log.read(offset, min(_READ_CHUNK, end - offset))[0]
            except FileNotFoundError:
                chunk = b""
            if not chunk:
                raise StoreError(f"commit-log bytes at offset {offset} are gone: retention deleted the "
                                 "segment before it was tiered (set the store's tier_floor); the next "
                                 "segment is tiered next")
            chunks.append(chunk)
            offset += len(chunk)
        return b"".join(chunks)

    def _check_epoch(self) -> None:
        """ManifestConflict if the newest manifest known was written by a newer leader."""
        if self.manifest is not None and self.manifest.epoch > self.epoch():
            self._state.fenced = True
            raise ManifestConflict(f"the tier in {self.objects.description} is written by epoch "
                                   f"{self.manifest.epoch}, newer than this writer's {self.epoch()}: a "
                                   "newer leader tiers now; this one stops")
        self._state.fenced = False

    def _commit(self, manifest: Manifest) -> None:
        """Commit ``manifest``; on a conflict, learn the newest one (and whether it fences us)."""
        try:
            manifests.commit(self.objects, manifest, self.manifest)
        except ManifestConflict:
            # a put whose answer was lost and whose retry found its own object is no conflict
            if self.refresh() != manifest:
                if self.manifest is not None and self.manifest.epoch > manifest.epoch:
                    self._state.fenced = True
                raise
        self.manifest = manifest
        self._state.last_success_ms = int(time.time() * 1000)
        self._state.last_error = None
        self._prune_manifests()

    def _failed(self, error: StoreError) -> None:
        self._state.errors += 1
        self._state.sweep = True
        self._state.last_error = str(error)
        log.warning("tiering to %s failed: %s", self.objects.description, error)

    def _prune_manifests(self) -> None:
        """Delete manifest versions older than the newest KEPT_MANIFESTS."""
        for version in manifests.versions(self.objects)[:-KEPT_MANIFESTS]:
            self.objects.delete(layout.manifest_key(version))

    def _sweep_orphans(self) -> None:
        """Delete data and index objects below the tiered end that the manifest does not name:
        left by a step that failed before its commit, or dropped by tier retention. Lists the
        whole tier, so only after a start or a failure, not after every step."""
        manifest = self.manifest
        if manifest is None or not self._state.sweep:
            return
        named = {f.key for f in manifest.files} | {s.index_key for s in manifest.segments}
        for prefix in (layout.DATA, layout.INDEX):
            for info in self.objects.list(prefix):
                base = layout.segment_of(info.key)
                if info.key not in named and base is not None and base < manifest.tiered_end:
                    log.info("deleting %s from %s: no manifest names it", info.key, self.objects.description)
                    self.objects.delete(info.key)
        self._state.sweep = False

    def apply_tier_retention(self, now_ms: int, retention_ms: Callable[[str], int | None]) -> list[str]:
        """Drop data files whose newest record is older than their topic's tier retention
        (None: kept forever): a new manifest without them first, then their objects (and the
        index files of segments left with no data file). Returns the keys deleted."""
        try:
            return self._apply_tier_retention(now_ms, retention_ms)
        except StoreError as error:
            self._failed(error)
            raise

    def _apply_tier_retention(self, now_ms: int, retention_ms: Callable[[str], int | None]) -> list[str]:
        if not self._state.loaded:
            self.refresh()
        self._check_epoch()
        manifest = self.manifest
        if manifest is None:
            return []
        limits = {topic: retention_ms(topic) for topic in {f.topic for f in manifest.files}}
        dropped = {f.key for f in manifest.files
                   if limits[f.topic] is not None and now_ms - f.store_ts_max > limits[f.topic]}
        if not dropped:
            return []
        segments, gone = [], []
        for segment in manifest.segments:
            kept = tuple(key for key in segment.files if key not in dropped)
            if segment.files and not kept:
                gone.append(segment.index_key)
                continue
            segments.append(segment if len(kept) == len(segment.files) else
                            TieredSegment(segment.base, segment.end, kept, segment.index_key, segment.tiered_at_ms))
        self._commit(Manifest(manifest.version + 1, self.epoch(), manifest.tiered_end, tuple(segments),
                              tuple(f for f in manifest.files if f.key not in dropped)))
        deleted = sorted(dropped) + gone
        for key in deleted:
            self.objects.delete(key)
        log.info("tier retention deleted %d objects from %s", len(deleted), self.objects.description)
        return deleted

    def status(self) -> TierStatus:
        """The tier's state for the admin API and metrics (no object store request)."""
        manifest = self.manifest
        topics: dict[str, TopicTierStatus] = {}
        for tiered in () if manifest is None else manifest.files:
            topic = topics.setdefault(tiered.topic, TopicTierStatus())
            topic.files += 1
            topic.rows += tiered.rows
            topic.bytes += tiered.bytes
        pending = self.pending()
        tiered_end = self.tiered_end
        oldest = None
        if pending:
            try:
                oldest = max(0, int(time.time() * 1000 - os.fstat(pending[0].fd).st_mtime * 1000))
            except OSError:  # deleted meanwhile
                oldest = None
        state = self._state
        return TierStatus(
            enabled=True, description=self.objects.description, tiered_end=tiered_end,
            segments=0 if manifest is None else len(manifest.segments),
            files=sum(t.files for t in topics.values()), bytes=sum(t.bytes for t in topics.values()),
            topics=topics, pending_segments=len(pending),
            pending_bytes=sum(s.end - max(s.base, tiered_end) for s in pending),
            oldest_pending_age_ms=oldest, last_success_ms=state.last_success_ms, last_error=state.last_error,
            epoch=self.epoch(), fenced=state.fenced, uploaded_bytes=state.uploaded_bytes, errors=state.errors)

