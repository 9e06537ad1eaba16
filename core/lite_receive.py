"""Pop consumption of lite topics: a client receives from the lite topics it subscribed to,
each in order (``core.lite``), and settles what it received by receipt handle.

A lite receipt handle names the lite topic besides the queue offset and the flight's version:
``L|<boot>|<queue>|<offset>|<version>|<check>|<lite topic>``. A message not settled within
its invisible duration is handed out again, to any client of the group subscribed to its lite
topic, up to the group's maximum attempts; then it is dead-lettered and the channel moves on.

No authorization here: ``Broker`` decides first. Runs on the event loop; not thread-safe.
"""

from __future__ import annotations

import functools
import itertools
import zlib
from collections.abc import Callable
from typing import NamedTuple

from store.api import StoredMessage

from .acl import Withheld
from .clock import now_ms
from .consume import BOOT_ID, consumer_check
from .dead_letter import dead_letter
from .engine import Engine
from .errors import InvalidReceiptHandle, ReceiptExpired
from .lite import Channel, Flight, LiteTopic
from .model import LITE_KEY_PREFIX, LITE_PROPERTY, Delivery, GroupConfig, TopicConfig

HANDLE_PREFIX = "L|"
LOOKUP_LIMIT = 1024
"""Messages of one lite topic one search of the key index returns; past this many waiting,
the lite topic's queue is read instead."""
SCAN_LIMIT = 100_000
"""Records of a queue one receive reads looking for a lite topic's next messages."""


def is_lite_handle(handle: str) -> bool:
    return handle.startswith(HANDLE_PREFIX)


class LiteReceiver:
    """Pops lite topics' messages for a group's clients and settles them."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._rotation = itertools.count()

    async def receive(self, group: GroupConfig, topic: TopicConfig, client_id: str, invisible_ms: int,
                      max_messages: int, wait_ms: int, still_allowed: Callable[[], None],
                      withheld_now: Callable[[], Withheld | None]) -> list[Delivery]:
        """Pop up to ``max_messages`` of the client's lite topics, waiting up to ``wait_ms``;
        each pass settles unseen what ``withheld_now()`` says the access rules deny the caller."""
        engine = self._engine
        deadline = now_ms() + min(max(0, wait_ms), engine.config.max_long_poll_ms)
        while True:
            found, wake = await self._pop(group, topic, client_id, invisible_ms, max_messages,
                                          withheld_now())
            now = now_ms()
            if found or now >= deadline or engine.closing or topic.name not in engine.topics:
                engine.count_out(topic.name, found)
                if engine.tracer.on:
                    engine.tracer.delivered(group.name, client_id, found)
                return found
            await engine.signals.wait((topic.name,), max(0.001, (min(deadline, wake) - now) / 1000))
            still_allowed()

    async def _pop(self, group: GroupConfig, topic: TopicConfig, client_id: str, invisible_ms: int,
                   limit: int, withheld: Withheld | None) -> tuple[list[Delivery], int]:
        """(what was popped, when an in-flight message of the client's lite topics falls due)."""
        lite = self._engine.lite
        names = lite.subscribed(group.name, topic.name, client_id)
        found: list[Delivery] = []
        wake = now_ms() + 60_000
        if not names:
            return found, wake
        start = next(self._rotation) % len(names)
        now = now_ms()
        for name in names[start:] + names[:start]:
            if len(found) >= limit:
                break
            state = lite.live.get((topic.name, name))
            if state is None:
                continue
            channel = lite.channel(group.name, topic.name, name, state)
            if channel.inflight:
                found += await self._redeliver(group, topic, name, channel, now, invisible_ms,
                                               withheld)
                if channel.inflight:
                    wake = min(wake, min(f.until_ms for f in channel.inflight.values()))
                continue
            found += self._next_batch(group.name, topic, name, state, channel, now, invisible_ms,
                                      limit - len(found), withheld)
        return found, wake

    def _next_batch(self, group: str, topic: TopicConfig, name: str, state: LiteTopic,
                    channel: Channel, now: int, invisible_ms: int, limit: int,
                    withheld: Withheld | None) -> list[Delivery]:
        """Hand out the lite topic's next messages after the channel's position. Those
        ``withheld`` from the caller are settled with their batch; a batch withheld whole is
        passed and the next one read."""
        while not 0 <= state.newest <= channel.done:
            waiting = self._waiting(topic, name, channel, limit)
            if not waiting:
                state.newest = max(state.newest, channel.done)
                break
            found = []
            for stored in waiting:
                delivery = self._delivery(group, topic.name, name, stored, 1, 0, now + invisible_ms)
                if withheld is None or not withheld(delivery):
                    channel.inflight[stored.queue_offset] = Flight(now + invisible_ms, 1, 0)
                    found.append(delivery)
            last = waiting[-1]
            channel.batch_end = (last.queue_offset, last.store_ts)
            if found:
                return found
            self._settle(group, topic.name, name, channel, last.queue_offset)
        return []

    def _waiting(self, topic: TopicConfig, name: str, channel: Channel, limit: int) -> list[StoredMessage]:
        """The lite topic's next messages after the channel's position, oldest first."""
        store, key = self._engine.store, LITE_KEY_PREFIX + name
        found = self._engine.reader.history.read(  # HistoryPending while tiered history is fetched
            ("key", topic.name, key, channel.done_ms), f"lite topic {name!r} of {topic.name!r}",
            functools.partial(store.lookup_key, topic.name, key, LOOKUP_LIMIT, since_ms=channel.done_ms))
        if len(found) >= LOOKUP_LIMIT:  # more may wait than one search returns
            return self._scan(topic, name, channel, limit)
        newer = [m for m in found
                 if m.queue_offset > channel.done and m.properties.get(LITE_PROPERTY) == name]
        newer.sort(key=lambda m: m.queue_offset)
        return newer[:limit]

    def _scan(self, topic: TopicConfig, name: str, channel: Channel, limit: int) -> list[StoredMessage]:
        """Read the lite topic's queue from the channel's position (a long backlog)."""
        reader = self._engine.reader
        queue = self._queue_of(topic, name)
        offset = max(channel.done + 1, reader.range(topic.name, queue)[0])
        end = min(reader.range(topic.name, queue)[1], offset + SCAN_LIMIT)
        out: list[StoredMessage] = []
        for batch in reader.chunks(topic.name, queue, offset, end, 256):
            out += [m for m in batch if m.properties.get(LITE_PROPERTY) == name]
            if len(out) >= limit:
                break
        return out[:limit]

    @staticmethod
    def _queue_of(topic: TopicConfig, name: str) -> int:
        return zlib.crc32(name.encode()) % topic.queue_count

    async def _redeliver(self, group: GroupConfig, topic: TopicConfig, name: str, channel: Channel,
                         now: int, invisible_ms: int, withheld: Withheld | None) -> list[Delivery]:
        """Hand out again the channel's messages whose invisible duration ended; dead-letter
        those past the group's attempts; settle those now ``withheld`` from the caller."""
        out = []
        queue = self._queue_of(topic, name)
        for offset in sorted(o for o, f in channel.inflight.items() if f.until_ms <= now):
            flight = channel.inflight[offset]
            stored = self._engine.reader.read_one(topic.name, queue, offset)
            if stored is None or (withheld is not None and withheld(self._delivery(
                    group.name, topic.name, name, stored, flight.attempt, 0, 0))):
                self._settle(group.name, topic.name, name, channel, offset)  # gone, or withheld
                continue
            if flight.attempt >= group.retry.max_attempts:
                delivery = self._delivery(group.name, topic.name, name, stored, flight.attempt, 0, 0)
                await dead_letter(self._engine, group.name, delivery)
                self._settle(group.name, topic.name, name, channel, offset)
                continue
            flight.attempt += 1
            flight.version += 1
            flight.until_ms = now + invisible_ms
            out.append(self._delivery(group.name, topic.name, name, stored, flight.attempt,
                                      flight.version, flight.until_ms))
        return out

    def _delivery(self, group: str, topic: str, name: str, stored, attempt: int, version: int,
                  until_ms: int) -> Delivery:
        properties = {k: v for k, v in stored.properties.items() if k != LITE_PROPERTY}
        keys = tuple(k for k in stored.keys if not k.startswith(LITE_KEY_PREFIX))
        return Delivery(topic, stored.queue_id, stored.queue_offset, stored.msg_id, stored.body,
                        stored.tag, keys, properties, stored.born_ts, stored.store_ts, attempt,
                        _handle(group, topic, name, stored.queue_id, stored.queue_offset, version),
                        until_ms, lite_topic=name)

    # --- settling ---

    def _in_flight(self, group: str, topic: str, handle: str) -> tuple[str, Channel, int, Flight, int]:
        """(lite topic, channel, offset, flight, queue) of the live delivery ``handle`` names."""
        parsed = parse_lite_handle(handle)
        if parsed.check != consumer_check(group, topic):
            raise InvalidReceiptHandle("receipt handle was issued for another consumer group or topic; "
                                       "ack with the group and topic that received the message")
        if parsed.boot != BOOT_ID:
            raise ReceiptExpired("receipt handle was issued before the broker restarted; the message "
                                 "will be delivered again")
        channel = self._engine.lite.channels.get((group, topic, parsed.lite_topic))
        flight = channel.inflight.get(parsed.offset) if channel else None
        if channel is None or flight is None or flight.version != parsed.version:
            raise ReceiptExpired("the message's invisible duration ended or it was settled already; "
                                 "it is delivered again if it was not settled")
        return parsed.lite_topic, channel, parsed.offset, flight, parsed.queue

    def _settle(self, group: str, topic: str, name: str, channel: Channel, offset: int) -> None:
        channel.inflight.pop(offset, None)
        if not channel.inflight:  # the batch is done: the channel moves on and may hand out more
            channel.done, channel.done_ms = max(channel.done, channel.batch_end[0]), channel.batch_end[1]
            self._engine.signals.notify(topic)

    def ack(self, group: str, topic: str, handle: str) -> None:
        """Settle a received lite message; ReceiptExpired if it was handed out again since."""
        name, channel, offset, _, queue = self._in_flight(group, topic, handle)
        self._settle(group, topic, name, channel, offset)
        if self._engine.tracer.on:
            self._engine.tracer.acked(group, topic, queue, offset)

    def change_invisible(self, group: str, topic: str, handle: str, invisible_ms: int) -> str:
        """Hide a received lite message for ``invisible_ms`` from now; its new handle."""
        name, _, offset, flight, queue = self._in_flight(group, topic, handle)
        flight.until_ms = now_ms() + invisible_ms
        flight.version += 1
        if self._engine.tracer.on:
            self._engine.tracer.retried(group, topic, queue, offset, flight.attempt,
                                        f"invisible time changed to {invisible_ms} ms")
        self._engine.signals.notify(topic)
        return _handle(group, topic, name, queue, offset, flight.version)

    async def forward_to_dead_letter(self, group: str, topic: str, handle: str) -> None:
        """Move a received lite message to the group's dead-letter topic and settle it."""
        name, channel, offset, flight, queue = self._in_flight(group, topic, handle)
        stored = self._engine.reader.read_one(topic, queue, offset)
        if stored is not None:
            await dead_letter(self._engine, group, self._delivery(group, topic, name, stored,
                                                                  flight.attempt, 0, 0))
        self._settle(group, topic, name, channel, offset)


class LiteHandle(NamedTuple):
    """A parsed lite receipt handle."""

    boot: str
    queue: int
    offset: int
    version: int
    check: int
    lite_topic: str


def parse_lite_handle(handle: str) -> LiteHandle:
    """The parts of a lite receipt handle; InvalidReceiptHandle when it is not one."""
    try:
        prefix, boot, queue, offset, version, check, name = handle.split("|", 6)
        parsed = LiteHandle(boot, int(queue), int(offset), int(version), int(check, 16), name)
    except ValueError:
        raise InvalidReceiptHandle(f"receipt handle {handle[:80]!r} is malformed; pass the handle "
                                   "exactly as it came with the message") from None
    if f"{prefix}|" != HANDLE_PREFIX or not name:
        raise InvalidReceiptHandle(f"receipt handle {handle[:80]!r} is not a lite topic's")
    return parsed


def _handle(group: str, topic: str, name: str, queue: int, offset: int, version: int) -> str:
    return (f"{HANDLE_PREFIX}{BOOT_ID}|{queue}|{offset}|{version}|"
            f"{consumer_check(group, topic):04x}|{name}")
