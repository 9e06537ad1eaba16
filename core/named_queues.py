"""Named queues for adapters: queues fed by subject fan-out instead of by producers.

An adapter binds subject filters (in the syntax the composition root gave core) to a named
queue (queue id 0), and every message whose subject matches is indexed into it when appended,
stored once. MQTT's persistent sessions and shared subscriptions read such queues, and AMQP
queues will: ``bind``/``unbind``, message-level ``pop`` with ``settle``/``release`` for queues
shared by several consumers, and ``position``/``ack`` for a queue with one consumer. Live
listeners (``add_listener``) get matching messages in memory, nothing stored.

Bindings live in memory: adapters restore theirs before serving. The adapter authorizes what it
binds and delivers; nothing here is checked against a principal. Runs on the event loop; not
thread-safe.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

from .acl import Withheld
from .clock import now_ms
from .consume import MAX_IN_FLIGHT_SPAN, pop_queue
from .delivered_marks import IN_LOG_HOLD_S, DeliveredMarks, MarksInLog
from .engine import Engine
from .errors import CorruptMessage
from .fanout import Listener, QueueTarget
from .filters import parse_filter
from .model import Delivery

_EVERY_TAG = parse_filter("*")
_NO_DEAD_LETTERS = 1 << 30
"""Attempts after which a popped message would be dead-lettered: never, for named queues."""


class NamedQueues:
    """Bindings, reads and consumption state of named queues."""

    def __init__(self, engine: Engine, data_dir: str) -> None:
        self._fanout = engine.fanout
        self._cursors = engine.cursors
        self._signals = engine.signals
        self._engine = engine
        self.delivered: dict[str, int] = {}
        """Messages popped per queue since start (redeliveries included)."""
        self.settled: dict[str, int] = {}
        """Popped messages settled per queue since start (acked, or rejected without requeue)."""
        self._marks = (DeliveredMarks(MarksInLog(engine.store), IN_LOG_HOLD_S) if engine.config.replicated_state
                       else DeliveredMarks(data_dir))
        self.tracer = engine.tracer
        """The message tracer (``core.trace``): adapters report there, after checking its
        ``on``, whom they hand a popped or read message and how its consumer settles it."""

    def flush_marks(self) -> None:
        """Write the delivered marks taken by ``pop`` since the last flush (one write)."""
        self._marks.flush()

    def close(self) -> None:
        """Flush the delivered marks and close their file."""
        self._marks.close()

    # --- what feeds a queue ---

    def bind(self, subject_filter: str, queue: str, *, multi_anywhere: bool = False) -> bool:
        """Index every message whose subject matches into ``queue`` from now on; False if it
        was bound already. InvalidArgument for a malformed filter; ``multi_anywhere`` accepts
        the multi-level wildcard at any level (AMQP's ``#``). A message routed here and also
        named in its ``also_into`` is indexed once."""
        return self._fanout.bind(subject_filter, QueueTarget(queue),
                                 multi_anywhere=multi_anywhere)

    def unbind(self, subject_filter: str, queue: str) -> bool:
        """Undo ``bind``; False if it was not bound."""
        return self._fanout.unbind(subject_filter, QueueTarget(queue))

    def add_listener(self, subject_filter: str, listener: Listener) -> bool:
        """Hand ``listener`` every message whose subject matches, once deliverable."""
        return self._fanout.bind(subject_filter, listener)

    def remove_listener(self, subject_filter: str, listener: Listener) -> bool:
        """Undo ``add_listener``."""
        return self._fanout.unbind(subject_filter, listener)

    # --- reading ---

    def bounds(self, queue: str) -> tuple[int, int]:
        """(earliest, deliverable end) of ``queue``."""
        return self._engine.reader.range(queue, 0)

    def read(self, queue: str, offset: int, max_messages: int) -> tuple[list[Delivery], int]:
        """Up to ``max_messages`` of ``queue`` from ``offset``: (messages, next offset).
        Deliveries carry the queue's own offsets; a start below the earliest retained message
        skips ahead, and so does a corrupt message (logged, acked: it is never delivered)."""
        reader = self._engine.reader
        earliest, end = reader.range(queue, 0)
        offset = max(offset, earliest)
        while True:
            try:
                messages = reader.read(queue, 0, offset, min(max_messages, end - offset))
            except CorruptMessage as corrupt:  # logged by the reader; its consumer goes on
                self.ack(queue, corrupt.offset)
                offset = corrupt.offset + 1
                continue
            return messages, (messages[-1].queue_offset + 1 if messages else offset)

    def offset_at(self, queue: str, timestamp_ms: int) -> int:
        """The first offset of ``queue`` stored at or after ``timestamp_ms`` (its deliverable
        end if none): a binary search, one message read per step."""
        low, high = self.bounds(queue)
        while low < high:
            middle = (low + high) // 2
            found, _ = self.read(queue, middle, 1)
            if found and found[0].queue_offset == middle and found[0].store_ts >= timestamp_ms:
                high = middle
            else:
                low = middle + 1
        return low

    def signal(self, queue: str) -> asyncio.Future[None]:
        """A future resolved when ``queue`` next gets deliverable messages (or a popped message
        of it becomes visible again through ``release``)."""
        return self._signals.future(queue)

    def watch(self, queue: str) -> asyncio.Future[None]:
        """``signal`` for a watcher that may stop watching: cancelling the future drops it at
        once, so a queue that is gone keeps nothing waiting on it."""
        return self._signals.future_any((queue,))

    def signal_any(self, queues: tuple[str, ...]) -> asyncio.Future[None]:
        """``signal`` for whichever of ``queues`` (the levels of a priority queue) comes first."""
        if len(queues) == 1:
            return self._signals.future(queues[0])
        return self._signals.future_any(queues)

    # --- several consumers: pop, settle, release ---

    def pop(self, queue: str, max_messages: int, invisible_ms: int, *,
            mark: bool = False, withheld: Withheld | None = None) -> list[Delivery]:
        """Message-level consumption of ``queue`` shared by several consumers: each message goes
        to one of them and comes back after ``invisible_ms`` unless settled. A corrupt message
        is skipped (logged, settled: it is never delivered), and so is one ``withheld`` from
        the reader (an access rule denies it its subject: dropped from the queue).

        With ``mark``, what was popped is recorded as delivered (``core.delivered_marks``);
        once ``flush_marks`` has run (before the deliveries go out), it comes back after a
        crash as a redelivery (``Delivery.attempt`` > 1) rather than as new."""
        reader = self._engine.reader
        cursor = self._cursors.open((queue, queue, 0), reader.range(queue, 0)[0])
        restored = self._marks.restored(queue)
        if restored is not None:
            cursor.delivered_below(min(restored, cursor.committed + MAX_IN_FLIGHT_SPAN))
        while True:
            try:
                popped = pop_queue(reader, cursor, queue, queue, 0, _EVERY_TAG, now_ms(),
                                   invisible_ms, max_messages, _NO_DEAD_LETTERS,
                                   withheld=withheld).deliveries
            except CorruptMessage as corrupt:  # logged by the reader; never delivered
                cursor.next = max(cursor.next, corrupt.offset + 1)
                cursor.ack(corrupt.offset)
                continue
            if popped:
                self.delivered[queue] = self.delivered.get(queue, 0) + len(popped)
                if mark:
                    self._marks.mark(queue, cursor.next)
            return popped

    def pop_first(self, queues: tuple[str, ...], max_messages: int, invisible_ms: int, *,
                  mark: bool = False, withheld: Withheld | None = None) -> list[Delivery]:
        """``pop`` from each of ``queues`` in turn (a priority queue's levels, highest first)
        until ``max_messages`` are taken; levels with nothing to take are passed over."""
        popped: list[Delivery] = []
        for queue in self.with_work(queues):
            if len(popped) >= max_messages:
                break
            popped += self.pop(queue, max_messages - len(popped), invisible_ms, mark=mark,
                               withheld=withheld)
        return popped

    def with_work(self, queues: tuple[str, ...]) -> Iterator[str]:
        """Those of ``queues`` a pop could take from now, in order: an entry never popped, or
        a popped one due again (cheap: nothing is read, no consumption state is created)."""
        if len(queues) == 1:
            yield queues[0]
            return
        now = now_ms()
        for queue in queues:
            earliest, end = self._engine.reader.range(queue, 0)
            cursor = self._cursors.get((queue, queue, 0))
            if cursor is None:
                if end > earliest:
                    yield queue
                continue
            deadline = cursor.next_deadline()
            if cursor.next < end or (deadline is not None and deadline <= now):
                yield queue

    def peek(self, queue: str, limit: int) -> list[Delivery]:
        """Up to ``limit`` messages of ``queue`` never popped nor settled, oldest first, left
        where they are (a queue's head, to expire or measure it)."""
        cursor = self._cursors.get((queue, queue, 0))
        start = self.bounds(queue)[0] if cursor is None else cursor.next
        acked = frozenset() if cursor is None else cursor.acked
        out: list[Delivery] = []
        while len(out) < limit:
            messages, start = self.read(queue, start, limit - len(out) + len(acked))
            if not messages:
                return out
            out.extend(m for m in messages if m.queue_offset not in acked)
        return out[:limit]

    def take(self, queue: str, offset: int, invisible_ms: int) -> None:
        """Hide the message at ``offset`` (the oldest one never popped, see ``peek``, or one
        ``returned``) as a pop would without handing it out; ``settle`` or ``release`` it
        afterwards."""
        cursor = self._cursors.open((queue, queue, 0), self.bounds(queue)[0])
        if offset >= cursor.next:
            cursor.deliver(offset, now_ms(), invisible_ms)
        elif offset in cursor.inflight:
            cursor.extend(offset, now_ms(), invisible_ms)

    def returned(self, queue: str, offset: int) -> bool:
        """Whether the message at ``offset`` was popped and released, and waits to be popped
        again."""
        cursor = self._cursors.get((queue, queue, 0))
        flight = None if cursor is None else cursor.inflight.get(offset)
        return flight is not None and flight.deadline_ms <= now_ms()

    def ready(self, queue: str) -> int:
        """About how many messages of ``queue`` wait to be popped: stored, neither settled nor
        popped and invisible (released ones count; cheap: from the consumption state, nothing
        is read)."""
        earliest, end = self._engine.reader.range(queue, 0)
        cursor = self._cursors.get((queue, queue, 0))
        if cursor is None:
            return end - earliest
        invisible = len(cursor.inflight) - cursor.visible(now_ms())
        return max(0, end - max(cursor.committed, earliest) - len(cursor.acked) - invisible)

    def next_redelivery_ms(self, queue: str) -> int | None:
        """When the earliest popped, unsettled message of ``queue`` becomes visible again."""
        cursor = self._cursors.get((queue, queue, 0))
        return None if cursor is None else cursor.next_deadline()

    def attempts(self, queue: str, offset: int) -> int:
        """How often the popped, unsettled message at ``offset`` of ``queue`` was handed out
        (0 if it is not popped)."""
        cursor = self._cursors.get((queue, queue, 0))
        flight = None if cursor is None else cursor.inflight.get(offset)
        return 0 if flight is None else flight.attempt

    def settle(self, queue: str, offset: int) -> None:
        """The popped message at ``offset`` of ``queue`` is done."""
        cursor = self._cursors.get((queue, queue, 0))
        if cursor is not None and offset in cursor.inflight:
            cursor.ack(offset)
            self.settled[queue] = self.settled.get(queue, 0) + 1

    def unsettled(self, queue: str) -> int:
        """Popped messages of ``queue`` neither settled nor released."""
        cursor = self._cursors.get((queue, queue, 0))
        if cursor is None:
            return 0
        now = now_ms()
        return sum(1 for flight in cursor.inflight.values() if flight.deadline_ms > now)

    def purge(self, queue: str) -> int:
        """Settle every message of ``queue`` waiting to be popped (released ones included); how
        many. Popped, unsettled messages stay. Nothing is deleted from the log: the queue's
        consumption state moves past the messages, saved with the offsets."""
        earliest, end = self._engine.reader.range(queue, 0)
        cursor = self._cursors.open((queue, queue, 0), earliest)
        if cursor.next < earliest:
            cursor.skip_to(earliest)
        now = now_ms()
        held = [offset for offset, flight in cursor.inflight.items() if flight.deadline_ms > now]
        purged = 0
        for offset in [o for o, f in cursor.inflight.items() if f.deadline_ms <= now]:
            cursor.ack(offset)
            purged += 1
        low = min(held, default=end)
        if low > cursor.committed:
            below = low - cursor.committed - sum(1 for o in cursor.acked if o < low)
            purged += below
            cursor.skip_to(low)
        top = min(end, low + MAX_IN_FLIGHT_SPAN)  # the farthest a pop may reach past ``low``
        for offset in range(max(low, cursor.committed), top):
            if offset not in cursor.inflight and offset not in cursor.acked:
                cursor.ack(offset)
                purged += 1
        cursor.next = max(cursor.next, top)
        return purged

    def release(self, queue: str, offset: int) -> None:
        """Make the popped message at ``offset`` of ``queue`` visible again now (its consumer
        left), and wake those waiting on the queue. Released messages are popped first, in
        queue order whatever order they were released in (as RabbitMQ requeues a message at
        its place): their deadline is 0, before any timed-out one's."""
        cursor = self._cursors.get((queue, queue, 0))
        if cursor is not None and offset in cursor.inflight:
            cursor.extend(offset, 0, 0)
            self._signals.notify(queue)

    # --- one consumer: position and ack ---

    def position(self, queue: str) -> tuple[int, frozenset[int]]:
        """Where the single consumer of ``queue`` stands: (first offset not yet acked, offsets
        above it acked out of order). A queue never acked starts at its earliest."""
        cursor = self._cursors.get((queue, queue, 0))
        if cursor is None:
            return self._engine.reader.range(queue, 0)[0], frozenset()
        return cursor.committed, frozenset(cursor.acked)

    def ack(self, queue: str, offset: int) -> None:
        """The single consumer of ``queue`` is done with ``offset`` (saved with the offsets
        every commit interval)."""
        self._cursors.open((queue, queue, 0), self._engine.reader.range(queue, 0)[0]).ack(offset)

    def forget(self, queue: str) -> None:
        """Drop the consumption state of ``queue`` (a session or group that ended)."""
        self._cursors.drop_consumer(queue)
        self.delivered.pop(queue, None)
        self.settled.pop(queue, None)
        self._marks.forget(queue)
