"""The tier of a data directory as the Spark source and planner see it.

A data directory whose broker tiers sealed segments names its tier in ``<data>/tier.json``;
the newest manifest there says which Parquet files hold which queue offsets
(``store/tier/manifest.py``, layout in docs/tier-layout.md). Here: which offsets of a queue are
tiered, which files hold a range of them, and reading one file's rows of a range with pyarrow
(executors; columns pruned to those asked for).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from urllib.parse import unquote, urlsplit

import pyarrow as pa
import pyarrow.compute as pc

from store.tier.manifest import Manifest, TieredFile, load_latest
from store.tier.objects import TierLocation, load_location

from .schema import ARROW_SCHEMA

QueueKey = tuple[str, int]


@dataclass(frozen=True)
class Tier:
    """The tier of one data directory at one manifest version."""

    location: TierLocation
    manifest: Manifest

    def spans(self) -> dict[QueueKey, tuple[int, int]]:
        """(topic, queue) -> (first, end) of the queue offsets the tier holds (end exclusive)."""
        spans: dict[QueueKey, tuple[int, int]] = {}
        for file in self.manifest.files:
            for span in file.queues:
                key = (span.topic, span.queue)
                first, end = spans.get(key, (span.first, span.last + 1))
                spans[key] = (min(first, span.first), max(end, span.last + 1))
        return spans

    def files(self, topic: str, queue: int, start: int, end: int) -> list[TieredFile]:
        """The files holding offsets of ``[start, end)`` of a queue, by first offset."""
        chosen = [(span.first, file) for file in self.manifest.files for span in file.queues
                  if span.topic == topic and span.queue == queue and span.first < end and span.last >= start]
        return [file for _, file in sorted(chosen, key=lambda pair: (pair[0], pair[1].key))]

    def body_schema(self, topic: str) -> str | None:
        """The body schema the topic's newest tiered file was written with (None: none)."""
        own = [file for file in self.manifest.files if file.topic == topic]
        return max(own, key=lambda file: file.log_last).body_schema if own else None


def open_tier(path: str) -> Tier | None:
    """The tier named in ``<path>/tier.json`` at its newest manifest; None without either."""
    location = load_location(path)
    if location is None:
        return None
    manifest = load_latest(location.open())
    return Tier(location, manifest) if manifest is not None and manifest.files else None


FILE_COLUMNS = ("queue", "offset", *[name for name in ARROW_SCHEMA.names if name not in ("topic", "queue", "offset")])
"""The source's columns that a data file holds (``topic`` is its partition directory)."""


def read_range(location: TierLocation, key: str, home: str, topic: str, queue: int, start: int,
               end: int, columns: Sequence[str]) -> Iterator[pa.RecordBatch]:
    """The rows of queue offsets ``[start, end)`` of ``queue`` of ``topic`` in the data file
    ``key`` of topic ``home``, as batches of ``columns`` (of ``ARROW_SCHEMA``): the file's own
    rows of that queue when ``home`` is ``topic``, and the rows dispatched (fanned out) to it."""
    import pyarrow.parquet as pq

    table = pq.read_table(_source(location, key), columns=[
        name for name in FILE_COLUMNS if name in columns or name in ("queue", "offset")] + ["dispatch"])
    parts = []
    if home == topic:
        offsets = table.column("offset")
        parts.append(table.filter(pc.and_(pc.equal(table.column("queue"), queue), pc.and_(
            pc.greater_equal(offsets, start), pc.less(offsets, end)))).drop_columns(["dispatch"]))
    dispatched = _dispatched(table, topic, queue, start, end)
    if dispatched is not None:
        parts.append(dispatched)
    rows = pa.concat_tables(parts) if len(parts) > 1 else parts[0] if parts else table.slice(0, 0).drop_columns(["dispatch"])
    if len(parts) > 1:
        rows = rows.sort_by([("offset", "ascending")])
    rows = rows.append_column("topic", pa.repeat(pa.scalar(topic, pa.string()), len(rows)))
    target = pa.schema([ARROW_SCHEMA.field(name) for name in columns])
    yield from rows.select(list(columns)).cast(target).to_batches(max_chunksize=65_536)


def _dispatched(table: pa.Table, topic: str, queue: int, start: int, end: int) -> pa.Table | None:
    """The rows of ``table`` fanned out to ``queue`` of ``topic`` in ``[start, end)``, with that
    queue and offset in place of their home ones; None when none are."""
    targets = table.column("dispatch").combine_chunks()
    if len(targets.flatten()) == 0:
        return None
    flat = targets.flatten()
    owners = pc.list_parent_indices(targets)
    offsets = flat.field("offset")
    match = pc.and_(pc.and_(pc.equal(flat.field("topic"), topic), pc.equal(flat.field("queue"), queue)),
                    pc.and_(pc.greater_equal(offsets, start), pc.less(offsets, end)))
    picked = pc.filter(owners, match)
    if len(picked) == 0:
        return None
    rows = table.take(picked).drop_columns(["dispatch"])
    rows = rows.set_column(rows.schema.get_field_index("queue"), "queue",
                           pa.repeat(pa.scalar(queue, pa.int32()), len(rows)))
    return rows.set_column(rows.schema.get_field_index("offset"), "offset", pc.filter(offsets, match))


DISPATCH_TOPIC = "dispatch.list.element.topic"


def fans_out_to(location: TierLocation, file: TieredFile, topic: str) -> bool:
    """Whether ``file`` may hold records fanned out to ``topic`` (its own topic, say), from its
    footer: no row group whose dispatch topics' statistics can include ``topic`` holds any.
    Remembered: a file named by a manifest never changes."""
    return _fans_out_to(location, file.key, file.bytes, topic)


@lru_cache(maxsize=4096)
def _fans_out_to(location: TierLocation, key: str, size: int, topic: str) -> bool:
    import pyarrow.parquet as pq

    if urlsplit(location.url).scheme == "file":
        meta = pq.read_metadata(_source(location, key))
    else:
        from store.tier.rangefile import RangeFile

        meta = pq.read_metadata(RangeFile(location.open(), key, size))
    column = next((i for i in range(meta.num_columns) if meta.schema.column(i).path == DISPATCH_TOPIC), None)
    if column is None:
        return True
    for group in range(meta.num_row_groups):
        stats = meta.row_group(group).column(column).statistics
        if stats is None or (stats.min <= topic <= stats.max if stats.has_min_max else stats.num_values):
            return True
    return False


def _source(location: TierLocation, key: str):
    """What pyarrow opens for ``key``: the local path of a ``file://`` tier, else its bytes."""
    parts = urlsplit(location.url)
    if parts.scheme == "file":
        return unquote(parts.path).rstrip("/") + "/" + key
    return pa.BufferReader(location.open().get(key))
