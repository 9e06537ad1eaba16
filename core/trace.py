"""Per-message trace: what happened to a message after it was stored, and when.

With ``core.message_trace`` on, consumption paths report events (a message delivered to a
group's client, acked, retried, dead-lettered) to the ``Tracer``, which appends each as a
record of the internal topic ``%SYS%trace`` (one queue) keyed by the message's topic and id,
so the store's key index finds a message's events without a scan. The message's own record is
its "stored" event. Records age out with the store's retention like any other. Producers choose
ids, so another topic may hold a message with the same id: the topic in the key keeps its
events apart from this one's.

Record: body = JSON ``{"event", "group", "client", "attempt", "detail"}``, ``born_ts`` = the
event's time in ms, key = ``trace_key(topic, msg_id)`` of the traced message (its home topic,
the one it was sent to, whichever queue it was read from).

The hot path pays one attribute check when tracing is off (callers test ``Tracer.on``) and an
append to a list when it is on: one background task appends the buffer every
``FLUSH_INTERVAL_S`` or ``FLUSH_EVENTS`` events, and a buffer of ``MAX_BUFFERED`` events drops
further ones (counted, logged once per flush). Acks and retries name a message by its queue
offset; the tracer remembers the ids of recent deliveries to name them (``MAX_REMEMBERED``,
oldest forgotten first), and reads the message only for a delivery it has forgotten.

Runs on the event loop; not thread-safe.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from store.api import Message, Store

from .clock import now_ms
from .consume import Reader
from .errors import SluiceError
from .model import INTERNAL_PREFIX, Delivery
from .produce import Producer
from .waiting import wait_set

log = logging.getLogger(__name__)

TRACE_TOPIC = f"{INTERNAL_PREFIX}trace"
FLUSH_INTERVAL_S = 0.1
FLUSH_EVENTS = 512
MAX_BUFFERED = 65_536
MAX_REMEMBERED = 65_536
MAX_EVENTS = 1000
"""The most events a trace answers with: the newest ones (a message may have millions)."""

DELIVERED = "delivered"
ACKED = "acked"
RETRIED = "retried"
DEAD_LETTERED = "dead_lettered"
REJECTED = "rejected"
PUSHED = "pushed"
PUSH_FAILED = "push_failed"
PUSH_EVENTS = (PUSHED, PUSH_FAILED, DEAD_LETTERED)
"""What a push subscription reports of a message (``pushed``)."""

Place = tuple[str, str, int, int]
"""(consumer, topic, queue id, offset): one consumer's delivery of one message."""


def trace_key(topic: str, msg_id: str) -> str:
    """The key of the trace records of message ``msg_id`` sent to ``topic``."""
    return f"{topic}\0{msg_id}"


@dataclass(frozen=True, slots=True)
class TraceEvent:
    """One step of a message's path. ``detail``: why it was retried, or the dead-letter topic."""

    time_ms: int
    event: str
    group: str = ""
    client: str = ""
    attempt: int = 0
    detail: str = ""


@dataclass(frozen=True)
class MessageTrace:
    """A stored message and its events, oldest first; ``truncated``: older events were left out
    (more than ``MAX_EVENTS``)."""

    message: Delivery
    events: list[TraceEvent]
    truncated: bool
    same_id: tuple[Delivery, ...] = ()
    """Other messages with the same id that the asker may read (ids are chosen by producers),
    newest first: name one's topic to trace it."""


class Tracer:
    """Buffers trace events and appends them to the log in batches."""

    def __init__(self, store: Store, *, on: bool) -> None:
        self.on = on
        """Whether events are recorded; callers check it before reporting one."""
        self._store = store
        self._producer: Producer
        self._reader: Reader
        self._buffer: list[Message] = []
        self._remembered: dict[Place, tuple[str, str, str]] = {}
        """Place -> (``trace_key`` of the message, group, client) of recent deliveries, oldest
        first."""
        self._requeued: set[Place] = set()
        """Places handed back to be delivered again at once: their next delivery follows no
        timeout."""
        self._wake = asyncio.Event()
        self._full = asyncio.Event()
        self._task: asyncio.Task | None = None
        self.dropped = 0
        """Events dropped since start (buffer full, or the store refused their append)."""
        self._dropped_logged = 0

    def start(self, producer: Producer, reader: Reader) -> None:
        """Start the background task that appends the buffer (only when tracing is on)."""
        self._producer, self._reader = producer, reader
        if self.on:
            self._task = asyncio.create_task(self._run())

    async def close(self) -> None:
        """Stop the task and append what is buffered."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self.flush()

    # --- events (callers check ``on`` first) ---

    def delivered(self, consumer: str, client: str, deliveries: Sequence[Delivery],
                  group: str = "") -> None:
        """``consumer`` (a group, ``group@client`` or a named queue) handed ``deliveries`` to
        ``client``; a delivery after the first is also a retry (its invisible time ended).
        ``group``: the name to show (default: the group ``consumer`` names)."""
        now = now_ms()
        group = group or consumer.partition("@")[0]
        remembered = self._remembered
        for d in deliveries:
            place = (consumer, d.topic, d.queue_id, d.queue_offset)
            key = trace_key(d.home_topic or d.topic, d.msg_id)
            remembered.pop(place, None)
            remembered[place] = (key, group, client)
            if d.attempt > 1 and not self._was_requeued(place):
                self._add(key, now, RETRIED, group, client, d.attempt, "invisible time ended")
            self._add(key, now, DELIVERED, group, client, d.attempt)
        while len(remembered) > MAX_REMEMBERED:
            del remembered[next(iter(remembered))]

    def acked(self, consumer: str, topic: str, queue_id: int, offset: int) -> None:
        """The delivery of ``consumer`` at ``offset`` of the queue was acked."""
        self._settled(consumer, topic, queue_id, offset, ACKED, 0, "")

    def requeued(self, consumer: str, topic: str, queue_id: int, offset: int) -> None:
        """The delivery at ``offset`` was handed back to be delivered again at once."""
        place = (consumer, topic, queue_id, offset)
        if len(self._requeued) >= MAX_REMEMBERED:
            self._requeued.clear()
        self._requeued.add(place)
        self._settled(consumer, topic, queue_id, offset, RETRIED, 0, "requeued")

    def _was_requeued(self, place: Place) -> bool:
        if place in self._requeued:
            self._requeued.discard(place)
            return True
        return False

    def rejected(self, consumer: str, topic: str, queue_id: int, offset: int) -> None:
        """The delivery at ``offset`` was rejected without requeue (an AMQP reject or nack)."""
        self._settled(consumer, topic, queue_id, offset, REJECTED, 0, "")

    def retried(self, consumer: str, topic: str, queue_id: int, offset: int, attempt: int,
                why: str) -> None:
        """The delivery at ``offset`` will be handed out again when its new invisible time ends
        (a nack, or a consumer asking for more time); ``why`` says which."""
        self._settled(consumer, topic, queue_id, offset, RETRIED, attempt, why)

    def dead_lettered(self, consumer: str, message: Delivery, dead_letter_topic: str) -> None:
        """``message`` went to ``dead_letter_topic`` after ``message.attempt`` deliveries."""
        group, _, client = consumer.partition("@")
        remembered = self._remembered.pop((consumer, message.topic, message.queue_id,
                                           message.queue_offset), None)
        if not client and remembered is not None:
            client = remembered[2]
        self._add(trace_key(message.home_topic or message.topic, message.msg_id), now_ms(),
                  DEAD_LETTERED, group, client, message.attempt, dead_letter_topic)

    def pushed(self, group: str, message: Delivery, event: str, detail: str) -> None:
        """A push subscription's step with ``message``: one of ``PUSH_EVENTS``; ``detail``
        names the sink's answer, the failure, or the dead-letter topic."""
        self._add(trace_key(message.home_topic or message.topic, message.msg_id), now_ms(),
                  event, group, "push", message.attempt, detail)

    def _settled(self, consumer: str, topic: str, queue_id: int, offset: int, event: str,
                 attempt: int, detail: str) -> None:
        place = (consumer, topic, queue_id, offset)
        found = self._remembered.get(place) if event == RETRIED else self._remembered.pop(place, None)
        if found is None:
            try:
                message = self._reader.read_one(topic, queue_id, offset)
            except SluiceError:  # corrupt or unreadable: logged by the reader; not traced
                message = None
            if message is None:
                self.dropped += 1
                return
            found = (trace_key(message.home_topic or message.topic, message.msg_id),
                     consumer.partition("@")[0], "")
        self._add(found[0], now_ms(), event, found[1], found[2], attempt, detail)

    def _add(self, key: str, time_ms: int, event: str, group: str, client: str, attempt: int,
             detail: str = "") -> None:
        """Buffer an event of the message whose ``trace_key`` is ``key``."""
        buffered = len(self._buffer)
        if buffered >= MAX_BUFFERED:
            self.dropped += 1
            return
        body = json.dumps({"event": event, "group": group, "client": client, "attempt": attempt,
                           "detail": detail}, separators=(",", ":")).encode()
        self._buffer.append(Message(TRACE_TOPIC, body, 0, keys=(key,), born_ts=time_ms))
        if buffered == 0:
            self._wake.set()
        elif buffered + 1 >= FLUSH_EVENTS:
            self._full.set()

    # --- appending ---

    async def flush(self) -> None:
        """Append every buffered event now; return once stored (durable under ``sync``)."""
        batch, self._buffer = self._buffer, []
        if not batch:
            return
        try:
            await self._producer.append_internal(batch)
        except Exception as error:  # noqa: BLE001 - a full disk must not stop consumption
            self.dropped += len(batch)
            log.debug("trace events not stored: %s", error)

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            if len(self._buffer) < FLUSH_EVENTS:
                await wait_set(self._full, FLUSH_INTERVAL_S)
            self._wake.clear()
            self._full.clear()
            await self.flush()
            if self.dropped != self._dropped_logged:
                log.warning("%d message trace events dropped (buffer full or store failing); "
                            "%d since start", self.dropped - self._dropped_logged, self.dropped)
                self._dropped_logged = self.dropped

    # --- reading ---

    async def trace(self, message: Delivery, same_id: Sequence[Delivery] = ()) -> MessageTrace:
        """``message``'s events so far (buffered ones included), oldest first, at most
        ``MAX_EVENTS``: the newest ones. ``message`` was read by id (``topic`` is where it was
        sent); ``same_id``: other messages with its id, to list beside it."""
        await self.flush()
        found = await self._reader.history.run(functools.partial(  # tiered events: off the loop
            self._store.lookup_key, TRACE_TOPIC, trace_key(message.topic, message.msg_id), MAX_EVENTS + 1))
        events = [_event(record.born_ts, record.body) for record in reversed(found[:MAX_EVENTS])]
        events.sort(key=lambda e: e.time_ms)  # stable: events of one millisecond keep their order
        return MessageTrace(message, events, len(found) > MAX_EVENTS, tuple(same_id))


def _event(time_ms: int, body: bytes) -> TraceEvent:
    """The event a trace record holds."""
    fields = json.loads(body)
    return TraceEvent(time_ms, fields["event"], fields["group"], fields["client"],
                      fields["attempt"], fields["detail"])
