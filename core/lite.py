"""Lite topics: ordered channels inside one topic, by the million, costing index space only.

A topic of message type LITE takes only messages that name a lite topic. Such a message is
stored in its parent topic like any other, in the queue its lite topic hashes to (one lite
topic keeps its order), with the lite topic in property ``sluice.lite`` and in the key
``%LITE%<lite topic>``: the store's key index finds a lite topic's messages, so a lite topic
has no file, queue or task of its own.

A lite topic is created by its first message and deleted ``core.lite_topic_ttl_ms`` after its
last one. The registry of live lite topics is in memory (about 250 bytes each, and 280 more
per group consuming one, measured in ``tests/unit/core/test_lite_quotas.py``) and in the
compacted internal topic ``%SYS%lite.topics``: a record per lite topic (when it was created,
its last message, the user that created it) when created and whenever its last-message time
recorded there is a quarter of the TTL old, appended in the same batch as the message, so a
stored message's lite topic is never forgotten.

Quotas keep one tenant from taking every lite topic: a send creating more than
``core.max_lite_topics_per_topic`` live lite topics in one parent topic, or more than
``core.max_lite_topics_per_user`` created by one user, is refused (QuotaExceeded, native
``TOO_MANY_REQUESTS``, naming the quota), as is one beyond ``core.max_lite_topics`` in all.

Consumers subscribe to lite topics at run time, per client. A group consumes each lite topic
through a *channel*: the queue offset of the last message it handled and the messages it has in
flight. A channel hands out new messages only while none is in flight, so a lite topic is
consumed in order; its position is saved, as the offsets of other consumers are, to the
compacted internal topic ``%SYS%lite.positions``. The pop path is ``core.lite_receive``.

Runs on the event loop; not thread-safe.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from store.api import Store

from . import clock
from .errors import InvalidArgument, QuotaExceeded
from .model import INTERNAL_PREFIX, OutgoingMessage, SendResult, TopicConfig
from .produce import Producer
from .settings import CoreConfig
from .topics import Topics

log = logging.getLogger(__name__)

REGISTRY_TOPIC = f"{INTERNAL_PREFIX}lite.topics"
POSITIONS_TOPIC = f"{INTERNAL_PREFIX}lite.positions"
SUBSCRIPTION_QUOTA = 10_000
"""Lite topics one client may subscribe to."""
SUBSCRIPTION_TTL_MS = 120_000
"""A client's subscriptions are dropped when it has not synced them for this long (clients
sync every 30 s)."""

PARTIAL_ADD, PARTIAL_REMOVE, COMPLETE_ADD, COMPLETE_REMOVE = "add", "remove", "set", "clear"
"""How a subscription sync changes a client's lite topics: add or remove the names given,
replace them all with the names given, or remove them all."""


@dataclass(slots=True)
class LiteTopic:
    """A live lite topic."""

    created_ms: int
    """When its first message was sent: messages stored before belong to an expired one."""
    last_ms: int
    saved_ms: int
    """``last_ms`` as last recorded in the registry topic."""
    newest: int = -1
    """Queue offset of its newest message sent since the broker started (-1: not known)."""
    owner: str = ""
    """The user whose send created it (empty for lite topics recorded before owners were)."""


@dataclass(slots=True)
class Flight:
    """A message of a channel handed to a consumer and not settled."""

    until_ms: int
    attempt: int
    version: int


@dataclass(slots=True)
class Channel:
    """One group's consumption of one lite topic."""

    done: int = -1
    """Queue offset of the last message handled, in order (-1: none yet)."""
    done_ms: int = 0
    """Its store time: the key index is searched from there."""
    inflight: dict[int, Flight] = field(default_factory=dict)
    batch_end: tuple[int, int] = (-1, 0)
    """(offset, store time) of the last message handed out: ``done`` once all are settled."""
    saved: int = -1


@dataclass(slots=True)
class Subscribed:
    names: set[str]
    synced_ms: int


class LiteTopics:
    """The live lite topics, the channels consuming them, and clients' subscriptions."""

    def __init__(self, store: Store, producer: Producer, topics: Topics, config: CoreConfig) -> None:
        self._store = store
        self._producer = producer
        self._topics = topics
        self._config = config
        self.live: dict[tuple[str, str], LiteTopic] = {}
        """(parent topic, lite topic) -> its state."""
        self.per_topic: Counter[str] = Counter()
        """Live lite topics of each parent topic."""
        self.per_user: Counter[str] = Counter()
        """Live lite topics each user created."""
        self.channels: dict[tuple[str, str, str], Channel] = {}
        """(group, parent topic, lite topic) -> the group's channel."""
        self._subscriptions: dict[tuple[str, str, str], Subscribed] = {}
        """(group, parent topic, client id) -> the client's lite topics."""
        self._tasks: list[asyncio.Task] = []

    # --- start and close ---

    async def start(self) -> None:
        """Load the registry and the positions; start expiring and saving."""
        for name in (REGISTRY_TOPIC, POSITIONS_TOPIC):
            await self._topics.ensure(TopicConfig(name, queue_count=1, compacted=True))
        horizon = clock.now_ms() - self._config.lite_topic_ttl_ms
        registry, positions = await asyncio.to_thread(
            lambda: (self._store.compacted(REGISTRY_TOPIC), self._store.compacted(POSITIONS_TOPIC)))
        now = clock.now_ms()
        for record in registry:
            parent, _, lite = record.keys[0].partition("\0")
            created, _, rest = record.body.decode().partition(":")
            last, _, owner = rest.partition(":")
            # a message may have come up to a quarter TTL after the recorded time: never expire early
            latest = min(now, int(last or 0) + self._config.lite_topic_ttl_ms // 4)
            if record.body and latest >= horizon:
                self._note(parent, lite, LiteTopic(int(created), latest, int(last),
                                                   owner=sys.intern(owner)))
        for record in positions:
            group, parent, lite = record.keys[0].split("\0", 2)
            if record.body and (parent, lite) in self.live:
                done, _, done_ms = record.body.decode().partition(":")
                self.channels[group, parent, lite] = Channel(int(done), int(done_ms), saved=int(done))
        if self.live:
            log.info("%d lite topics are live", len(self.live))
        self._tasks = [asyncio.create_task(self._expire_every_while()),
                       asyncio.create_task(self._save_every_while())]

    async def close(self) -> None:
        """Stop the timers; save the positions."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        try:
            await self.save_positions()
        except Exception as error:  # noqa: BLE001 - the last saved positions stand
            log.error("could not save lite topic positions on close (%s)", error)

    # --- sending ---

    def registry_records(self, messages: Sequence[OutgoingMessage],
                         user: str) -> list[OutgoingMessage]:
        """Note the lite topics ``messages`` (sent by ``user``) go to, created now if new; the
        registry records to append before them. QuotaExceeded when one more would pass a
        quota (``check_quotas``); nothing is noted then."""
        now = clock.now_ms()
        new = {(m.topic, m.lite_topic) for m in messages if (m.topic, m.lite_topic) not in self.live}
        if new:
            self.check_quotas(new, user)
        stale_after = self._config.lite_topic_ttl_ms // 4
        records = []
        for parent, lite in dict.fromkeys((m.topic, m.lite_topic) for m in messages):
            state = self.live.get((parent, lite))
            if state is None:
                state = LiteTopic(now, now, now, owner=sys.intern(user))
                parent = self._topics.get(parent).name  # one string per parent, not per send
                self._note(parent, lite, state)
            elif now - state.saved_ms < stale_after:
                state.last_ms = now
                continue
            state.last_ms = state.saved_ms = now
            records.append(OutgoingMessage(
                REGISTRY_TOPIC, f"{state.created_ms}:{now}:{state.owner}".encode(),
                keys=(f"{parent}\0{lite}",), queue_id=0))
        return records

    def check_quotas(self, new: set[tuple[str, str]], user: str) -> None:
        """QuotaExceeded unless lite topics ``new`` ((parent, lite topic) pairs, none live)
        created by ``user`` fit every quota: live in all (``core.max_lite_topics``), in one
        parent topic, and created by one user. The text names the quota."""
        config, expiry = self._config, ("they expire after core.lite_topic_ttl_ms without "
                                         "messages")
        if len(self.live) + len(new) > config.max_lite_topics:
            raise QuotaExceeded(f"{len(self.live)} lite topics are live, the limit is "
                                f"{config.max_lite_topics} (core.max_lite_topics); {expiry}")
        for parent, count in Counter(parent for parent, _ in new).items():
            if self.per_topic[parent] + count > config.max_lite_topics_per_topic:
                raise QuotaExceeded(
                    f"topic {parent!r} has {self.per_topic[parent]} live lite topics, the quota "
                    f"is {config.max_lite_topics_per_topic} (core.max_lite_topics_per_topic); "
                    f"{expiry}")
        if self.per_user[user] + len(new) > config.max_lite_topics_per_user:
            raise QuotaExceeded(
                f"user {user[:64]!r} created {self.per_user[user]} live lite topics, the quota "
                f"is {config.max_lite_topics_per_user} (core.max_lite_topics_per_user); "
                f"{expiry}")

    def _note(self, parent: str, lite: str, state: LiteTopic) -> None:
        self.live[parent, lite] = state
        self.per_topic[parent] += 1
        self.per_user[state.owner] += 1

    def _forget(self, key: tuple[str, str]) -> None:
        state = self.live.pop(key)
        for counts, name in ((self.per_topic, key[0]), (self.per_user, state.owner)):
            counts[name] -= 1
            if not counts[name]:
                del counts[name]

    def sent(self, messages: Sequence[OutgoingMessage], results: Sequence[SendResult]) -> None:
        """Note where lite topics' messages landed: consumers need not search past it."""
        for message, result in zip(messages, results):
            state = self.live.get((message.topic, message.lite_topic))
            if state is not None and result.queue_offset > state.newest:
                state.newest = result.queue_offset

    # --- subscriptions ---

    def sync(self, group: str, parent: str, client_id: str, action: str, names: Sequence[str]) -> None:
        """Change ``client_id``'s lite topics of ``parent`` (see ``PARTIAL_ADD`` and others)."""
        for name in names:
            if not 0 < len(name) <= 128 or not name.isprintable():
                raise InvalidArgument(f"lite topic {name[:40]!r} is not 1-128 printable characters")
        key = (group, parent, client_id)
        entry = self._subscriptions.get(key)
        now = clock.now_ms()
        if entry is None:
            entry = self._subscriptions[key] = Subscribed(set(), now)
        entry.synced_ms = now
        if action == PARTIAL_ADD:
            wanted = entry.names | set(names)
        elif action == PARTIAL_REMOVE:
            wanted = entry.names - set(names)
        elif action == COMPLETE_ADD:
            wanted = set(names)
        else:
            wanted = set()
        if len(wanted) > SUBSCRIPTION_QUOTA:
            raise QuotaExceeded(f"a client may subscribe to {SUBSCRIPTION_QUOTA} lite topics; "
                                f"this one asked for {len(wanted)}")
        entry.names = wanted

    def subscribed(self, group: str, parent: str, client_id: str) -> list[str]:
        """The lite topics of ``parent`` that ``client_id`` consumes in ``group``."""
        entry = self._subscriptions.get((group, parent, client_id))
        return sorted(entry.names) if entry else []

    def leave(self, group: str, client_id: str) -> None:
        """Forget a client that left the group."""
        for key in [k for k in self._subscriptions if k[0] == group and k[2] == client_id]:
            del self._subscriptions[key]

    def channel(self, group: str, parent: str, lite: str, state: LiteTopic) -> Channel:
        """The group's channel of a live lite topic, starting at its first message."""
        channel = self.channels.get((group, parent, lite))
        if channel is None:
            channel = self.channels[group, parent, lite] = Channel(done_ms=state.created_ms)
        return channel

    # --- expiry and saving ---

    async def _expire_every_while(self) -> None:
        period = max(0.05, min(10.0, self._config.lite_topic_ttl_ms / 4000))
        while True:
            await asyncio.sleep(period)
            try:
                await self.expire(clock.now_ms())
            except Exception:  # noqa: BLE001 - the next round tries again
                log.exception("expiring lite topics failed; retrying")

    async def expire(self, now: int) -> None:
        """Delete lite topics without a message for the TTL, with their channels, and the
        subscriptions of clients that stopped syncing."""
        horizon = now - self._config.lite_topic_ttl_ms
        expired = {key for key, state in self.live.items() if state.last_ms < horizon}
        for key in [k for k, entry in self._subscriptions.items()
                    if entry.synced_ms < now - SUBSCRIPTION_TTL_MS]:
            del self._subscriptions[key]
        if not expired:
            return
        gone = [key for key in self.channels if (key[1], key[2]) in expired]
        records = [OutgoingMessage(REGISTRY_TOPIC, b"", keys=(f"{p}\0{lite}",), queue_id=0)
                   for p, lite in expired]
        records += [OutgoingMessage(POSITIONS_TOPIC, b"", keys=("\0".join(key),), queue_id=0)
                    for key in gone if self.channels[key].saved >= 0]
        for key in expired:
            self._forget(key)
        for key in gone:
            del self.channels[key]
        log.info("%d lite topics expired (no message for %d ms)", len(expired),
                 self._config.lite_topic_ttl_ms)
        await self._producer.send(self._topics.get, records)

    async def _save_every_while(self) -> None:
        period = self._config.offset_commit_interval_ms / 1000
        while True:
            await asyncio.sleep(period)
            try:
                await self.save_positions()
            except Exception as error:  # noqa: BLE001 - a full disk: retried next interval
                log.error("could not save lite topic positions (%s); retrying", error)

    async def save_positions(self) -> None:
        """Record the positions that moved since they were last saved."""
        moved = [(key, channel, channel.done) for key, channel in self.channels.items()
                 if channel.done != channel.saved]
        if not moved:
            return
        await self._producer.send(self._topics.get, [
            OutgoingMessage(POSITIONS_TOPIC, f"{done}:{channel.done_ms}".encode(),
                            keys=("\0".join(key),), queue_id=0) for key, channel, done in moved])
        for _, channel, done in moved:
            channel.saved = max(channel.saved, done)
