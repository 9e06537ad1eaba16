"""The manifest: which objects make up the tier, as one JSON document per version.

``manifest/<version, 20 digits>.json`` is only ever created with ``put_if_absent``, versions
counting up from 1; the newest readable one is the truth. A writer that finds its version taken,
or a newer leader's epoch in the newest manifest, has lost: ``ManifestConflict``. Objects that
no manifest names are never read. ``from_json`` checks every field, since anyone able to write
to the bucket can write a manifest.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from . import layout
from .objects import ObjectNotFound, ObjectStore, ObjectStoreError

log = logging.getLogger(__name__)

FORMAT = 1


class ManifestConflict(ObjectStoreError):
    """Another writer (a newer leader) committed first: stop tiering."""


@dataclass(frozen=True)
class QueueSpan:
    """Inclusive queue offsets of one queue present in a file (home queues and dispatch targets)."""

    topic: str
    queue: int
    first: int
    last: int


@dataclass(frozen=True)
class TieredFile:
    """One data file: a home topic's records of one UTC day of one segment."""

    key: str
    topic: str
    segment: int
    day: str
    rows: int
    bytes: int
    log_first: int
    """Commit-log offset of the file's first record."""
    log_last: int
    """Commit-log offset of the file's last record."""
    store_ts_min: int
    """ms since the epoch."""
    store_ts_max: int
    queues: tuple[QueueSpan, ...]
    body_schema: str | None
    """The schema text the ``data`` column was built with; None: no ``data`` column."""


@dataclass(frozen=True)
class TieredSegment:
    """One tiered commit-log segment: its data files and key-index file."""

    base: int
    end: int
    files: tuple[str, ...]
    index_key: str
    tiered_at_ms: int


@dataclass(frozen=True)
class Manifest:
    """One version of the tier's contents."""

    version: int
    epoch: int
    """The leader epoch of the writer (0 for a store of its own)."""
    tiered_end: int
    """Commit-log offset: every record below it is tiered (or past tier retention)."""
    segments: tuple[TieredSegment, ...]
    files: tuple[TieredFile, ...]

    def to_json(self) -> bytes:
        """The manifest as JSON (UTF-8)."""
        document = {"format": FORMAT, "version": self.version, "epoch": self.epoch,
                    "tiered_end": self.tiered_end, "segments": [vars(s) for s in self.segments],
                    "files": [{**vars(f), "queues": [vars(q) for q in f.queues]} for f in self.files]}
        # json.dumps writes the segments' tuples of keys as arrays; no dataclasses.asdict: its
        # recursive copy made this the tierer's costliest step (it runs with the GIL held)
        return json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode()

    @classmethod
    def from_json(cls, data: bytes) -> Manifest:
        """Parse and check a manifest; ValueError saying what is wrong if it is not one."""
        try:
            document = json.loads(data)
        except (ValueError, RecursionError) as error:  # UnicodeDecodeError is a ValueError
            raise ValueError(f"manifest is not JSON: {str(error)[:200]}") from None
        fields = _Fields(document, "manifest")
        if fields.integer("format") != FORMAT:
            raise ValueError(f"manifest format {document['format']} is not {FORMAT}: written by a newer "
                             "Sluice; upgrade this one")
        segments = tuple(_segment(_Fields(item, f"manifest segment {n}"))
                         for n, item in enumerate(fields.array("segments")))
        files = tuple(_file(_Fields(item, f"manifest file {n}")) for n, item in enumerate(fields.array("files")))
        version = fields.integer("version")
        if version < 1:
            raise ValueError(f"manifest version {version} is not positive")
        return cls(version, fields.integer("epoch"), fields.integer("tiered_end"), segments, files)


def _segment(fields: _Fields) -> TieredSegment:
    return TieredSegment(fields.integer("base"), fields.integer("end"),
                         tuple(fields.string(None, item) for item in fields.array("files")),
                         fields.string("index_key"), fields.integer("tiered_at_ms"))


def _file(fields: _Fields) -> TieredFile:
    schema = fields.get("body_schema")
    return TieredFile(
        fields.string("key"), fields.string("topic"), fields.integer("segment"), fields.string("day"),
        fields.integer("rows"), fields.integer("bytes"), fields.integer("log_first"), fields.integer("log_last"),
        fields.integer("store_ts_min", signed=True), fields.integer("store_ts_max", signed=True),
        tuple(_span(_Fields(item, f"{fields.what} queue {n}")) for n, item in enumerate(fields.array("queues"))),
        None if schema is None else fields.string("body_schema"))


def _span(fields: _Fields) -> QueueSpan:
    return QueueSpan(fields.string("topic"), fields.integer("queue"), fields.integer("first"), fields.integer("last"))


class _Fields:
    """Typed access to one JSON object of a manifest, each failure a ValueError naming the field."""

    def __init__(self, document: Any, what: str) -> None:
        if not isinstance(document, dict):
            raise ValueError(f"{what} is not a JSON object")
        self.document, self.what = document, what

    def get(self, name: str) -> Any:
        if name not in self.document:
            raise ValueError(f"{self.what} has no {name!r}")
        return self.document[name]

    def integer(self, name: str, signed: bool = False) -> int:
        value = self.get(name)
        if isinstance(value, bool) or not isinstance(value, int) or not (signed or value >= 0) \
                or not -(1 << 63) <= value < (1 << 63):
            raise ValueError(f"{self.what}: {name!r} is not a{'n' if signed else ' non-negative'} 64-bit integer")
        return value

    def string(self, name: str | None, value: Any = None) -> str:
        value = self.get(name) if name is not None else value
        if not isinstance(value, str):
            raise ValueError(f"{self.what}: {name or 'an item'!r} is not a string")
        return value

    def array(self, name: str) -> list[Any]:
        value = self.get(name)
        if not isinstance(value, list):
            raise ValueError(f"{self.what}: {name!r} is not an array")
        return value


def versions(objects: ObjectStore) -> list[int]:
    """Every manifest version in the store, oldest first."""
    found = (layout.manifest_version(info.key) for info in objects.list(layout.MANIFEST))
    return sorted(version for version in found if version is not None)


def load_latest(objects: ObjectStore) -> Manifest | None:
    """The newest readable manifest; None if there is none. A damaged one is skipped (logged)."""
    for version in reversed(versions(objects)):
        key = layout.manifest_key(version)
        try:
            manifest = Manifest.from_json(objects.get(key))
        except ObjectNotFound:
            continue  # pruned meanwhile
        except ValueError as error:
            log.error("tier manifest %s in %s is damaged and skipped: %s", key, objects.description, error)
            continue
        if manifest.version != version:
            log.error("tier manifest %s in %s claims version %d and is skipped", key, objects.description,
                      manifest.version)
            continue
        return manifest
    return None


def commit(objects: ObjectStore, manifest: Manifest, previous: Manifest | None = None) -> None:
    """Create ``manifest``'s version. ManifestConflict if the version is taken or the newest
    manifest carries a newer epoch (a newer leader): then nothing is written. ``previous``, the
    manifest ``manifest`` follows, spares reading the newest one back when it is still the
    newest (a version, once created, never changes)."""
    found = versions(objects)
    if previous is not None and found and found[-1] == previous.version:
        latest: Manifest | None = previous
    else:
        latest = load_latest(objects)
    if latest is not None and latest.epoch > manifest.epoch:
        raise ManifestConflict(f"tier manifest version {latest.version} in {objects.description} was written "
                               f"by epoch {latest.epoch}, newer than this writer's {manifest.epoch}: a newer "
                               "leader tiers now; this one stops")
    if latest is not None and latest.version >= manifest.version:
        raise ManifestConflict(f"tier manifest version {latest.version} in {objects.description} exists "
                               f"already; version {manifest.version} comes too late: another writer "
                               "committed first")
    if not objects.put_if_absent(layout.manifest_key(manifest.version), manifest.to_json()):
        raise ManifestConflict(f"tier manifest version {manifest.version} in {objects.description} was "
                               "created by another writer first")
