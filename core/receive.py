"""Message-level (pop) consumption of topics by consumer groups: the receive loop, and settling
what was received (ack, a new invisible duration, dead-lettering).

No authorization here: ``Broker`` decides first and passes ``still_allowed`` so a long poll
ends when a revoke lands while it waits, and ``withheld_now`` for the access rules on each
message's subject (``core.acl``). Runs on the event loop; not thread-safe.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Callable

from .acl import Withheld
from .clock import now_ms
from .consume import Popped, make_handle, parse_handle, pop_queue, settle
from .cursors import Cursor
from .dead_letter import dead_letter
from .engine import Engine
from .errors import InvalidReceiptHandle
from .filters import Filter
from .history import HistoryPending, with_history
from .model import ConsumeMode, Delivery, GroupConfig, MessageType, TopicConfig


class Receiver:
    """Pops messages of a topic for a group's consumers and settles them."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._rotation = itertools.count()

    async def receive(self, group: GroupConfig, topic: TopicConfig, client_id: str, selector: Filter,
                      invisible_ms: int, max_messages: int, wait_ms: int, queue_id: int | None,
                      still_allowed: Callable[[], None],
                      withheld_now: Callable[[], Withheld | None]) -> list[Delivery]:
        """Pop up to ``max_messages``, waiting up to ``wait_ms`` for some to arrive; after each
        wait ``still_allowed()`` raises if the caller lost the right meanwhile, and each pass
        withholds what ``withheld_now()`` says the access rules deny the caller then."""
        engine = self._engine
        consumer = engine.groups.consumer(group.name, client_id)
        deadline = now_ms() + min(max(0, wait_ms), engine.config.max_long_poll_ms)
        while True:
            queues = self._queues(group.name, topic, client_id, queue_id)
            found = await self._pop(consumer, topic.name, queues, selector, invisible_ms, max_messages,
                                    group.retry.max_attempts, group.fifo, withheld_now())
            now = now_ms()
            if found or now >= deadline or engine.closing or topic.name not in engine.topics:
                engine.count_out(topic.name, found)
                if engine.tracer.on:
                    engine.tracer.delivered(consumer, client_id, found)
                return found
            wake = deadline
            for q in queues:
                cursor = engine.cursors.get((consumer, topic.name, q))
                if cursor is not None and (due := cursor.next_deadline()) is not None:
                    wake = min(wake, due)
            await engine.signals.wait((topic.name,), max(0.001, (wake - now) / 1000))
            still_allowed()

    def _queues(self, group: str, topic: TopicConfig, client_id: str,
                queue_id: int | None) -> list[int]:
        """A client that asked for an assignment pops only the queue it names, and nothing if
        that queue is no longer its own; any other client pops every queue of the topic. Every
        client pops every queue of a priority topic, the highest priority first."""
        count = topic.queue_count
        if topic.message_type is MessageType.PRIORITY:  # consumed as one, highest first
            return list(range(count - 1, -1, -1))
        assigned = self._engine.groups.members.assigned(group, client_id, topic.name)
        if assigned is not None and queue_id is not None and queue_id >= 0:
            return [queue_id] if queue_id in assigned else []
        start = next(self._rotation)
        return [(start + i) % count for i in range(count)]

    async def _pop(self, consumer: str, topic: str, queues: list[int], selector: Filter,
                   invisible_ms: int, limit: int, max_attempts: int, fifo: bool,
                   withheld: Withheld | None) -> list[Delivery]:
        engine = self._engine
        found: list[Delivery] = []
        pending: list[tuple[Cursor, Callable[[], Popped]]] = []
        now = now_ms()
        for q in queues:
            if len(found) >= limit:
                break
            cursor = engine.cursors.open((consumer, topic, q), self._start_offset(consumer, topic, q))
            pop = functools.partial(pop_queue, engine.reader, cursor, consumer, topic, q, selector, now,
                                    invisible_ms, limit - len(found), max_attempts, fifo, withheld)
            try:
                popped = pop()
            except HistoryPending:  # the other queues first; the fetch goes on meanwhile
                pending.append((cursor, pop))
                continue
            found += await self._taken(consumer, cursor, popped)
        if pending and not found:  # only tiered history to hand out: wait for it (off the loop)
            cursor, pop = pending[0]
            found += await self._taken(consumer, cursor, await with_history(pop))
        return found

    async def _taken(self, consumer: str, cursor: Cursor, popped: Popped) -> list[Delivery]:
        """The deliveries of one pop, its messages past their attempts dead-lettered."""
        for message in popped.dead:
            await dead_letter(self._engine, consumer, message)
            cursor.ack(message.queue_offset)
        return popped.deliveries

    def _start_offset(self, consumer: str, topic: str, queue_id: int) -> int:
        """Where a consumer new to a queue starts: the earliest message for a group, the
        end for one client of a broadcast group."""
        earliest, end = self._engine.reader.range(topic, queue_id)
        return end if "@" in consumer else earliest

    def _in_flight(self, group: str, topic: str, receipt_handle: str) -> tuple[str, int, Cursor, int]:
        """(consumer, queue id, cursor, offset) of the live delivery ``receipt_handle`` names;
        InvalidReceiptHandle or ReceiptExpired if it names none."""
        engine = self._engine
        candidates = [group]
        if engine.groups.consume_mode(group) is ConsumeMode.BROADCAST:
            candidates = [k[0] for k in engine.cursors.cursors
                          if k[0].startswith(group + "@") and k[1] == topic]
        for consumer in candidates:
            try:
                handle = parse_handle(receipt_handle, consumer, topic)
            except InvalidReceiptHandle:
                continue
            cursor = engine.cursors.get((consumer, topic, handle.queue_id))
            if cursor is None:
                break
            return consumer, handle.queue_id, cursor, settle(cursor, handle)
        raise InvalidReceiptHandle("receipt handle does not name a message this group received "
                                   "from this topic; pass the handle exactly as it came with the message")

    def ack(self, group: str, topic: str, receipt_handle: str) -> None:
        """Settle a received message; ReceiptExpired if its invisible duration had ended."""
        consumer, queue_id, cursor, offset = self._in_flight(group, topic, receipt_handle)
        cursor.ack(offset)
        if self._engine.tracer.on:
            self._engine.tracer.acked(consumer, topic, queue_id, offset)
        self._unblocked(group, topic, cursor)

    def _unblocked(self, group: str, topic: str, cursor: Cursor) -> None:
        """A FIFO group's queue with nothing left in flight may hand out its next messages:
        wake the group's long polls."""
        if not cursor.inflight and self._engine.groups.is_fifo(group):
            self._engine.signals.notify(topic)

    def change_invisible(self, group: str, topic: str, receipt_handle: str, invisible_ms: int) -> str:
        """Hide a received message for ``invisible_ms`` from now; return its new receipt handle."""
        consumer, queue_id, cursor, offset = self._in_flight(group, topic, receipt_handle)
        flight = cursor.extend(offset, now_ms(), invisible_ms)
        if self._engine.tracer.on:
            self._engine.tracer.retried(consumer, topic, queue_id, offset, flight.attempt,
                                        f"invisible time changed to {invisible_ms} ms")
        self._engine.signals.notify(topic)  # long polls recompute when the next redelivery is due
        return make_handle(consumer, topic, queue_id, offset, flight.version)

    async def forward_to_dead_letter(self, group: str, topic: str, receipt_handle: str) -> None:
        """Move a received message to the group's dead-letter topic and settle it."""
        consumer, queue_id, cursor, offset = self._in_flight(group, topic, receipt_handle)
        message = self._engine.reader.read_one(topic, queue_id, offset)
        if message is not None:
            attempt = cursor.inflight[offset].attempt
            await dead_letter(self._engine, consumer, dataclasses.replace(message, attempt=attempt))
        cursor.ack(offset)
        self._unblocked(group, topic, cursor)
