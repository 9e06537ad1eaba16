"""The store's contract: one Protocol that ``FileStore`` and ``MemoryStore`` both satisfy."""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Literal, NamedTuple, Protocol

from .record import StoredMessage, Target

FlushPolicy = Literal["sync", "async"]
Preallocation = Literal["lazy", "eager"]
ProgressListener = Callable[[int, int], None]
"""Called with (visible_end, durable_end) commit-log offsets whenever either moves."""
HealthListener = Callable[[str | None], None]
"""Called with why the store cannot write when it turns degraded, and with None once it can."""


@dataclass(frozen=True)
class StoreConfig:
    """Tunables of a store. Sizes in bytes, intervals in milliseconds."""

    segment_size: int = 128 << 20
    """Size of one commit-log segment file; a record must fit in one."""
    queue_entries_per_file: int = 300_000
    """Consume-queue entries per file (fixed when the store is created)."""
    flush: FlushPolicy = "sync"
    """``sync``: a send is acknowledged after fsync; ``async``: fsync every
    ``flush_interval_ms``."""
    flush_interval_ms: int = 200
    """Interval between fsyncs under ``async`` flush."""
    checkpoint_interval_ms: int = 1_000
    """How often queue entries are written out and the checkpoint saved (how fresh a store
    reader's view is)."""
    retention_max_age_ms: int | None = None
    """Delete whole segments older than this; unset: no age limit."""
    retention_max_bytes: int | None = None
    """Delete the oldest segments while the log is larger than this; unset: no size limit."""
    index_slot_count: int = 1_000_003
    """Hash slots of one key-index file."""
    index_max_entries: int = 4_000_000
    """Entries one key-index file holds before the next file starts."""
    max_open_queue_files: int = 256
    """Consume-queue files kept open at once, whatever the number of queues (least recently
    used closed first)."""
    preallocate: Preallocation = "lazy"
    """``lazy``: a new store holds no zero-filled file; the next segment is written ahead once
    the current one is half full (an empty data directory takes a few kilobytes). ``eager``:
    the first segment is written ahead when the store is created and the next one is kept
    ready at all times, so no group commit ever grows a file (servers; two segments of disk,
    256 MiB by default, from the start)."""


class SharedProperties(dict[str, str]):
    """Properties a producer hands over for many messages (an MQTT client's plain publishes to
    one topic), never changed once made: the store encodes them once and keeps the encoding
    by the mapping's identity. Otherwise a plain ``dict``."""

    __slots__ = ()


class Message(NamedTuple):
    """What a producer appends. ``extra_queues`` fans the record out without copying it."""

    topic: str
    body: bytes
    queue_id: int = 0
    tag: str = ""
    keys: Sequence[str] = ()
    properties: Mapping[str, str] | None = None
    """Never changed once appended. A `SharedProperties` handed over for many messages is
    encoded once."""
    msg_id: str = ""
    born_ts: int = 0
    extra_queues: Sequence[tuple[str, int]] = ()


class AppendResult(NamedTuple):
    """Where an appended record landed."""

    topic: str
    queue_id: int
    queue_offset: int
    phys_offset: int
    size: int
    msg_id: str
    store_ts: int
    extra: tuple[Target, ...]

    @property
    def end_offset(self) -> int:
        """Commit-log offset just past this record: wait for ``durable_offset`` to reach it."""
        return self.phys_offset + self.size


class KeyCursor(NamedTuple):
    """A message found by a key or id lookup, as the lookup knows it: pass the last one of a
    page as ``after`` to get the next (``Store.lookup_key_page``)."""

    offset: int
    """The message's commit-log offset."""
    entry: int
    """Where the lookup found it (for a ``FileStore``, its entry number in the key-index file
    holding ``offset``); a cursor whose entry no longer matches is refused."""


class KeyPage(NamedTuple):
    """One page of a key lookup, newest first."""

    messages: list[StoredMessage]
    next: KeyCursor | None
    """Pass as ``after`` for the next page; None when no more messages carry the key."""


@dataclass
class RetentionReport:
    """What one retention pass removed."""

    deleted_segments: list[str] = field(default_factory=list)
    deleted_bytes: int = 0
    log_min_offset: int = 0


@dataclass
class RecoveryReport:
    """What opening the store found and repaired."""

    clean: bool = False
    scanned_bytes: int = 0
    replayed_records: int = 0
    truncated_bytes: int = 0
    corrupt_spans: list[tuple[str, int, int]] = field(default_factory=list)
    """(segment, start offset, end offset) of skipped corrupt bytes."""


class Store(Protocol):
    """A message store: one commit log, consume queues over it, a key index, compacted copies.

    Thread-safe. ``append``/``append_batch`` return once the record is accepted (a batch is
    not atomic: see ``StoreError.appended``); with the
    ``sync`` flush policy the caller acknowledges its producer only after ``durable_offset``
    has reached ``AppendResult.end_offset`` (``wait_durable`` or a progress listener).
    Records become readable in their queues once written to the log.

    When the store cannot write (disk full, out of descriptors, I/O errors) it is *degraded*:
    ``degraded`` says why, appends raise ``StoreDegradedError``, ``wait_durable`` raises it for
    offsets not yet durable, and health listeners are told; it keeps retrying and resumes by
    itself. A record whose producer was told of the failure may still be stored later.
    """

    @property
    def durable_offset(self) -> int: ...

    @property
    def degraded(self) -> str | None:
        """Why the store cannot write right now and what to do about it; None while it can."""

    def add_health_listener(self, listener: HealthListener) -> None: ...

    def append(self, topic: str, body: bytes, *, queue_id: int = 0, tag: str = "",
               keys: Sequence[str] = (), properties: Mapping[str, str] | None = None,
               msg_id: str = "", born_ts: int = 0,
               extra_queues: Sequence[tuple[str, int]] = ()) -> AppendResult: ...

    def append_batch(self, messages: Sequence[Message]) -> list[AppendResult]: ...

    def wait_durable(self, end_offset: int, timeout: float | None = None) -> bool: ...

    def wait_visible(self, end_offset: int, timeout: float | None = None) -> bool: ...

    def add_listener(self, listener: ProgressListener) -> None: ...

    def read(self, topic: str, queue_id: int, queue_offset: int, max_count: int = 32,
             max_bytes: int = 4 << 20) -> list[StoredMessage]: ...

    def cached_only(self) -> AbstractContextManager[None]:
        """A context: within it, on this thread, a read that would wait for object storage
        (tiered history not cached) raises TierFetchNeeded at once; other reads are unaffected."""
        ...

    def queue_range(self, topic: str, queue_id: int) -> tuple[int, int]: ...

    def queues(self) -> list[tuple[str, int]]: ...

    def offset_for_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int: ...

    def read_at(self, phys_offset: int) -> StoredMessage: ...

    def lookup_id(self, msg_id: str, topics: Iterable[str], limit: int = 16) -> list[StoredMessage]:
        """Messages of ``topics`` whose id is ``msg_id``, newest first, at most ``limit`` of
        each topic. Producers choose ids, so one may repeat, in a topic or across topics: no
        topic's messages ever hide another's."""

    def lookup_key(self, topic: str, key: str, limit: int = 32,
                   since_ms: int | None = None) -> list[StoredMessage]:
        """Up to ``limit`` messages of ``topic`` carrying business key ``key``, newest first;
        with ``since_ms``, only those stored then or later."""

    def lookup_key_page(self, topic: str, key: str, limit: int,
                        after: KeyCursor | None = None) -> KeyPage:
        """``lookup_key`` a page at a time: up to ``limit`` messages older than ``after`` (the
        ``next`` of the page before). InvalidCursorError when ``after`` is not one this store
        handed out for this key."""

    def enable_compaction(self, topic: str) -> None: ...

    def compact(self, topic: str) -> int: ...

    def compacted(self, topic: str) -> list[StoredMessage]: ...

    def apply_retention(self, now_ms: int | None = None) -> RetentionReport: ...

    def close(self) -> None: ...
