"""Consumer positions: one cursor per (consumer, topic, queue), and their periodic persistence.

A cursor serves both consumption models. Queue-level consumers move ``committed`` directly.
Pop (message-level) consumers take messages from ``next``; each delivered message is in flight
until acked or its invisible deadline passes; ``committed`` is the lowest offset not yet acked,
and offsets acked above it are remembered so a restart redelivers only what was never acked.

Cursors are saved to ``offsets.json`` in the data directory by a durable replace, every commit
interval and at shutdown: after a crash, at most one interval's acks are redelivered. With
offsets kept in the log instead (a cluster), ``changed_consumers`` gives each consumer's cursors
that changed since they were last stored, and ``load_consumer`` takes them back.

Runs on the event loop; not thread-safe.
"""

from __future__ import annotations

import heapq
import json
import os
import threading
from dataclasses import dataclass, field

from store import replace_file

FILE_NAME = "offsets.json"
_HEAP_SLACK = 1024
FORMAT_VERSION = 1


@dataclass(slots=True)
class InFlight:
    """A delivered, unacked message."""

    deadline_ms: int
    attempt: int
    version: int


@dataclass(slots=True)
class Cursor:
    """Where one consumer stands in one queue."""

    committed: int
    next: int
    acked: set[int] = field(default_factory=set)
    """Offsets in [committed, next) acked out of order."""
    inflight: dict[int, InFlight] = field(default_factory=dict)
    attempts: dict[int, int] = field(default_factory=dict)
    """Delivery attempts of offsets in [committed, next) that are neither acked nor in flight
    (known from before a restart)."""
    expiries: list[tuple[int, int, int]] = field(default_factory=list)
    """Heap of (deadline_ms, offset, version) of in-flight messages."""
    version: int = 0

    def deliver(self, offset: int, now_ms: int, invisible_ms: int) -> InFlight:
        """Mark ``offset`` delivered (again) with a new deadline; return its flight."""
        previous = self.inflight.get(offset)
        attempt = (previous.attempt if previous else self.attempts.pop(offset, 0)) + 1
        self.version += 1
        flight = InFlight(now_ms + invisible_ms, attempt, self.version)
        self.inflight[offset] = flight
        heapq.heappush(self.expiries, (flight.deadline_ms, offset, flight.version))
        if offset >= self.next:
            self.next = offset + 1
        return flight

    def extend(self, offset: int, now_ms: int, invisible_ms: int) -> InFlight:
        """Give an in-flight message a new deadline (and a new version) without a new attempt."""
        flight = self.inflight[offset]
        self.version += 1
        flight.deadline_ms, flight.version = now_ms + invisible_ms, self.version
        heapq.heappush(self.expiries, (flight.deadline_ms, offset, flight.version))
        return flight

    def ack(self, offset: int) -> None:
        """Settle ``offset``: it will not be delivered again."""
        self.inflight.pop(offset, None)
        self.attempts.pop(offset, None)
        if len(self.expiries) > 2 * len(self.inflight) + _HEAP_SLACK:
            self._rebuild_expiries()
        if offset < self.committed:
            return
        self.acked.add(offset)
        while self.committed in self.acked:
            self.acked.discard(self.committed)
            self.committed += 1

    def delivered_below(self, offset: int) -> None:
        """Count every offset in [committed, ``offset``) neither acked nor in flight as
        delivered once (known from before a restart), so its next delivery is a redelivery."""
        for o in range(self.committed, offset):
            if o not in self.acked and o not in self.inflight:
                self.attempts.setdefault(o, 1)

    def _rebuild_expiries(self) -> None:
        """Drop deadlines of settled or superseded flights, so the heap stays proportional to
        what is in flight even with long invisible durations."""
        self.expiries = [(f.deadline_ms, o, f.version) for o, f in self.inflight.items()]
        heapq.heapify(self.expiries)

    def skip_to(self, offset: int) -> None:
        """Settle everything below ``offset`` without delivering it."""
        if offset <= self.committed:
            return
        self.committed = offset
        self.next = max(self.next, offset)
        self.acked = {o for o in self.acked if o >= offset}
        self.inflight = {o: f for o, f in self.inflight.items() if o >= offset}
        self.attempts = {o: a for o, a in self.attempts.items() if o >= offset}
        while self.committed in self.acked:
            self.acked.discard(self.committed)
            self.committed += 1

    def reset(self, offset: int) -> None:
        """Move the position to ``offset`` (either way), forgetting every flight."""
        self.committed = self.next = offset
        self.acked.clear()
        self.inflight.clear()
        self.attempts.clear()
        self.expiries.clear()

    def expired(self, now_ms: int, limit: int) -> list[int]:
        """Up to ``limit`` offsets whose invisible deadline has passed, oldest deadline first."""
        due: list[int] = []
        heap = self.expiries
        while heap and heap[0][0] <= now_ms and len(due) < limit:
            _, offset, version = heapq.heappop(heap)
            flight = self.inflight.get(offset)
            if flight is not None and flight.version == version:
                due.append(offset)
        return due

    def visible(self, now_ms: int) -> int:
        """How many in-flight messages are visible again at ``now_ms`` (their deadline passed,
        or they were released): a walk of the due part of the deadline heap only."""
        heap, count = self.expiries, 0
        stack = [0] if heap else []
        while stack:
            index = stack.pop()
            deadline, offset, version = heap[index]
            if deadline > now_ms:
                continue  # and so are all below it
            flight = self.inflight.get(offset)
            if flight is not None and flight.version == version:
                count += 1
            stack += [child for child in (2 * index + 1, 2 * index + 2) if child < len(heap)]
        return count

    def next_deadline(self) -> int | None:
        """The earliest live invisible deadline, if any."""
        heap = self.expiries
        while heap:
            _, offset, version = heap[0]
            flight = self.inflight.get(offset)
            if flight is not None and flight.version == version:
                return heap[0][0]
            heapq.heappop(heap)
        return None

    def to_json(self) -> list:
        """What survives a restart: the position, out-of-order acks and attempt counts."""
        attempts = dict(self.attempts)
        attempts.update((offset, flight.attempt) for offset, flight in self.inflight.items())
        return [self.committed, sorted(self.acked), sorted(attempts.items())]

    @classmethod
    def from_json(cls, data: list) -> Cursor:
        committed, acked, attempts = data
        return cls(committed=committed, next=committed, acked=set(acked),
                   attempts={int(o): a for o, a in attempts})


CursorKey = tuple[str, str, int]
"""(consumer, topic, queue_id); the consumer is a group, or ``group@client`` for broadcast."""


class CursorBook:
    """Every cursor, loaded from and saved to the data directory."""

    def __init__(self, data_dir: str, from_file: bool = True) -> None:
        """``from_file``: load ``offsets.json`` (False: the offsets live in the log)."""
        self.path = os.path.join(data_dir, FILE_NAME)
        self.cursors: dict[CursorKey, Cursor] = {}
        self._write_lock = threading.Lock()
        self._taken = 0    # snapshots taken (on the loop)
        self._written = 0  # newest snapshot written (under the write lock)
        self._stored: dict[str, bytes] = {}
        """Consumer -> its cursors as last stored in the log."""
        if from_file:
            self._load()

    def _load(self) -> None:
        try:
            with open(self.path, encoding="utf-8") as file:
                data = json.load(file)
        except FileNotFoundError:
            return
        for consumer, topics in data["consumers"].items():
            for topic, queues in topics.items():
                for queue_id, cursor in queues.items():
                    self.cursors[(consumer, topic, int(queue_id))] = Cursor.from_json(cursor)

    def load_consumer(self, consumer: str, data: bytes) -> None:
        """Take ``consumer``'s cursors as stored in the log (``changed_consumers``'s value)."""
        self._stored[consumer] = data
        for topic, queues in json.loads(data).items():
            for queue_id, cursor in queues.items():
                self.cursors[(consumer, topic, int(queue_id))] = Cursor.from_json(cursor)

    def changed_consumers(self) -> dict[str, bytes]:
        """Consumer -> its cursors serialised, for each consumer whose cursors changed since
        ``stored`` was last told of them; ``b""`` for a consumer that is gone."""
        current: dict[str, dict[str, dict[str, list]]] = {}
        for (consumer, topic, queue_id), cursor in self.cursors.items():
            current.setdefault(consumer, {}).setdefault(topic, {})[str(queue_id)] = cursor.to_json()
        changed = {consumer: b"" for consumer in self._stored if consumer not in current}
        for consumer, topics in current.items():
            data = json.dumps(topics, separators=(",", ":"), sort_keys=True).encode()
            if self._stored.get(consumer) != data:
                changed[consumer] = data
        return changed

    def stored(self, consumer: str, data: bytes) -> None:
        """``consumer``'s cursors are in the log as ``data`` (``b""``: gone)."""
        if data:
            self._stored[consumer] = data
        else:
            self._stored.pop(consumer, None)

    def get(self, key: CursorKey) -> Cursor | None:
        """The cursor at ``key``, if one exists."""
        return self.cursors.get(key)

    def open(self, key: CursorKey, start: int) -> Cursor:
        """The cursor at ``key``, created at ``start`` if new."""
        cursor = self.cursors.get(key)
        if cursor is None:
            cursor = self.cursors[key] = Cursor(committed=start, next=start)
        return cursor

    def drop_consumer(self, consumer: str) -> None:
        """Forget every cursor of ``consumer`` (a deleted group)."""
        for key in [key for key in self.cursors if key[0] == consumer or key[0].startswith(consumer + "@")]:
            del self.cursors[key]

    def snapshot(self) -> tuple[int, bytes]:
        """The serialised book and its sequence number (taken on the loop, written elsewhere)."""
        consumers: dict[str, dict[str, dict[str, list]]] = {}
        for (consumer, topic, queue_id), cursor in self.cursors.items():
            consumers.setdefault(consumer, {}).setdefault(topic, {})[str(queue_id)] = cursor.to_json()
        self._taken += 1
        return self._taken, json.dumps({"version": FORMAT_VERSION, "consumers": consumers},
                                       separators=(",", ":")).encode()

    def write(self, snapshot: tuple[int, bytes]) -> None:
        """Durably replace the offsets file with ``snapshot`` unless a newer one was written.

        Blocking: run it off the loop. Thread-safe: writes are serialised, newest wins."""
        sequence, data = snapshot
        with self._write_lock:
            if sequence > self._written:
                replace_file(self.path, data)
                self._written = sequence
