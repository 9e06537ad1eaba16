"""The read side of a file store: queue reads, offset lookups, message lookups by id and key,
and undecoded runs of records for readers that decode many at once (the Spark source).

Shared by ``FileStore`` (the writer) and ``StoreReader`` (read-only, no broker running).
Every method may run on any thread; records are validated (CRC32C, offset) as they are read.
"""
from __future__ import annotations

import struct
from array import array
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING

from crc32c import crc32c

from .api import KeyCursor, KeyPage
from .commit_log import CommitLog
from .consume_queue import ConsumeQueue, ConsumeQueues, Entry
from .record_builder import generated_id_offset
from .dispatcher import business_key, id_key
from .errors import CorruptRecordError, InvalidCursorError, OffsetOutOfRangeError
from .key_index import KeyIndex
from .record import HEADER_SIZE, MAGIC_BYTES, StoredMessage, decode
from .record_run import RecordRun

if TYPE_CHECKING:
    from .tier.reader import TierReader

TIERED_CURSOR = 1 << 40
"""``KeyCursor.entry`` of a cursor into tiered history (local key-index entries stay far below)."""
_LOCAL_ONLY = nullcontext()
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


_PREFIX = struct.Struct("<I4sIQ")  # total_size, magic + version + flags, crc32c, phys_offset
_MARK = MAGIC_BYTES + b"\0"  # flags must be 0


class StoreView:
    """Reads over a commit log, its consume queues and key index, and, when ``tier`` is set,
    the segments tiered to object storage below them: queue reads, ``read_at``, lookups and
    time lookups fall through to the tier below the local start (``read_runs`` and
    ``read_columns`` read the local log only)."""

    def __init__(self, commit_log: CommitLog, queues: ConsumeQueues, key_index: KeyIndex | None,
                 tier: TierReader | None = None) -> None:
        self.log = commit_log
        self.consume_queues = queues
        self.key_index = key_index
        self.tier = tier

    def cached_only(self) -> AbstractContextManager[None]:
        """A context: within it, on this thread, a read that would fetch tiered objects from
        object storage (not cached) raises TierFetchNeeded instead of waiting; local reads and
        cached tiered ones are unaffected."""
        return _LOCAL_ONLY if self.tier is None else self.tier.cached_only()

    def queues(self) -> list[tuple[str, int]]:
        """Every (topic, queue id) holding or having held messages."""
        found = {(queue.topic, queue.queue_id) for queue in self.consume_queues}
        return sorted(found | set(self.tier.queues()) if self.tier is not None else found)

    def queue_range(self, topic: str, queue_id: int) -> tuple[int, int]:
        """(earliest, next) queue offset; (0, 0) for a queue never written. The earliest is the
        tier's when it holds older messages than the local log."""
        queue = self.consume_queues.get(topic, queue_id, create=False)
        low, high = (queue.min_offset, queue.max_offset) if queue else (0, 0)
        tiered = self._tiered_start(topic, queue_id, queue)
        if tiered is None:
            return low, high
        return tiered, high if queue else self.tier.queue_end(topic, queue_id)  # type: ignore[union-attr]

    def _tiered_start(self, topic: str, queue_id: int, queue: ConsumeQueue | None) -> int | None:
        """The tier's first offset of a queue when it is below the local one, else None."""
        if self.tier is None:
            return None
        start = self.tier.queue_start(topic, queue_id)
        return start if start is not None and (queue is None or start < queue.min_offset) else None

    def read(self, topic: str, queue_id: int, queue_offset: int, max_count: int = 32,
             max_bytes: int = 4 << 20) -> list[StoredMessage]:
        """Messages of a queue from ``queue_offset`` on; empty at the end of the queue.

        Stops before a corrupt record; raises CorruptRecordError if the first one is corrupt
        (skip it by reading from ``queue_offset + 1``) and OffsetOutOfRangeError below the
        earliest retained offset. Below the local start it reads the tier, going on into the
        local log when the read reaches it.
        """
        queue = self.consume_queues.get(topic, queue_id, create=False)
        tiered = self._tiered_start(topic, queue_id, queue)
        if tiered is not None and (queue is None or queue_offset < queue.min_offset):
            if queue_offset < tiered:
                raise OffsetOutOfRangeError(topic, queue_id, queue_offset, *self.queue_range(topic, queue_id))
            out = self.tier.read(topic, queue_id, queue_offset, max_count, max_bytes)  # type: ignore[union-attr]
            if queue is not None and out and len(out) < max_count and queue_offset + len(out) == queue.min_offset:
                out += self._read_local(queue, queue.min_offset, max_count - len(out),
                                        max_bytes - sum(message.size for message in out), strict=False)
            return out
        if queue is None:
            return []
        self._check_range(queue, queue_offset)
        return self._read_local(queue, queue_offset, max_count, max_bytes, strict=True)

    def _read_local(self, queue: ConsumeQueue, queue_offset: int, max_count: int, budget: int,
                    strict: bool) -> list[StoredMessage]:
        """``read`` from the local log; ``strict``: raise if the first record is corrupt."""
        out: list[StoredMessage] = []
        while len(out) < max_count:
            entries = queue.read(queue_offset + len(out), max_count - len(out))
            if not entries:
                break
            read = self._records(entries, queue_offset + len(out), budget, first=strict and not out)
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

    def read_runs(self, topic: str, queue_id: int, queue_offset: int, max_count: int,
                  max_bytes: int = 16 << 20) -> list[RecordRun]:
        """Up to ``max_count`` records of a queue from ``queue_offset``, not decoded: the log bytes
        around them (one pread per run of neighbours) and where each record starts. For readers
        that decode many records at once; empty at the end of the queue. No run starts once
        ``max_bytes`` have been read (the first always does).

        Every record is checked as ``read`` checks it (magic, version, flags, CRC32C, offset) and
        against its queue entry's size; the section lengths inside are the decoder's to check.
        Like ``read``: stops before a corrupt record, raises CorruptRecordError if the first one
        is corrupt and OffsetOutOfRangeError below the earliest retained offset.
        """
        queue = self.consume_queues.get(topic, queue_id, create=False)
        if queue is None:
            return []
        self._check_range(queue, queue_offset)
        entries = queue.read(queue_offset, max_count)
        runs: list[RecordRun] = []
        index = 0
        while index < len(entries) and max_bytes > 0:
            run, intact = self._run(entries, index, _span_end(entries, index))
            if run.positions:
                runs.append(run)
            elif index == 0:
                raise self._corruption(run, entries[0], queue_offset)
            index += len(run.positions)
            max_bytes -= len(run.data)
            if not intact:
                break
        return runs

    def _run(self, entries: list[Entry], index: int, stop: int) -> tuple[RecordRun, bool]:
        """The records of ``entries[index:stop]`` that one pread holds, and False if a corrupt
        one cut the run short (the pread ending at a segment's end is not corruption)."""
        base, (last, last_size, _) = entries[index][0], entries[stop - 1]
        try:
            data, segment = self.log.read(base, last + last_size - base)
            name = segment.name
        except FileNotFoundError:
            data, name = b"", ""
        view, positions, unpack = memoryview(data), array("q"), _PREFIX.unpack_from
        for phys, size, _ in entries[index:stop]:
            pos = phys - base
            if pos and pos + size > len(data):
                break  # the span crosses into the next segment: the next run starts here
            # record.check's tests (whole, magic, version, flags, CRC32C, offset) and the entry's
            # size, as one tuple compare: a third of check's cost, which counts over thousands
            if not (HEADER_SIZE <= size and pos + size <= len(data)
                    and unpack(data, pos) == (size, _MARK, crc32c(view[pos + 12:pos + size]), phys)):
                return RecordRun(data, base, positions, name), False
            positions.append(pos)
        return RecordRun(data, base, positions, name), True

    @staticmethod
    def _corruption(run: RecordRun, entry: Entry, queue_offset: int) -> CorruptRecordError:
        """The error for the first record of ``run`` (``entry``), which failed ``_run``'s checks:
        ``decode`` says what is wrong with it."""
        phys, size, _ = entry
        if size == 0:
            return CorruptRecordError(phys, f"queue offset {queue_offset} was lost to corruption")
        try:
            found = decode(run.data, 0, phys, run.segment).size
        except CorruptRecordError as error:
            return error
        return CorruptRecordError(phys, f"its queue entry says {size} bytes, the record has {found}",
                                  run.segment)

    def read_at(self, phys_offset: int) -> StoredMessage:
        """The record at a commit-log offset (from a message id, key lookup or a queue entry);
        below the local log's start, the tier's."""
        if self.tier is not None and phys_offset < self.log.min_offset:
            try:
                return self.tier.read_at(phys_offset)
            except KeyError:
                raise CorruptRecordError(phys_offset, "no record there (deleted by retention or never "
                                                      "written)") from None
        try:
            head, segment = self.log.read(phys_offset, HEADER_SIZE)
        except FileNotFoundError:
            raise CorruptRecordError(phys_offset, "no record there (deleted by retention or never written)") from None
        size = int.from_bytes(head[:4], "little")
        data, segment = self.log.read(phys_offset, max(size, HEADER_SIZE))
        return decode(data, 0, phys_offset, segment.name)

    def lookup_id(self, msg_id: str, topics: Iterable[str], limit: int = 16) -> list[StoredMessage]:
        """Messages of ``topics`` whose id is ``msg_id``, newest first, at most ``limit`` of each
        topic: the ones with that id chosen by their producer, and the one whose generated id it
        is. Each topic is searched under its own index key, so no topic's messages hide another's."""
        wanted = set(topics)
        found: dict[int, StoredMessage] = {}
        for topic in wanted:
            def same_id(message: StoredMessage, topic: str = topic) -> bool:
                return message.msg_id == msg_id and message.topic == topic
            for message in self._find(id_key(topic, msg_id), limit, same_id).messages:
                found[message.phys_offset] = message
        generated = self._generated(msg_id)
        if generated is not None and generated.topic in wanted:
            found.setdefault(generated.phys_offset, generated)
        newest = sorted(found.values(), key=lambda message: message.phys_offset, reverse=True)
        if self.tier is None:
            return newest
        floor = self.log.min_offset
        older = [message for message in self.tier.lookup_id(msg_id, wanted, limit) if message.phys_offset < floor]
        counts = {topic: 0 for topic in wanted}
        out = []
        for message in newest + older:
            if counts[message.topic] < limit:
                counts[message.topic] += 1
                out.append(message)
        return out

    def _generated(self, msg_id: str) -> StoredMessage | None:
        """The message whose store-generated id is ``msg_id``, if any is left."""
        offset = generated_id_offset(msg_id)
        if offset is None or offset < self.log.min_offset:
            return None
        try:
            message = self.read_at(offset)
        except CorruptRecordError:
            return None
        return message if message.msg_id == msg_id else None

    def lookup_key(self, topic: str, key: str, limit: int = 32,
                   since_ms: int | None = None) -> list[StoredMessage]:
        """Messages of ``topic`` carrying business key ``key``, newest first; with
        ``since_ms``, only those stored then or later (older index files are not read). Tiered
        messages follow the local ones."""
        found = self._find(business_key(topic, key), limit, _carrying(topic, key), since_ms).messages
        if self.tier is not None and len(found) < limit:
            found += self.tier.lookup_key(topic, key, limit - len(found), since_ms, before=self.log.min_offset)
        return found

    def lookup_key_page(self, topic: str, key: str, limit: int,
                        after: KeyCursor | None = None) -> KeyPage:
        """``lookup_key`` a page at a time: up to ``limit`` messages older than ``after``; the
        pages of tiered messages follow the local ones (their cursors' entry is TIERED_CURSOR)."""
        before = self.log.min_offset
        if after is not None and after.entry == TIERED_CURSOR:
            if self.tier is None:
                raise InvalidCursorError("this cursor points into tiered history, and this store has "
                                         "no tier: start the lookup again without it")
            page, before = KeyPage([], None), min(before, after.offset)
        else:
            page = self._find(business_key(topic, key), limit, _carrying(topic, key), after=after)
            if page.next is not None or self.tier is None:
                return page
        room = limit - len(page.messages)
        older = self.tier.lookup_key(topic, key, room + 1, before=before) if limit > 0 else []
        messages = page.messages + older[:room]
        more = len(older) > room and messages
        return KeyPage(messages, KeyCursor(messages[-1].phys_offset, TIERED_CURSOR) if more else None)

    def _find(self, index_key: bytes, limit: int, matches: Callable[[StoredMessage], bool],
              since_ms: int | None = None, after: KeyCursor | None = None) -> KeyPage:
        """Up to ``limit`` messages that ``matches`` accepts among the candidates of
        ``index_key``, newest first, and the cursor of the last one if more follow.

        Every candidate is read and checked, and the walk goes on past those that fail, however
        many: candidates of other keys can cost reads, never hide a match. One match past
        ``limit`` is read to tell whether a next page exists.
        """
        if self.key_index is None or limit <= 0:
            return KeyPage([], None)
        out: list[StoredMessage] = []
        last: KeyCursor | None = None
        for candidate in self.key_index.candidates(index_key, since_ms, after=after, page=limit + 1):
            if candidate.offset < self.log.min_offset:
                break  # retention removed it, and every older one
            try:
                message = self.read_at(candidate.offset)
            except CorruptRecordError:
                continue
            if not matches(message):
                continue
            if len(out) == limit:
                return KeyPage(out, last)
            out.append(message)
            last = candidate
        return KeyPage(out, None)

    def offset_for_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """First queue offset whose record was stored at or after ``timestamp_ms`` (binary search
        of the local queue; the tier's answer when the first local record qualifies)."""
        queue = self.consume_queues.get(topic, queue_id, create=False)
        low, high = (queue.min_offset, queue.max_offset) if queue else (0, 0)
        tiered = self._tiered_start(topic, queue_id, queue)
        if tiered is not None:
            if queue is None:
                low = high = self.tier.queue_end(topic, queue_id)  # type: ignore[union-attr]
            first = self._local_offset_for_time(queue, low, high, timestamp_ms) if queue else high
            if first > low:
                return first
            found = self.tier.offset_for_time(topic, queue_id, timestamp_ms)  # type: ignore[union-attr]
            return first if found is None else found
        return self._local_offset_for_time(queue, low, high, timestamp_ms) if queue else 0

    def _local_offset_for_time(self, queue: ConsumeQueue, low: int, high: int, timestamp_ms: int) -> int:
        while low < high:
            middle = (low + high) // 2
            entry = queue.read(middle, 1)
            stored = self.read_at(entry[0][0]).store_ts if entry and entry[0][1] else timestamp_ms
            if stored >= timestamp_ms:
                high = middle
            else:
                low = middle + 1
        return low


def _carrying(topic: str, key: str) -> Callable[[StoredMessage], bool]:
    """Whether a message of ``topic`` carries business key ``key``."""
    return lambda message: message.topic == topic and key in message.keys
