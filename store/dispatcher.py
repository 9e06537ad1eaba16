"""The one dispatcher: turns commit-log records into consume-queue entries and key-index entries.

It runs on the flusher thread right after appended bytes reach the log (``dispatch``), and
during recovery over records replayed from the log (``replay``). Both paths feed the same
``DispatchRequest`` tuples, and both are idempotent: a queue skips entries it already has, the
key index skips offsets it already indexed (RocketMQ's ``ConsumeQueue.putMessagePositionInfo``
does the same).

A failing disk stops a dispatch (the flusher retries the batch) but not a replay: a store must
open and serve reads on a full disk. Replayed queue entries that cannot be written stay in
memory, readable, until a checkpoint writes them; keys that cannot be indexed wait, in order, in
``deferred_keys`` until ``index_deferred`` adds them, before anything newer is indexed.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Sequence

from . import record
from .consume_queue import ConsumeQueue, ConsumeQueues
from .key_index import KeyIndex

DispatchRequest = tuple[int, int, int, int, tuple[record.Target, ...], tuple[bytes, ...]]
"""(phys_offset, size, tag_hash, store_ts, queue targets, key-index keys)"""


def id_key(topic: str, msg_id: str) -> bytes:
    """Key-index key of a message id, scoped to its topic: producers choose ids, so another
    topic may hold the same one."""
    return b"\x01" + topic.encode() + b"\x00" + msg_id.encode()


def business_key(topic: str, key: str) -> bytes:
    """Key-index key of a business key, scoped to its topic."""
    return b"\x02" + topic.encode() + b"\x00" + key.encode()


def tag_hash(tag: bytes) -> int:
    """Consume-queue tag hash: CRC32C of the tag, 0 for no tag."""
    return record.crc(tag) if tag else 0


def request_for(message: record.StoredMessage) -> DispatchRequest:
    """The dispatch request of a record read back from the log (recovery); as at append time,
    an id the store generated from the offset is not indexed."""
    targets = ((message.topic, message.queue_id, message.queue_offset), *message.dispatch)
    keys = tuple(business_key(message.topic, key) for key in message.keys)
    if message.msg_id != f"{message.phys_offset:016X}":
        keys = (id_key(message.topic, message.msg_id), *keys)
    return (message.phys_offset, message.size, tag_hash(message.tag.encode()), message.store_ts,
            targets, keys)


class Dispatcher:
    """Builds consume queues and the key index. Runs on the flusher thread (or at recovery)."""

    def __init__(self, queues: ConsumeQueues, key_index: KeyIndex) -> None:
        self.queues = queues
        self.key_index = key_index
        self.dispatched_end = 0
        self.deferred_keys: deque[tuple[Sequence[bytes], int, int]] = deque()
        """(keys, phys_offset, store_ts) that ``replay`` could not index, oldest first."""
        self.deferred_error: OSError | None = None
        """The first write ``replay`` had to put off, None if it put off none."""

    @property
    def derived_end(self) -> int:
        """Offset up to which queues and key index hold every record (before a checkpoint
        writes the entries buffered in memory): what a checkpoint may record, so that recovery
        after a crash replays what is missing."""
        return self.deferred_keys[0][1] if self.deferred_keys else self.dispatched_end

    def dispatch(self, requests: Iterable[DispatchRequest]) -> None:
        """Index every request, then write the queues that gathered enough entries."""
        touched, end = self._put(requests, self.key_index.add_many, make_dirs=True)
        self.queues.write_pending(batch=touched)
        self.dispatched_end = max(self.dispatched_end, end)

    def replay(self, requests: Iterable[DispatchRequest]) -> None:
        """``dispatch`` for recovery: writes the disk refuses are put off, never raised."""
        touched, end = self._put(requests, self._index_or_defer, make_dirs=False)
        try:
            self.queues.write_pending(batch=touched)
        except OSError as error:  # the entries stay buffered: a checkpoint writes them
            self._defer(error)
        self.dispatched_end = max(self.dispatched_end, end)

    def index_deferred(self) -> None:
        """Index the keys ``replay`` put off, oldest first; raises OSError while the disk still
        refuses (what went in stays in). Runs on the flusher thread, before any new dispatch."""
        while self.deferred_keys:
            self.key_index.add_many(*self.deferred_keys[0])
            self.deferred_keys.popleft()

    def _put(self, requests: Iterable[DispatchRequest],
             index: Callable[[Sequence[bytes], int, int], None],
             make_dirs: bool) -> tuple[Iterable[ConsumeQueue], int]:
        """Buffer every request's queue entries and index its keys; return the queues touched
        and the end of the last record."""
        queues = self.queues
        touched: dict[tuple[str, int], ConsumeQueue] = {}
        end = self.dispatched_end
        for phys, size, tag, store_ts, targets, keys in requests:
            for topic, queue_id, queue_offset in targets:
                queue = touched.get((topic, queue_id)) or queues.touch(topic, queue_id, touched,
                                                                       make_dirs)
                queue.put(queue_offset, phys, size, tag)
            if keys:
                index(keys, phys, store_ts)
            end = phys + size
        return touched.values(), end

    def _index_or_defer(self, keys: Sequence[bytes], phys_offset: int, store_ts: int) -> None:
        if not self.deferred_keys:
            try:
                self.key_index.add_many(keys, phys_offset, store_ts)
                return
            except OSError as error:
                self._defer(error)
        self.deferred_keys.append((keys, phys_offset, store_ts))

    def _defer(self, error: OSError) -> None:
        if self.deferred_error is None:
            self.deferred_error = error
