"""Delayed and scheduled messages: a durable timer on the commit log.

A message sent with a delivery time in the future is appended, whole, to an internal topic of
its minute, ``%SYS%timer.<minute start in s>`` (one queue), with its destination and due time
in its properties. The log is the timer's only storage: the store indexes, recovers and
retains these records like any other, so nothing pending is held in memory and a restart
rebuilds the timer from the log.

The timer loads a minute's entries (due time and offset, not bodies) shortly before the
minute begins, and when an entry falls due it reads the record and sends a copy, with the
original message id, to its destination through the normal send path (fan-out, named queues,
durability). After a batch is durable the timer records how far it has fired, ``(due,
offset)``, in ``timer.json`` (on a node of a replica group, in the log: compacted topic
``%SYS%timer-mark``); entries are fired in that order, so after a restart everything
up to the mark is done and everything after it, including what fell due while the broker was
down, fires at once. A crash between a copy's fsync and the mark's write fires that batch
again (at least once, as every send).

A recall appends a tombstone naming the entry's offset to the same minute's topic before it
is answered, so a recalled message never fires, also after a restart.

A batch the store refuses (a full disk) is sent again as soon as the store writes again
(``store_health``), and at the latest after ``RETRY_S``: what fell due meanwhile is not held
back by a wait of its own.

Runs on the event loop; not thread-safe.
"""

from __future__ import annotations

import asyncio
import heapq
import json
import logging
import os
from collections.abc import Callable, Mapping, Sequence

from store import replace_file
from store.api import Message, Store
from store.errors import StoreError

from . import clock
from .consume import Reader
from .errors import InvalidArgument, NotRecallable, NotFound, QuotaExceeded, SluiceError
from .model import (INTERNAL_PREFIX, MESSAGE_GROUP_PROPERTY, OutgoingMessage, SendResult,
                    TopicConfig)
from .produce import Producer
from .waiting import wait_set

log = logging.getLogger(__name__)

TIMER_PREFIX = f"{INTERNAL_PREFIX}timer."
BUCKET_MS = 60_000
"""Entries are grouped by the minute they fall due in: one internal topic per minute."""
LOAD_AHEAD_MS = 20_000
"""A minute's entries are loaded this long before it begins: reading one (about 20,000 entries
a second) must end before its first entry falls due, as none fires before all are read."""
FIRE_BATCH = 512
READ_CHUNK = 1024
FILE_NAME = "timer.json"
MARK_TOPIC = INTERNAL_PREFIX + "timer-mark"
"""Where the fired-up-to mark lives when it is kept in the log (a compacted topic, one key)."""
CLOSE_WAIT_S = 5.0
RETRY_S = 1.0
"""A batch that could not be sent is tried again after this long (sooner if the store was the
cause and writes again)."""

DUE = "sluice.timer.due"
TOPIC = "sluice.timer.topic"
QUEUE = "sluice.timer.queue"
INTO = "sluice.timer.into"
"""Named queues (AMQP queues the publish was routed to) the message goes into when due."""
RECALLED = "sluice.timer.recalled"
"""On a tombstone: the offset, in its minute's topic, of the entry it cancels."""

Key = tuple[int, int, int]
"""(due ms, minute, offset in the minute's topic): the order entries fire in."""


def bucket_of(due_ms: int) -> int:
    """The start, in seconds, of the minute ``due_ms`` falls in."""
    return due_ms // BUCKET_MS * (BUCKET_MS // 1000)


def bucket_topic(bucket: int) -> str:
    return f"{TIMER_PREFIX}{bucket}"


def recall_handle(bucket: int, offset: int, msg_id: str) -> str:
    """What a sender keeps to cancel a delayed message: its minute, offset and id."""
    return f"{bucket}:{offset}:{msg_id}"


def parse_recall_handle(handle: str) -> tuple[int, int, str]:
    """(bucket, offset, message id); InvalidArgument when ``handle`` is not one."""
    parts = handle.split(":", 2)
    if len(parts) != 3 or not all(p.isascii() and p.isdigit() for p in parts[:2]) \
            or not parts[2] or len(handle) > 256 \
            or recall_handle(int(parts[0]), int(parts[1]), parts[2]) != handle:
        raise InvalidArgument("malformed recall handle: use the recall handle the send returned")
    return int(parts[0]), int(parts[1]), parts[2]


class DelayTimer:
    """Holds delayed messages in the log and sends each when it falls due."""

    def __init__(self, producer: Producer, reader: Reader, topics: Callable[[str], TopicConfig],
                 data_dir: str, max_delay_ms: int, marks_in_log: Store | None = None) -> None:
        """``marks_in_log``: keep the fired-up-to mark in this store's log (compacted topic
        ``MARK_TOPIC``, which must exist) instead of ``timer.json``."""
        self._producer = producer
        self._reader = reader
        self._topics = topics
        self._path = os.path.join(data_dir, FILE_NAME)
        self._marks_in_log = marks_in_log
        self.max_delay_ms = max_delay_ms
        self._fired: Key = self._load_mark()
        """Every entry at or before this key has fired."""
        self._saved: Key = self._fired
        """The mark on disk."""
        self._saving: asyncio.Task | None = None
        self._pending: list[int] = []
        """Heap of the minutes not loaded yet that may hold entries (``_pending_set`` too)."""
        self._pending_set: set[int] = set()
        self._loaded: dict[int, int] = {}
        """Loaded minute -> the end offset its load read to (later entries arrive by `_add`)."""
        self._heap: list[Key] = []
        self._recalled: set[tuple[int, int]] = set()
        """(bucket, offset) of recalled entries of loaded minutes."""
        self._firing: set[tuple[int, int]] = set()
        """(bucket, offset) of entries being sent now."""
        self._wake = asyncio.Event()
        self._store_writes = asyncio.Event()
        """Set while the store takes writes (see `store_health`)."""
        self._store_writes.set()
        self._task: asyncio.Task | None = None
        self._closing = False
        self._loading: int | None = None
        """The minute being loaded, and entries sent to it meanwhile (`_add`)."""
        self._loading_added: list[Key] = []

    def _load_mark(self) -> Key:
        """The recorded mark; none (everything pending fires) without a readable file."""
        try:
            if self._marks_in_log is not None:
                found = [m.body for m in self._marks_in_log.compacted(MARK_TOPIC) if m.body]
                if not found:
                    return -1, -1, -1
                due, bucket, offset = json.loads(found[-1])["fired_through"]
                return int(due), int(bucket), int(offset)
            with open(self._path, "rb") as f:
                due, bucket, offset = json.load(f)["fired_through"]
            return int(due), int(bucket), int(offset)
        except FileNotFoundError:
            return -1, -1, -1
        except (OSError, ValueError, KeyError, TypeError) as error:
            log.error("%s is unreadable (%s); every delayed message still in the log that is "
                      "due fires again (at least once)", self._path, error)
            return -1, -1, -1

    def start(self, queues: Sequence[tuple[str, int]]) -> None:
        """Find the minutes the log holds entries for (``queues``: the store's) and start firing."""
        floor = self._fired[1]
        self._pending_set = {int(name[len(TIMER_PREFIX):]) for name, _ in queues
                             if name.startswith(TIMER_PREFIX) and name[len(TIMER_PREFIX):].isdigit()
                             and int(name[len(TIMER_PREFIX):]) >= floor}
        self._pending = sorted(self._pending_set)
        self._task = asyncio.create_task(self._run())

    def store_health(self, reason: str | None) -> None:
        """The store stopped taking writes (``reason``) or takes them again (None): then a
        batch it refused is sent again at once. Runs on the event loop."""
        if reason is None:
            self._store_writes.set()
            self._wake.set()
        else:
            self._store_writes.clear()

    async def close(self) -> None:
        """Stop firing, after the batch being sent (if any) is sent and the mark recorded."""
        self._closing = True
        self._wake.set()
        if self._task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._task), CLOSE_WAIT_S)
            except TimeoutError:
                self._task.cancel()
                await asyncio.gather(self._task, return_exceptions=True)
        if self._saving is not None:
            await asyncio.gather(self._saving, return_exceptions=True)

    # --- scheduling and recall ---

    async def schedule(self, messages: Sequence[OutgoingMessage]) -> list[SendResult]:
        """Store delayed ``messages`` (checked as sends are) until due; return, per message,
        where the timer holds it and its recall handle."""
        now = clock.now_ms()
        records = []
        buckets = []
        for message in messages:
            if message.delivery_ts - now > self.max_delay_ms:
                raise InvalidArgument(
                    f"delivery time is {(message.delivery_ts - now) / 1000:.0f} s away; the limit is "
                    f"{self.max_delay_ms // 1000} s (core.max_delay_ms)")
            topic = self._topics(message.topic)
            self._producer.check(topic, message)
            properties = dict(message.properties)
            properties[DUE] = str(message.delivery_ts)
            properties[TOPIC] = topic.name
            if message.queue_id is not None:
                properties[QUEUE] = str(message.queue_id)
            if message.message_group:
                properties[MESSAGE_GROUP_PROPERTY] = message.message_group
            if message.also_into:
                properties[INTO] = "\n".join(message.also_into)
            buckets.append(bucket_of(message.delivery_ts))
            records.append(Message(bucket_topic(buckets[-1]), message.body, 0,
                                   message.tag, tuple(message.keys), properties, message.msg_id,
                                   message.born_ts or now))
        results = await self._producer.append_internal(records)
        out = []
        for message, bucket, result in zip(messages, buckets, results):
            self._add((message.delivery_ts, bucket, result.queue_offset))
            out.append(SendResult(result.msg_id, result.topic, result.queue_id, result.queue_offset,
                                  result.store_ts, recall_handle(bucket, result.queue_offset, result.msg_id)))
        return out

    def _add(self, key: Key) -> None:
        bucket = key[1]
        loaded_end = self._loaded.get(bucket)
        if loaded_end is None:
            if bucket not in self._pending_set:
                self._pending_set.add(bucket)
                heapq.heappush(self._pending, bucket)
        elif key[2] >= loaded_end:
            if bucket == self._loading:  # fired only with the rest of its minute
                self._loading_added.append(key)
            else:
                heapq.heappush(self._heap, key)
        if not self._heap or key <= self._heap[0] or bucket * 1000 - LOAD_AHEAD_MS <= clock.now_ms():
            self._wake.set()

    def check_recall(self, handle: str) -> tuple[str, int, int]:
        """(topic, bucket, offset) of the pending message ``handle`` names; NotFound when it
        fired, was recalled or never existed."""
        bucket, offset, msg_id = parse_recall_handle(handle)
        message = self._reader.read_one(bucket_topic(bucket), 0, offset)
        if message is None or message.msg_id != msg_id or TOPIC not in message.properties:
            raise NotRecallable("no delayed message has this recall handle (it was delivered "
                                  "already, or the handle is wrong)")
        key = (int(message.properties[DUE]), bucket, offset)
        if key <= self._fired or (bucket, offset) in self._firing or (bucket, offset) in self._recalled:
            raise NotRecallable("the delayed message was delivered or recalled already")
        return message.properties[TOPIC], bucket, offset

    async def recall(self, bucket: int, offset: int) -> None:
        """Cancel the pending entry (see `check_recall`): durable before this returns."""
        entry = (bucket, offset)
        self._recalled.add(entry)
        tombstone = Message(bucket_topic(bucket), b"", 0, properties={RECALLED: str(offset)})
        try:
            await self._producer.append_internal([tombstone])
        except BaseException:
            self._recalled.discard(entry)
            raise

    # --- firing ---

    async def _run(self) -> None:
        while not self._closing:
            now = clock.now_ms()
            while self._pending and self._pending[0] * 1000 - LOAD_AHEAD_MS <= now:
                bucket = heapq.heappop(self._pending)
                self._pending_set.discard(bucket)
                try:
                    await self._load(bucket)
                except Exception:  # noqa: BLE001 - read again in a second; the timer goes on
                    log.exception("the timer could not read minute %d; retrying in 1 s", bucket)
                    self._loaded.pop(bucket, None)
                    self._loading, self._loading_added = None, []
                    self._pending_set.add(bucket)
                    heapq.heappush(self._pending, bucket)
                    await asyncio.sleep(1)
                    break
            if self._heap and self._heap[0][0] <= now:
                await self._fire_due(now)
                continue
            self._forget_past(now)
            wait = 1.0
            if self._heap:
                wait = min(wait, (self._heap[0][0] - now) / 1000)
            if self._pending:
                wait = min(wait, (self._pending[0] * 1000 - LOAD_AHEAD_MS - now) / 1000)
            self._wake.clear()
            await wait_set(self._wake, max(wait, 0.001))

    async def _fire_due(self, now: int) -> None:
        """Fire one batch of what is due; a failure is logged and retried after ``RETRY_S``,
        or as soon as the store writes again if it was the cause."""
        try:
            await self._fire(now)
        except QuotaExceeded as error:
            if self._store_writes.is_set():  # not the store: a limit, retried later
                log.warning("delayed messages could not be sent (%s); retrying in %.0f s",
                            error, RETRY_S)
                await asyncio.sleep(RETRY_S)
                return
            log.warning("delayed messages could not be sent (%s); sending them again once the "
                        "store writes", error)
            await wait_set(self._store_writes, RETRY_S)
        except SluiceError as error:
            log.warning("delayed messages could not be sent (%s); retrying in %.0f s", error,
                        RETRY_S)
            await asyncio.sleep(RETRY_S)
        except Exception:  # noqa: BLE001 - the timer must go on firing
            log.exception("the timer failed to send delayed messages; retrying in %.0f s", RETRY_S)
            await asyncio.sleep(RETRY_S)

    def _forget_past(self, now: int) -> None:
        """Drop what the timer keeps of minutes that ended (nothing can be added to them; what
        was due in them has fired)."""
        ended = [b for b in self._loaded if b * 1000 + BUCKET_MS <= now]
        if ended:
            for bucket in ended:
                del self._loaded[bucket]
            done = set(ended)
            self._recalled = {entry for entry in self._recalled if entry[0] not in done}

    async def _load(self, bucket: int) -> None:
        """Read a minute's entries and tombstones into the heap, chunk by chunk, firing what
        falls due meanwhile."""
        topic = bucket_topic(bucket)
        start, end = self._reader.range(topic, 0)
        self._loaded[bucket] = end
        self._loading = bucket
        entries: list[Key] = []
        for chunk in self._reader.chunks(topic, 0, start, end, READ_CHUNK):
            for message in chunk:
                properties = message.properties
                recalled = properties.get(RECALLED)
                if recalled is not None:
                    self._recalled.add((bucket, int(recalled)))
                elif DUE in properties:
                    key = (int(properties[DUE]), bucket, message.queue_offset)
                    if key > self._fired:
                        entries.append(key)
            # What is due in minutes loaded before fires meanwhile. This minute's entries wait
            # for the whole minute: fired in order, none may pass one not read yet.
            now = clock.now_ms()
            if self._heap and self._heap[0][0] <= now:
                await self._fire_due(now)
            else:
                await asyncio.sleep(0)  # a large minute does not stall the loop
        self._loading = None
        entries += self._loading_added
        self._loading_added = []
        for key in entries:
            heapq.heappush(self._heap, key)
        if entries:
            log.debug("timer loaded %d entries due in minute %d", len(entries), bucket)

    async def _fire(self, now: int) -> None:
        """Send the entries due by ``now`` (one batch), then record how far the timer fired."""
        batch: list[tuple[Key, OutgoingMessage]] = []
        last: Key | None = None
        while self._heap and self._heap[0][0] <= now and len(batch) < FIRE_BATCH:
            key = heapq.heappop(self._heap)
            last = key
            _, bucket, offset = key
            if (bucket, offset) in self._recalled:
                self._recalled.discard((bucket, offset))
                continue
            stored = self._reader.read_one(bucket_topic(bucket), 0, offset)
            if stored is None:
                log.error("delayed message at offset %d of minute %d is gone from the log "
                          "(retention); it is not delivered", offset, bucket)
                continue
            batch.append((key, _due_message(stored.properties, stored.body, stored.tag,
                                            stored.keys, stored.msg_id, stored.born_ts)))
        if last is None:
            return
        entries = {(key[1], key[2]) for key, _ in batch}
        self._firing |= entries
        try:
            await self._send([message for _, message in batch])
        except BaseException:
            for key, _ in batch:  # fire them again next time
                heapq.heappush(self._heap, key)
            raise
        finally:
            self._firing -= entries
        self._fired = max(self._fired, last)
        if self._saving is None or self._saving.done():
            self._saving = asyncio.create_task(self._save_marks())

    async def _send(self, messages: list[OutgoingMessage]) -> None:
        """Send a batch; if part of it can no longer be sent (its topic was deleted), send the
        rest one by one and drop those, logged."""
        if not messages:
            return
        try:
            await self._producer.send(self._topics, messages)
            return
        except (NotFound, InvalidArgument):
            pass
        for message in messages:
            try:
                await self._producer.send(self._topics, [message])
            except (NotFound, InvalidArgument) as error:
                log.error("delayed message %s for topic %r is dropped: %s", message.msg_id,
                          message.topic, error)

    async def _save_marks(self) -> None:
        """Record the newest mark until none is newer than the one on disk (one write at a
        time, beside the firing: the next batch does not wait for this fsync)."""
        while self._saved != self._fired:
            mark = self._fired
            data = json.dumps({"version": 1, "fired_through": list(mark)}).encode()
            try:
                if self._marks_in_log is not None:
                    record = OutgoingMessage(MARK_TOPIC, data, keys=("mark",), queue_id=0)
                    await self._producer.send(self._topics, [record])
                else:
                    await asyncio.to_thread(replace_file, self._path, data)
            except (OSError, SluiceError, StoreError) as error:  # copies are durable: a restart may fire them again
                log.error("could not record the timer's progress (%s); after a restart the "
                          "messages fired since the last record are sent again", error)
                return
            self._saved = mark


def _due_message(properties: Mapping[str, str], body: bytes, tag: str, keys: Sequence[str],
                 msg_id: str, born_ts: int) -> OutgoingMessage:
    """The message a timer record stands for, addressed to its destination."""
    props = dict(properties)
    topic = props.pop(TOPIC)
    props.pop(DUE, None)
    queue = props.pop(QUEUE, None)
    into = props.pop(INTO, None)
    group = props.pop(MESSAGE_GROUP_PROPERTY, "")
    return OutgoingMessage(topic, body, tag=tag, keys=tuple(keys), properties=props,
                           message_group=group, queue_id=int(queue) if queue is not None else None,
                           msg_id=msg_id, born_ts=born_ts,
                           also_into=tuple(into.split("\n")) if into else ())
