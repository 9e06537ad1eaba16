"""Transactional messages: half messages kept in the log until their producer decides.

A transactional send appends the message, whole, to the internal topic ``%SYS%txn.half``
(one queue) with its destination in its properties, and answers with a transaction id naming
the record's offset. Consumers never see it. The producer then commits, and the message is
sent, with its own id, to its topic through the normal send path; or it rolls back, and the
message is dropped. Either decision is recorded in ``%SYS%txn.outcome``, as is every check-back
the broker makes for a transaction left open: after ``transaction_check_delay_ms`` a producer of
the topic is asked (``checker``: the native adapter sends ``RecoverOrphanedTransactionCommand``
on a Telemetry stream), then again every ``transaction_check_interval_ms``; after
``transaction_check_max`` checks without an answer the message is discarded and logged.

The log is the only storage, so a restart rebuilds the open transactions by reading both
topics from the floor recorded in ``transactions.json`` (everything below it is decided),
check counts included. A commit sends the message before recording the outcome; a crash
between the two leaves the transaction open, and before its message is sent again the broker
looks it up by id, so a committed message is delivered once.

Runs on the event loop; not thread-safe.
"""

from __future__ import annotations

import asyncio
import heapq
import json
import logging
import os
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from store import replace_file
from store.api import Message, StoredMessage

from . import clock
from .consume import Reader
from .errors import InvalidArgument, QuotaExceeded, TransactionNotFound
from .model import (INTERNAL_PREFIX, MESSAGE_GROUP_PROPERTY, Delivery, OutgoingMessage, SendResult,
                    TopicConfig)
from .produce import Producer
from .settings import CoreConfig
from .waiting import wait_set

log = logging.getLogger(__name__)

HALF_TOPIC = f"{INTERNAL_PREFIX}txn.half"
OUTCOME_TOPIC = f"{INTERNAL_PREFIX}txn.outcome"
FILE_NAME = "transactions.json"
READ_CHUNK = 1024
SAVE_EVERY_S = 1.0

TOPIC = "sluice.txn.topic"
QUEUE = "sluice.txn.queue"
MSG_ID = "sluice.txn.id"
"""On a half record: the message's own id (the record has one of its own, so looking the id
up finds the message only once it was committed)."""
HALF = "sluice.txn.half"
OUTCOME = "sluice.txn.outcome"
"""On an outcome record: the half record's offset, and what happened to it."""
COMMITTED, ROLLED_BACK, CHECKED, DISCARDED = "commit", "rollback", "check", "discard"

Checker = Callable[[str, Delivery, str], bool]
"""(topic, the message, transaction id) -> whether a producer of the topic was asked."""


@dataclass(slots=True)
class OpenTransaction:
    """A half message no decision was recorded for."""

    topic: str
    msg_id: str
    checks: int
    next_check_ms: int
    outcome_from: int
    """The outcome topic's end when the half was stored: its outcome records lie after it."""
    maybe_sent: bool = False
    """A commit may have sent the message already (recovered, or a commit failed midway)."""


def transaction_id(half_offset: int, msg_id: str) -> str:
    """What a producer quotes to end a transaction: the half record's offset and the id."""
    return f"{half_offset}:{msg_id}"


def parse_transaction_id(value: str) -> tuple[int, str]:
    """(half offset, message id); TransactionNotFound when ``value`` is not a transaction id."""
    offset, _, msg_id = value.partition(":")
    if not offset.isascii() or not offset.isdigit() or str(int(offset)) != offset or not msg_id \
            or len(value) > 256:
        raise TransactionNotFound("malformed transaction id: quote the one the send returned")
    return int(offset), msg_id


class Transactions:
    """The open transactions, their check-backs, and commit and rollback."""

    def __init__(self, producer: Producer, reader: Reader,
                 lookup_id: Callable[[str, Sequence[str], int], list[StoredMessage]],
                 topics: Callable[[str], TopicConfig], data_dir: str, config: CoreConfig) -> None:
        self._producer = producer
        self._reader = reader
        self._lookup_id = lookup_id
        self._topics = topics
        self._path = os.path.join(data_dir, FILE_NAME)
        self._config = config
        self.checker: Checker | None = None
        """Asks a producer about an open transaction; set by the adapter that can."""
        self._open: dict[int, OpenTransaction] = {}
        """Half offset -> its open transaction."""
        self._due: list[tuple[int, int]] = []
        """Heap of (next check ms, half offset); stale entries are skipped."""
        self._ending: set[int] = set()
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._saver: asyncio.Task | None = None
        self._dirty = False
        self._closing = False

    @property
    def open_count(self) -> int:
        """Transactions prepared and not decided yet."""
        return len(self._open)

    # --- start and close ---

    async def start(self) -> None:
        """Rebuild the open transactions from the log, then start checking them."""
        half_from, outcome_from = self._load_floors()
        decided: set[int] = set()
        checks: Counter[int] = Counter()
        async for record in self._scan(OUTCOME_TOPIC, outcome_from):
            half = int(record.properties.get(HALF, -1))
            if record.properties.get(OUTCOME) == CHECKED:
                checks[half] += 1
            elif half >= 0:
                decided.add(half)
        now = clock.now_ms()
        outcome_end = self._reader.range(OUTCOME_TOPIC, 0)[1]
        async for record in self._scan(HALF_TOPIC, half_from):
            offset = record.queue_offset
            if offset in decided or TOPIC not in record.properties:
                continue
            due = max(now, record.store_ts + self._config.transaction_check_delay_ms)
            self._open[offset] = OpenTransaction(record.properties[TOPIC], record.properties[MSG_ID],
                                                 checks[offset], due, min(outcome_from, outcome_end),
                                                 maybe_sent=True)
            self._due.append((due, offset))
        heapq.heapify(self._due)
        if self._open:
            log.info("%d transactions prepared before the restart are open; their producers "
                     "will be asked to decide", len(self._open))
        self._task = asyncio.create_task(self._run())
        self._saver = asyncio.create_task(self._save_floors_every_second())

    async def close(self) -> None:
        """Stop checking; record the floors."""
        self._closing = True
        self._wake.set()
        for task in (self._task, self._saver):
            if task is not None:
                task.cancel()
        await asyncio.gather(*(t for t in (self._task, self._saver) if t), return_exceptions=True)
        if self._dirty:
            await self._save_floors()

    async def _scan(self, topic: str, start: int):
        """The records of an internal topic from ``start``, chunk by chunk, yielding the loop."""
        earliest, end = self._reader.range(topic, 0)
        for chunk in self._reader.chunks(topic, 0, max(start, earliest), end, READ_CHUNK):
            for record in chunk:
                yield record
            await asyncio.sleep(0)

    # --- prepare, commit, rollback ---

    async def prepare(self, messages: Sequence[OutgoingMessage]) -> list[SendResult]:
        """Store half messages (checked as sends are); return each one's transaction id."""
        limit = self._config.max_open_transactions
        if len(self._open) + len(messages) > limit:
            raise QuotaExceeded(f"{len(self._open)} transactions are open, the limit is {limit} "
                                "(core.max_open_transactions); commit or roll back open ones first")
        records = []
        for message in messages:
            topic = self._topics(message.topic)
            self._producer.check(topic, message)
            properties = dict(message.properties)
            properties[TOPIC] = topic.name
            properties[MSG_ID] = message.msg_id
            if message.queue_id is not None:
                properties[QUEUE] = str(message.queue_id)
            if message.message_group:
                properties[MESSAGE_GROUP_PROPERTY] = message.message_group
            records.append(Message(HALF_TOPIC, message.body, 0, message.tag, tuple(message.keys),
                                   properties, "", message.born_ts or clock.now_ms()))
        outcome_from = self._reader.range(OUTCOME_TOPIC, 0)[1]
        results = await self._producer.append_internal(records)
        due = clock.now_ms() + self._config.transaction_check_delay_ms
        out = []
        for message, result in zip(messages, results):
            offset = result.queue_offset
            self._open[offset] = OpenTransaction(message.topic, message.msg_id, 0, due, outcome_from)
            heapq.heappush(self._due, (due, offset))
            out.append(SendResult(message.msg_id, message.topic, message.queue_id or 0, offset,
                                  result.store_ts, transaction_id=transaction_id(offset, message.msg_id)))
        self._wake.set()
        return out

    def check_end(self, topic: str, msg_id: str, txn_id: str) -> int:
        """The half offset of the open transaction ``txn_id`` of ``topic``; TransactionNotFound
        when it was decided, discarded, is being ended, or never existed."""
        offset, id_in_txn = parse_transaction_id(txn_id)
        entry = self._open.get(offset)
        if entry is None or offset in self._ending or entry.msg_id != id_in_txn \
                or (msg_id and msg_id != entry.msg_id) or entry.topic != topic:
            raise TransactionNotFound(
                f"no open transaction of topic {topic!r} has id {txn_id[:80]!r}: it was committed, "
                "rolled back or discarded already, or the id is wrong")
        return offset

    async def end(self, offset: int, commit: bool) -> None:
        """Commit (send the message) or roll back the open transaction at ``offset``
        (see `check_end`); the outcome is durable before this returns."""
        entry = self._open[offset]
        self._ending.add(offset)
        try:
            if commit:
                entry.maybe_sent = True
                await self._send_committed(offset, entry)
            await self._record([(offset, COMMITTED if commit else ROLLED_BACK)])
        finally:
            self._ending.discard(offset)
        self._decided(offset)

    async def _send_committed(self, offset: int, entry: OpenTransaction) -> None:
        half = self._reader.read_one(HALF_TOPIC, 0, offset)
        if half is None:
            raise TransactionNotFound(f"the message of transaction {offset} is gone from the log "
                                      "(retention); it cannot be committed")
        if entry.maybe_sent:
            if self._lookup_id(entry.msg_id, (entry.topic,), 1):
                return  # a commit sent it before a crash or a failed outcome write
        await self._producer.send(self._topics, [committed_message(half)])

    async def _record(self, outcomes: list[tuple[int, str]]) -> None:
        await self._producer.append_internal([
            Message(OUTCOME_TOPIC, b"", 0, properties={HALF: str(offset), OUTCOME: outcome})
            for offset, outcome in outcomes])

    def _decided(self, offset: int) -> None:
        self._open.pop(offset, None)
        self._dirty = True

    # --- check-backs ---

    async def _run(self) -> None:
        while not self._closing:
            now = clock.now_ms()
            batch = []
            while self._due and self._due[0][0] <= now and len(batch) < READ_CHUNK:
                due, offset = heapq.heappop(self._due)
                entry = self._open.get(offset)
                if entry is not None and entry.next_check_ms == due and offset not in self._ending:
                    batch.append((offset, entry))
            if batch:
                try:
                    await self._check(batch, now)
                except Exception:  # noqa: BLE001 - the checks go on; these are retried
                    log.exception("checking %d open transactions failed; retrying in 1 s", len(batch))
                    for offset, entry in batch:
                        entry.next_check_ms = now + 1000
                        heapq.heappush(self._due, (entry.next_check_ms, offset))
                    await asyncio.sleep(1)
                continue
            wait = 1.0 if not self._due else min(1.0, (self._due[0][0] - now) / 1000)
            self._wake.clear()
            await wait_set(self._wake, max(wait, 0.001))

    async def _check(self, batch: list[tuple[int, OpenTransaction]], now: int) -> None:
        """Ask producers about open transactions; discard those asked too often. Until an
        adapter that can ask is attached (start-up), nothing is asked or counted."""
        if self.checker is None:
            for offset, entry in batch:
                entry.next_check_ms = now + 1000
                heapq.heappush(self._due, (entry.next_check_ms, offset))
            return
        outcomes = []
        discarded = []
        for offset, entry in batch:
            if entry.checks >= self._config.transaction_check_max:
                outcomes.append((offset, DISCARDED))
                discarded.append((offset, entry))
                self._ending.add(offset)  # no commit may race the discard
            else:
                outcomes.append((offset, CHECKED))
        try:
            await self._record(outcomes)
        finally:
            self._ending.difference_update(offset for offset, _ in discarded)
        for offset, entry in discarded:
            log.warning("transaction %s of topic %r was checked %d times without a decision; its "
                        "message is discarded", transaction_id(offset, entry.msg_id), entry.topic,
                        entry.checks)
            self._decided(offset)
        for offset, entry in batch:
            if offset not in self._open:
                continue
            entry.checks += 1
            entry.next_check_ms = now + self._config.transaction_check_interval_ms
            heapq.heappush(self._due, (entry.next_check_ms, offset))
            self._ask(offset, entry)

    def _ask(self, offset: int, entry: OpenTransaction) -> None:
        checker = self.checker
        half = self._reader.read_one(HALF_TOPIC, 0, offset)
        if checker is None or half is None:  # aged out with retention: discarded at the limit
            return
        message = committed_message(half)
        delivery = Delivery(entry.topic, message.queue_id or 0, offset, entry.msg_id, half.body,
                            half.tag, tuple(half.keys), message.properties, half.born_ts, half.store_ts)
        try:
            asked = checker(entry.topic, delivery, transaction_id(offset, entry.msg_id))
        except Exception:  # noqa: BLE001 - counted as a check; the next one may reach a producer
            log.exception("asking about transaction %d failed", offset)
            return
        if not asked:
            log.info("no producer of topic %r is connected to decide transaction %s (check %d of %d)",
                     entry.topic, transaction_id(offset, entry.msg_id), entry.checks,
                     self._config.transaction_check_max)

    # --- floors ---

    def _load_floors(self) -> tuple[int, int]:
        try:
            with open(self._path, "rb") as f:
                data = json.load(f)
            return int(data["half_from"]), int(data["outcome_from"])
        except FileNotFoundError:
            return 0, 0
        except (OSError, ValueError, KeyError, TypeError) as error:
            log.error("%s is unreadable (%s); open transactions are rebuilt from the whole log",
                      self._path, error)
            return 0, 0

    async def _save_floors_every_second(self) -> None:
        while True:
            await asyncio.sleep(SAVE_EVERY_S)
            if self._dirty:
                await self._save_floors()

    async def _save_floors(self) -> None:
        """Record where a restart starts reading: the oldest open half (or the end) and the
        outcome records that may concern it."""
        self._dirty = False
        if self._open:
            half_from = min(self._open)
            outcome_from = min(entry.outcome_from for entry in self._open.values())
        else:
            half_from = self._reader.range(HALF_TOPIC, 0)[1]
            outcome_from = self._reader.range(OUTCOME_TOPIC, 0)[1]
        data = json.dumps({"version": 1, "half_from": half_from, "outcome_from": outcome_from})
        try:
            await asyncio.to_thread(replace_file, self._path, data.encode())
        except OSError as error:  # the next save tries again; a restart reads further back
            log.error("could not record the transactions' floor (%s); retrying", error)
            self._dirty = True


def committed_message(half: StoredMessage) -> OutgoingMessage:
    """The message a half record holds, addressed to its topic."""
    properties = dict(half.properties)
    topic = properties.pop(TOPIC)
    msg_id = properties.pop(MSG_ID, half.msg_id)
    queue = properties.pop(QUEUE, None)
    group = properties.pop(MESSAGE_GROUP_PROPERTY, "")
    return OutgoingMessage(topic, half.body, tag=half.tag, keys=tuple(half.keys), properties=properties,
                           message_group=group, queue_id=int(queue) if queue is not None else None,
                           msg_id=msg_id, born_ts=half.born_ts, transactional=True)


def check_transactional(messages: Sequence[OutgoingMessage]) -> bool:
    """Whether ``messages`` are a transactional send; InvalidArgument when they mix kinds or
    a transactional message is also delayed."""
    transactional = [m.transactional for m in messages]
    if not any(transactional):
        return False
    if not all(transactional):
        raise InvalidArgument("a send is transactional or not: send transactional messages "
                              "apart from the others")
    if any(m.delivery_ts for m in messages):
        raise InvalidArgument("a transactional message cannot also be delayed; drop the delivery time")
    return True
