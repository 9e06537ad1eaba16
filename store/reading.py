"""The read side of a file store: queue reads, offset lookups, message lookups by id and key.

Shared by ``FileStore`` (the writer) and ``StoreReader`` (read-only, no broker running).
Every method may run on any thread; records are validated (CRC32C, offset) as they are read.
"""
from __future__ import annotations

from .commit_log import CommitLog
from .consume_queue import ConsumeQueue, ConsumeQueues, Entry
from .appender import generated_id_offset
from .dispatcher import business_key, id_key
from .errors import CorruptRecordError, OffsetOutOfRangeError
from .key_index import KeyIndex
from .record import HEADER_SIZE, StoredMessage, decode

_MAX_GAP = 64 << 10  # read neighbouring records with one pread when at most this far apart
_MAX_SPAN = 4 << 20


def _span_end(entries: list[Entry], index: int) -> int:
    """End (exclusive) of the run of entries from ``index`` that one pread should cover."""
    start, end, stop = entries[index][0], entries[index][0] + entries[index][1], index + 1
    while stop < len(entries):
        phys, size, _ = entries[stop]
        if not 0 <= phys - end <= _MAX_GAP or phys + size - start > _MAX_SPAN:
            break
        end, stop = phys + size, stop + 1
    return stop


class StoreView:
    """Reads over a commit log, its consume queues and key index."""

    def __init__(self, commit_log: CommitLog, queues: ConsumeQueues, key_index: KeyIndex | None) -> None:
        self.log = commit_log
        self.consume_queues = queues
        self.key_index = key_index

    def queues(self) -> list[tuple[str, int]]:
        """Every (topic, queue id) holding or having held messages."""
        return sorted((queue.topic, queue.queue_id) for queue in self.consume_queues)

    def queue_range(self, topic: str, queue_id: int) -> tuple[int, int]:
        """(earliest, next) queue offset; (0, 0) for a queue never written."""
        queue = self.consume_queues.get(topic, queue_id, create=False)
        return (queue.min_offset, queue.max_offset) if queue else (0, 0)

    def read(self, topic: str, queue_id: int, queue_offset: int, max_count: int = 32,
             max_bytes: int = 4 << 20) -> list[StoredMessage]:
        """Messages of a queue from ``queue_offset`` on; empty at the end of the queue.

        Stops before a corrupt record; raises CorruptRecordError if the first one is corrupt
        (skip it by reading from ``queue_offset + 1``) and OffsetOutOfRangeError below the
        earliest retained offset.
        """
        queue = self.consume_queues.get(topic, queue_id, create=False)
        if queue is None:
            return []
        self._check_range(queue, queue_offset)
        out: list[StoredMessage] = []
        budget = max_bytes
        while len(out) < max_count:
            entries = queue.read(queue_offset + len(out), max_count - len(out))
            if not entries:
                break
            read = self._records(entries, queue_offset + len(out), budget, first=not out)
            out += read
            budget -= sum(message.size for message in read)
            if len(read) < len(entries):
                break
        return out

    def _check_range(self, queue: ConsumeQueue, queue_offset: int) -> None:
        if queue_offset < queue.min_offset or queue_offset > queue.max_offset:
            raise OffsetOutOfRangeError(queue.topic, queue.queue_id, queue_offset,
                                        queue.min_offset, queue.max_offset)

    def _records(self, entries: list[Entry], queue_offset: int, budget: int, first: bool) -> list[StoredMessage]:
        """Decode the records of ``entries``, reading neighbours with one pread per span.

        Errors are raised only for the first record of a read; later ones end the batch early.
        """
        out: list[StoredMessage] = []
        index = 0
        while index < len(entries):
            start, stop = entries[index][0], _span_end(entries, index)
            try:
                data, segment = self.log.read(start, entries[stop - 1][0] + entries[stop - 1][1] - start)
                segment_name = segment.name
            except FileNotFoundError:
                data, segment_name = b"", ""
            for phys, size, _ in entries[index:stop]:
                strict = first and not out
                if not strict and size > budget:
                    return out
                if size and phys > start and phys - start + size > len(data):
                    break  # the span crosses into the next segment: read again from here
                try:
                    if size == 0:
                        raise CorruptRecordError(phys, f"queue offset {queue_offset + index} was lost to corruption")
                    out.append(decode(data, phys - start, phys, segment_name))
                except CorruptRecordError:
                    if strict:
                        raise
                    return out
                budget -= size
                index += 1
        return out

    def read_at(self, phys_offset: int) -> StoredMessage:
        """The record at a commit-log offset (from a message id, key lookup or a queue entry)."""
        try:
            head, segment = self.log.read(phys_offset, HEADER_SIZE)
        except FileNotFoundError:
            raise CorruptRecordError(phys_offset, "no record there (deleted by retention or never written)") from None
        size = int.from_bytes(head[:4], "little")
        data, segment = self.log.read(phys_offset, max(size, HEADER_SIZE))
        return decode(data, 0, phys_offset, segment.name)

    def lookup_id(self, msg_id: str) -> StoredMessage | None:
        """The message with this id, or None; an id a producer chose wins over a generated one."""
        found = self._lookup(id_key(msg_id), 1, lambda message: message.msg_id == msg_id)
        if found:
            return found[0]
        offset = generated_id_offset(msg_id)
        if offset is not None and offset >= self.log.min_offset:
            try:
                message = self.read_at(offset)
            except CorruptRecordError:
                return None
            return message if message.msg_id == msg_id else None
        return None

    def lookup_key(self, topic: str, key: str, limit: int = 32) -> list[StoredMessage]:
        """Messages of ``topic`` carrying business key ``key``, newest first."""
        return self._lookup(business_key(topic, key), limit,
                            lambda message: message.topic == topic and key in message.keys)

    def _lookup(self, key: bytes, limit: int, matches) -> list[StoredMessage]:
        if self.key_index is None:
            return []
        out = []
        for phys in self.key_index.lookup(key, limit=limit * 4):
            if phys < self.log.min_offset:
                continue
            try:
                message = self.read_at(phys)
            except CorruptRecordError:
                continue
            if matches(message):
                out.append(message)
                if len(out) >= limit:
                    break
        return out

    def offset_for_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """First queue offset whose record was stored at or after ``timestamp_ms`` (binary search)."""
        low, high = self.queue_range(topic, queue_id)
        queue = self.consume_queues.get(topic, queue_id, create=False)
        while low < high:
            middle = (low + high) // 2
            entry = queue.read(middle, 1)
            stored = self.read_at(entry[0][0]).store_ts if entry and entry[0][1] else timestamp_ms
            if stored >= timestamp_ms:
                high = middle
            else:
                low = middle + 1
        return low
