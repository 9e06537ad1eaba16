"""The read path: message-level pop with invisible durations, and pull by offset.

A receipt handle names one delivery of one message: boot id, queue, offset, the flight's
version and a check of the consumer and topic. Changing the invisible duration issues a new
version, so an older handle stops working; a handle from before a broker restart is refused as
expired (the message will be delivered again).

Runs on the event loop; not thread-safe.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import zlib
from collections.abc import Callable, Iterator
from typing import NamedTuple

from store.api import Store
from store.errors import CorruptRecordError, OffsetOutOfRangeError, StoreError

from .acl import Withheld
from .cursors import Cursor
from .delivery import RecentMessages
from .errors import CorruptMessage, InvalidReceiptHandle, OffsetOutOfRange, ReceiptExpired, Unavailable
from .filters import Filter
from .history import HistoryFetches, HistoryPending
from .model import Delivery

log = logging.getLogger(__name__)

MAX_IN_FLIGHT_SPAN = 100_000
"""A pop cursor stops taking new messages when this many offsets separate it from the oldest
unacked one, so one stuck message cannot make a queue's state grow without bound."""

BOOT_ID = os.urandom(4).hex()


class Handle(NamedTuple):
    """A parsed receipt handle."""

    queue_id: int
    offset: int
    version: int
    check: int


@functools.lru_cache(maxsize=4096)  # pure, and asked for by every delivery's handle
def consumer_check(consumer: str, topic: str) -> int:
    """A short checksum tying a handle to one consumer and topic."""
    return zlib.crc32(f"{consumer}\0{topic}".encode()) & 0xFFFF


def make_handle(consumer: str, topic: str, queue_id: int, offset: int, version: int) -> str:
    """The receipt handle of one delivery."""
    return f"{BOOT_ID}.{queue_id}.{offset}.{version}.{consumer_check(consumer, topic):04x}"


def parse_handle(handle: str, consumer: str, topic: str) -> Handle:
    """Parse and check a receipt handle; raise InvalidReceiptHandle or ReceiptExpired."""
    parts = handle.split(".")
    try:
        boot, queue_id, offset, version, check = parts
        parsed = Handle(int(queue_id), int(offset), int(version), int(check, 16))
    except ValueError:
        raise InvalidReceiptHandle(f"receipt handle {handle[:80]!r} is malformed; pass the handle "
                                   "exactly as it came with the message") from None
    if parsed.check != consumer_check(consumer, topic):
        raise InvalidReceiptHandle("receipt handle was issued for another consumer group or topic; "
                                   "ack with the group and topic that received the message")
    if boot != BOOT_ID:
        raise ReceiptExpired("receipt handle was issued before the broker restarted; the message "
                             "will be delivered again")
    return parsed


def to_delivery(stored) -> Delivery:
    """A consumer-facing view of a stored record, at its home queue."""
    return Delivery(stored.topic, stored.queue_id, stored.queue_offset, stored.msg_id, stored.body,
                    stored.tag, stored.keys, stored.properties, stored.born_ts, stored.store_ts)


def _queue_delivery(stored, topic: str, queue_id: int, offset: int) -> Delivery:
    """A stored record as read from queue (``topic``, ``queue_id``) at ``offset``: its home
    queue, or a queue it was fanned out to."""
    return Delivery(topic, queue_id, offset, stored.msg_id, stored.body, stored.tag, stored.keys,
                    stored.properties, stored.born_ts, stored.store_ts,
                    home_topic="" if stored.topic == topic else stored.topic)


class Reader:
    """Reads queues through the recent-message cache, falling back to the store.

    A read below the earliest retained offset is empty (retention removed those messages); a
    corrupt record is an error (``CorruptMessage``, logged), never an empty read: nothing
    corrupt is delivered, and a consumer is told why it gets nothing. A read of tiered history
    not cached raises ``HistoryPending`` while ``history`` fetches it off the loop.
    """

    def __init__(self, store: Store, recent: RecentMessages, deliverable_end: Callable[[str, int], int],
                 floors: dict[tuple[str, int], int]) -> None:
        self._store = store
        self._recent = recent
        self.deliverable_end = deliverable_end
        self._floors = floors
        self.history = HistoryFetches(store)

    def range(self, topic: str, queue_id: int) -> tuple[int, int]:
        """(earliest offset, deliverable end) of a queue; the earliest respects the topic's
        own retention (``floors``) as well as the store's."""
        end = self.deliverable_end(topic, queue_id)
        earliest = max(self._store.queue_range(topic, queue_id)[0], self._floors.get((topic, queue_id), 0))
        return min(earliest, end), end

    def read(self, topic: str, queue_id: int, offset: int, limit: int) -> list[Delivery]:
        """Up to ``limit`` deliverable messages from ``offset`` on."""
        limit = min(limit, self.deliverable_end(topic, queue_id) - offset)
        if limit <= 0:
            return []
        cached = self._recent.get(topic, queue_id, offset, limit)
        if cached:
            return cached
        try:
            stored = self.history.read(
                ("read", topic, queue_id, offset), f"queue {queue_id} of topic {topic!r} from offset {offset}",
                functools.partial(self._store.read, topic, queue_id, offset, limit))[:limit]
        except OffsetOutOfRangeError:
            return []
        except CorruptRecordError as corrupt:
            log.error("message at offset %d of queue %d of topic %s is corrupt and was not "
                      "delivered: %s", offset, queue_id, topic, corrupt)
            raise CorruptMessage(topic, queue_id, offset, corrupt.reason) from corrupt
        except StoreError as error:
            raise Unavailable(f"the store cannot read queue {queue_id} of topic {topic!r} now "
                              f"({error}); retry later") from error
        return [_queue_delivery(m, topic, queue_id, offset + i) for i, m in enumerate(stored)]

    def chunks(self, topic: str, queue_id: int, start: int, end: int,
               size: int) -> Iterator[list[Delivery]]:
        """The queue's messages from ``start`` to ``end`` in chunks of up to ``size``, for
        readers of a whole range (the broker's own topics); a corrupt message is skipped (the
        read logs it)."""
        offset = start
        while offset < end:
            try:
                chunk = self.read(topic, queue_id, offset, min(size, end - offset))
            except CorruptMessage:
                offset += 1
                continue
            if not chunk:
                return
            yield chunk
            offset = chunk[-1].queue_offset + 1

    def read_one(self, topic: str, queue_id: int, offset: int) -> Delivery | None:
        """The message at ``offset``, or None if it is gone (retention); CorruptMessage if it
        is corrupt."""
        found = self.read(topic, queue_id, offset, 1)
        return found[0] if found and found[0].queue_offset == offset else None


class Popped(NamedTuple):
    """What one pop pass produced."""

    deliveries: list[Delivery]
    dead: list[Delivery]
    """Messages past their maximum attempts: to be moved to the dead-letter queue."""


def pop_queue(reader: Reader, cursor: Cursor, consumer: str, topic: str, queue_id: int,
              selector: Filter, now_ms: int, invisible_ms: int, limit: int, max_attempts: int,
              fifo: bool = False, withheld: Withheld | None = None) -> Popped:
    """Take up to ``limit`` messages from one queue: due redeliveries first, then new ones.
    A ``fifo`` group takes new messages only while none of the queue is in flight, so the
    messages of a message group (which all go to one queue) are handed out in order, each
    batch once the previous one is settled, and a retry comes before anything after it.
    A message ``withheld`` from this reader (an access rule denies its subject), new or due
    again, is settled like one the selector does not match: never handed out, never retried
    nor dead-lettered, and it blocks nothing behind it.
    CorruptMessage if the first new message to take is corrupt; HistoryPending if it is tiered
    history still being fetched (nothing taken yet: run the pop again once it is ready)."""
    out: list[Delivery] = []
    dead: list[Delivery] = []
    for offset in cursor.expired(now_ms, limit):
        try:
            message = reader.read_one(topic, queue_id, offset)
        except HistoryPending:
            if out or dead:  # hand out what was taken; the fetch goes on for the next pop
                return Popped(out, dead)
            raise
        if message is None or (withheld is not None and withheld(message)):
            cursor.ack(offset)
        elif cursor.inflight[offset].attempt >= max_attempts:
            dead.append(_hold_for_dead_letter(message, cursor, offset, now_ms, invisible_ms))
        else:
            flight = cursor.deliver(offset, now_ms, invisible_ms)
            out.append(_deliver(message, consumer, cursor, offset, flight.attempt))
    if fifo and cursor.inflight:
        return Popped(out, dead)
    earliest, end = reader.range(topic, queue_id)
    if cursor.next < earliest:
        cursor.skip_to(earliest)
    while len(out) < limit and cursor.next < end and cursor.next - cursor.committed < MAX_IN_FLIGHT_SPAN:
        try:
            batch = reader.read(topic, queue_id, cursor.next, min(limit - len(out), end - cursor.next) + 16)
        except (CorruptMessage, HistoryPending):
            if out or dead:  # hand out what was taken; the next pop reports the corruption
                break
            raise
        if not batch:
            break
        for message in batch:
            offset = message.queue_offset
            if offset < cursor.next:
                continue
            if len(out) >= limit:
                break
            cursor.next = offset + 1
            if offset in cursor.acked:
                continue
            if not selector.matches(message) or (withheld is not None and withheld(message)):
                cursor.ack(offset)
                continue
            if cursor.attempts.get(offset, 0) >= max_attempts:
                dead.append(_hold_for_dead_letter(message, cursor, offset, now_ms, invisible_ms))
                continue
            flight = cursor.deliver(offset, now_ms, invisible_ms)
            out.append(_deliver(message, consumer, cursor, offset, flight.attempt))
    return Popped(out, dead)


def _hold_for_dead_letter(message: Delivery, cursor: Cursor, offset: int, now_ms: int,
                          invisible_ms: int) -> Delivery:
    """Keep a message past its attempts hidden while it is copied to the dead-letter queue."""
    if offset in cursor.inflight:
        flight = cursor.extend(offset, now_ms, invisible_ms)
    else:
        attempts = cursor.attempts.pop(offset)
        flight = cursor.deliver(offset, now_ms, invisible_ms)
        flight.attempt = attempts
    return dataclasses.replace(message, attempt=flight.attempt)


def _deliver(message: Delivery, consumer: str, cursor: Cursor, offset: int, attempt: int) -> Delivery:
    flight = cursor.inflight[offset]
    # built field by field: dataclasses.replace walks the fields on every call, per message
    return Delivery(
        message.topic, message.queue_id, message.queue_offset, message.msg_id, message.body,
        message.tag, message.keys, message.properties, message.born_ts, message.store_ts,
        attempt=attempt,
        receipt_handle=make_handle(consumer, message.topic, message.queue_id, offset, flight.version),
        invisible_until_ms=flight.deadline_ms, home_topic=message.home_topic)


def settle(cursor: Cursor, handle: Handle) -> int:
    """Check that ``handle`` names the live flight of its message; return the offset."""
    flight = cursor.inflight.get(handle.offset)
    if flight is None:
        if handle.offset < cursor.committed or handle.offset in cursor.acked:
            raise ReceiptExpired("the message was acked already")
        raise ReceiptExpired("the message's invisible duration ended and it was or will be "
                             "delivered again; ack the newer delivery")
    if flight.version != handle.version:
        raise ReceiptExpired("receipt handle was superseded (the invisible duration was changed "
                             "or the message redelivered); use the newest handle")
    return handle.offset


def pull_queue(reader: Reader, topic: str, queue_id: int, offset: int, limit: int,
               selector: Filter, withheld: Withheld | None = None
               ) -> tuple[list[Delivery], int, int, int]:
    """Read by offset: (matching messages, next offset, earliest, deliverable end). Messages
    ``withheld`` from this reader (an access rule denies their subject) are skipped like those
    the selector does not match, and the next offset moves past them.
    CorruptMessage if the message at ``offset`` is corrupt; HistoryPending if it is tiered
    history still being fetched."""
    earliest, end = reader.range(topic, queue_id)
    if offset > end:
        raise OffsetOutOfRange(f"offset {offset} is past the end of queue {queue_id} of topic "
                               f"{topic!r} (next offset {end}); pull from {end} or earlier")
    offset = max(offset, earliest)
    out: list[Delivery] = []
    while offset < end and len(out) < limit:
        try:
            batch = reader.read(topic, queue_id, offset, limit - len(out))
        except (CorruptMessage, HistoryPending):
            if out:  # answer with what was read; the next pull, from ``offset``, reports it
                break
            raise
        if not batch:
            break
        for message in batch:
            offset = message.queue_offset + 1
            if selector.matches(message) and (withheld is None or not withheld(message)):
                out.append(message)
    return out, offset, earliest, end
