"""The service facade every protocol adapter calls: topics, groups, send, pop, pull, offsets.

All methods run on the broker's event loop. Methods that may wait (send under ``sync`` flush,
long-polling receive and pull) are coroutines; the rest return at once. Every method that acts
for a client takes the authenticated ``Principal`` first and checks its permission on domain
names before doing anything.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from store.api import RetentionReport, Store

from .auth import Users
from .consume import Reader, make_handle, parse_handle, pop_queue, pull_queue, settle, to_delivery
from .cursors import CursorBook
from .delivery import RecentMessages, TopicSignals
from .durable import DurableWaiters
from .errors import (AccessDenied, AlreadyExists, GroupNotFound, InvalidArgument,
                     InvalidReceiptHandle, MessageNotFound, TopicNotFound, Unavailable)
from .fanout import Fanout, Listener, QueueTarget
from .filters import parse_filter
from .membership import Membership
from .metadata import MetadataRepository
from .model import (SUBJECT_PROPERTY, Action, ConsumeMode, Delivery, GroupConfig, Member,
                    OutgoingMessage, Principal, PullResult, QueueLag, ResourceKind, SendResult,
                    Subscription, TopicConfig)
from .produce import Producer
from .subjects import in_topic, topic_of_subject

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CoreConfig:
    """Broker-wide behaviour of core. Durations in milliseconds."""

    max_message_bytes: int = 4 << 20
    auto_create_groups: bool = True
    auto_create_topics: bool = True
    """A publish (MQTT) to a topic that does not exist creates it with ``auto_topic_queues``."""
    auto_topic_queues: int = 4
    heartbeat_timeout_ms: int = 30_000
    offset_commit_interval_ms: int = 1_000
    default_invisible_ms: int = 30_000
    max_long_poll_ms: int = 30_000
    recent_cache_bytes: int = 64 << 20
    retention_check_interval_ms: int = 60_000
    """How often the store's retention runs and topics' own retention limits are applied."""


@dataclass(frozen=True)
class QueueStats:
    """One queue of a topic: its offset range."""

    queue_id: int
    min_offset: int
    max_offset: int


@dataclass(frozen=True)
class TopicStats:
    """A topic's settings and its queues."""

    config: TopicConfig
    queues: tuple[QueueStats, ...]


@dataclass(frozen=True)
class GroupStats:
    """A group's settings, live members, subscriptions and lag per queue."""

    config: GroupConfig
    members: tuple[Member, ...]
    subscriptions: tuple[Subscription, ...]
    lag: tuple[QueueLag, ...]


class Broker:
    """The domain facade over one store and one metadata repository.

    Construct it, ``await start()`` on the event loop that will call it, and ``await close()``
    before closing the store. Runs on that event loop; not thread-safe.
    """

    def __init__(self, store: Store, metadata: MetadataRepository, data_dir: str,
                 config: CoreConfig = CoreConfig(), *, flush: str = "sync") -> None:
        self.store = store
        self.metadata = metadata
        self.config = config
        self.users = Users(metadata)
        self._durable_sends = flush == "sync"
        self._cursors = CursorBook(data_dir)
        self._members = Membership(config.heartbeat_timeout_ms)
        self._recent = RecentMessages(config.recent_cache_bytes)
        self._signals = TopicSignals()
        self._fanout = Fanout()
        self._topics: dict[str, TopicConfig] = {}
        self._groups: dict[str, GroupConfig] = {}
        self._subscriptions: dict[tuple[str, str], Subscription] = {}
        self._rotation = itertools.count()
        self._tasks: list[asyncio.Task] = []
        self._closing = False
        self.counters: Counter[tuple[str, str]] = Counter()
        """(metric, topic or group) -> count: ``messages_in``, ``bytes_in``, ``messages_out``,
        ``bytes_out`` per topic and ``dead_lettered`` per group."""
        self._producer: Producer | None = None
        self._reader: Reader | None = None
        self._retention_floors: dict[tuple[str, int], int] = {}
        """(topic, queue) -> first offset within the topic's own retention limit."""
        self._rights_listeners: list[Callable[[str, bool], None]] = []

    # --- lifecycle ---

    async def start(self) -> None:
        """Load metadata; start timers (member expiry, offset commits). Runs on the loop."""
        loop = asyncio.get_running_loop()
        store = self.store
        durable = store.durable_offset
        visible = getattr(store, "visible_offset", durable)
        waiters = DurableWaiters(loop, durable, visible)
        store.add_listener(waiters.listener)
        store.add_health_listener(waiters.health_listener)
        waiters.store_health(store.degraded)
        self._producer = Producer(store, waiters, self._recent, self._signals, self._fanout,
                                  durable=self._durable_sends, max_message_bytes=self.config.max_message_bytes)
        self.counters = self._producer.counters
        self._reader = Reader(store, self._recent, self._producer.deliverable_end, self._retention_floors)
        self.users.add_listener(lambda user, exists: loop.call_soon_threadsafe(
            self._rights_changed, user, exists))
        topics, groups, subscriptions = await asyncio.to_thread(self._load_metadata)
        self._topics = {t.name: t for t in topics}
        self._groups = {g.name: g for g in groups}
        self._subscriptions = {(s.group, s.topic): s for s in subscriptions}
        self._tasks = [asyncio.create_task(self._expire_members()),
                       asyncio.create_task(self._commit_offsets()),
                       asyncio.create_task(self._retain())]

    def _load_metadata(self):
        return (self.metadata.list_topics(), self.metadata.list_groups(),
                self.metadata.list_subscriptions())

    def begin_shutdown(self) -> None:
        """Answer every pending long poll at once and refuse new sends; acks still count."""
        self._closing = True
        self._signals.notify_all()

    async def close(self) -> None:
        """Stop timers, wake every long poll with an empty answer, persist offsets."""
        self.begin_shutdown()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._signals.notify_all()
        self._cursors.write(self._cursors.snapshot())

    async def _expire_members(self) -> None:
        period = max(0.05, self.config.heartbeat_timeout_ms / 4000)
        while True:
            await asyncio.sleep(period)
            for group, client_id in self._members.expire(_now_ms()):
                log.info("member %s of group %s missed its heartbeats; its queues are reassigned",
                         client_id, group)

    async def _commit_offsets(self) -> None:
        period = self.config.offset_commit_interval_ms / 1000
        failing = False
        while True:
            await asyncio.sleep(period)
            try:
                await asyncio.to_thread(self._cursors.write, self._cursors.snapshot())
            except OSError as error:  # a full disk: logged once, retried every interval
                if not failing:
                    log.error("could not save consumer offsets (%s); retrying every %.1f s",
                              error, period)
                failing = True
            else:
                if failing:
                    log.info("consumer offsets are saved again")
                failing = False

    async def _retain(self) -> None:
        period = self.config.retention_check_interval_ms / 1000
        while True:
            await asyncio.sleep(period)
            try:
                await self.apply_retention()
            except Exception:  # noqa: BLE001 - the next interval tries again
                log.exception("retention pass failed; retrying next interval")

    async def apply_retention(self, now_ms: int | None = None) -> RetentionReport:
        """Run the store's retention (whole segments, off the loop), then hide messages older
        than each topic's own ``retention_ms`` from its consumers."""
        now = _now_ms() if now_ms is None else now_ms
        report = await asyncio.to_thread(self.store.apply_retention, now)
        if report.deleted_segments:
            log.info("retention deleted %d segments (%d bytes); the log now starts at offset %d",
                     len(report.deleted_segments), report.deleted_bytes, report.log_min_offset)
        for topic in list(self._topics.values()):
            if topic.retention_ms is not None:
                for q in range(topic.queue_count):
                    floor = self.store.offset_for_time(topic.name, q, now - topic.retention_ms)
                    self._retention_floors[(topic.name, q)] = floor
        return report

    # --- authentication ---

    async def authenticate(self, username: str, password: str) -> Principal:
        """Principal for a username/password pair; raises Unauthenticated.

        Credentials seen before are checked in memory; new ones off the loop (scrypt, SQL)."""
        if self.users.credentials_cached(username):
            return self.users.authenticate(username, password)
        return await asyncio.to_thread(self.users.authenticate, username, password)

    async def authenticate_signature(self, access_key: str, signed: bytes, signature_hex: str) -> Principal:
        """Principal for an HMAC-SHA1 signature of ``signed`` made with the user's secret."""
        if self.users.credentials_cached(access_key):
            return self.users.authenticate_signature(access_key, signed, signature_hex)
        return await asyncio.to_thread(self.users.authenticate_signature, access_key, signed, signature_hex)

    def _allow(self, principal: Principal, action: Action, kind: ResourceKind, name: str) -> None:
        self.users.authorize(principal, action, kind, name)

    def allowed(self, principal: Principal, action: Action, topic: str) -> bool:
        """Whether ``principal`` may ``action`` on topic ``topic`` (for adapters that answer a
        denial in-band, like an MQTT SUBACK)."""
        try:
            self._allow(principal, action, ResourceKind.TOPIC, topic)
        except AccessDenied:
            return False
        return True

    def subject_allowed(self, principal: Principal, action: Action, subject: str) -> bool:
        """Whether ``principal`` may publish to, or receive a message of, ``subject``: the
        access-control rules, else the topic permission of its topic (``core.acl``). Cached;
        answers change as soon as rights do (``rights_generation`` moves)."""
        return self.users.subject_allowed(principal, action, subject)

    def filter_allowed(self, principal: Principal, subject_filter: str) -> bool:
        """Whether ``principal`` may subscribe to ``subject_filter`` (``core.acl``). Messages
        delivered through the subscription are each checked with ``subject_allowed``."""
        return self.users.filter_allowed(principal, subject_filter)

    @property
    def rights_generation(self) -> int:
        """Moves whenever any user's rights change; decisions cached by adapters expire with it."""
        return self.users.generation

    def on_rights_changed(self, listener: Callable[[str, bool], None]) -> None:
        """Call ``listener(user, exists)`` on the loop after a user's rights changed (``*``:
        a rule for everyone), so adapters end at once what is no longer allowed."""
        self._rights_listeners.append(listener)

    def _rights_changed(self, user: str, exists: bool) -> None:
        for listener in self._rights_listeners:
            try:
                listener(user, exists)
            except Exception:  # noqa: BLE001 - one adapter's failure must not stop the others
                log.exception("reacting to changed rights of user %s failed", user)

    # --- topics ---

    async def create_topic(self, principal: Principal, config: TopicConfig) -> TopicConfig:
        """Create a topic; AlreadyExists if the name is taken."""
        self._allow(principal, Action.ADMIN, ResourceKind.TOPIC, config.name)
        if config.name in self._topics:
            raise AlreadyExists(f"topic {config.name!r} exists already")
        await asyncio.to_thread(self.metadata.create_topic, config)
        self._topics[config.name] = config
        if config.compacted:
            self.store.enable_compaction(config.name)
        return config

    async def _auto_create(self, name: str) -> TopicConfig:
        """Topic ``name`` for a publish already authorized, created with default settings if
        ``auto_create_topics`` is on."""
        if not self.config.auto_create_topics:
            raise TopicNotFound(name)
        return await self._create_internal_topic(TopicConfig(name, self.config.auto_topic_queues))

    async def _create_internal_topic(self, config: TopicConfig) -> TopicConfig:
        if config.name not in self._topics:
            try:
                await asyncio.to_thread(self.metadata.create_topic, config)
            except AlreadyExists:
                pass
            self._topics.setdefault(config.name, config)
            log.info("created topic %s", config.name)
        if config.compacted:
            self.store.enable_compaction(config.name)
        return self._topics[config.name]

    def get_topic(self, name: str) -> TopicConfig:
        """The topic's settings; TopicNotFound if there is none."""
        topic = self._topics.get(name)
        if topic is None:
            raise TopicNotFound(name)
        return topic

    def list_topics(self) -> list[TopicConfig]:
        """Every topic, by name."""
        return sorted(self._topics.values(), key=lambda t: t.name)

    def describe_topic(self, name: str) -> TopicStats:
        """A topic's settings and each queue's offset range."""
        topic = self.get_topic(name)
        return TopicStats(topic, tuple(QueueStats(q, *self._reader.range(name, q))
                                       for q in range(topic.queue_count)))

    async def delete_topic(self, principal: Principal, name: str) -> None:
        """Delete a topic's metadata; its stored messages age out with retention."""
        self._allow(principal, Action.ADMIN, ResourceKind.TOPIC, name)
        self.get_topic(name)
        await asyncio.to_thread(self.metadata.delete_topic, name)
        del self._topics[name]
        self._recent.forget_topic(name)
        self._signals.notify(name)

    # --- groups and membership ---

    async def create_group(self, principal: Principal, config: GroupConfig) -> GroupConfig:
        """Create a consumer group; AlreadyExists if the name is taken."""
        self._allow(principal, Action.ADMIN, ResourceKind.GROUP, config.name)
        if config.name in self._groups:
            raise AlreadyExists(f"consumer group {config.name!r} exists already")
        await asyncio.to_thread(self.metadata.create_group, config)
        self._groups[config.name] = config
        return config

    def get_group(self, name: str) -> GroupConfig:
        """The group's settings; GroupNotFound if there is none."""
        group = self._groups.get(name)
        if group is None:
            raise GroupNotFound(name)
        return group

    def list_groups(self) -> list[GroupConfig]:
        """Every group, by name."""
        return sorted(self._groups.values(), key=lambda g: g.name)

    def describe_group(self, name: str) -> GroupStats:
        """A group's settings, live members, subscriptions and lag."""
        group = self.get_group(name)
        subscriptions = tuple(s for (g, _), s in sorted(self._subscriptions.items()) if g == name)
        return GroupStats(group, self._members.describe(name), subscriptions, tuple(self.lag(name)))

    async def delete_group(self, principal: Principal, name: str) -> None:
        """Delete a group, its subscriptions and its offsets."""
        self._allow(principal, Action.ADMIN, ResourceKind.GROUP, name)
        self.get_group(name)
        await asyncio.to_thread(self.metadata.delete_group, name)
        del self._groups[name]
        for key in [key for key in self._subscriptions if key[0] == name]:
            del self._subscriptions[key]
        self._members.drop_group(name)
        self._cursors.drop_consumer(name)

    async def _group(self, principal: Principal, name: str) -> GroupConfig:
        """The group, created with defaults if unknown and auto-creation is on."""
        self._allow(principal, Action.SUBSCRIBE, ResourceKind.GROUP, name)
        group = self._groups.get(name)
        if group is None:
            if not self.config.auto_create_groups:
                raise GroupNotFound(name)
            group = GroupConfig(name)
            try:
                await asyncio.to_thread(self.metadata.create_group, group)
            except AlreadyExists:
                group = await asyncio.to_thread(self.metadata.get_group, name) or group
            group = self._groups.setdefault(name, group)
        return group

    async def heartbeat(self, principal: Principal, group: str, client_id: str,
                        subscriptions: Sequence[Subscription] = ()) -> None:
        """Keep ``client_id`` a live member of ``group``; record its subscriptions."""
        await self._group(principal, group)
        for subscription in subscriptions:
            self._allow(principal, Action.SUBSCRIBE, ResourceKind.TOPIC, subscription.topic)
            self.get_topic(subscription.topic)
            parse_filter(subscription.expression, subscription.expression_type)
            key = (group, subscription.topic)
            if self._subscriptions.get(key) != subscription:
                await asyncio.to_thread(self.metadata.put_subscription, subscription)
                self._subscriptions[key] = subscription
        topics = {s.topic for s in subscriptions} or None
        self._members.heartbeat(group, client_id, _now_ms(), topics)

    def leave(self, group: str, client_id: str) -> None:
        """Remove a client that is shutting down; its queues go to the others."""
        if self._members.leave(group, client_id):
            log.info("member %s left group %s", client_id, group)

    def assignment(self, principal: Principal, group: str, topic: str, client_id: str) -> list[int]:
        """The queues of ``topic`` that ``client_id`` should consume now."""
        self._allow(principal, Action.SUBSCRIBE, ResourceKind.TOPIC, topic)
        self._allow(principal, Action.SUBSCRIBE, ResourceKind.GROUP, group)
        config = self.get_topic(topic)
        if self._consume_mode(group) is ConsumeMode.BROADCAST:
            return list(range(config.queue_count))
        return list(self._members.assign(group, topic, client_id, config.queue_count, _now_ms()))

    def _consume_mode(self, group: str) -> ConsumeMode:
        config = self._groups.get(group)
        return config.consume_mode if config else ConsumeMode.CLUSTERING

    def _consumer(self, group: str, client_id: str) -> str:
        """Cursor owner: the group, or one client of a broadcast group."""
        if self._consume_mode(group) is ConsumeMode.BROADCAST:
            return f"{group}@{client_id}"
        return group

    # --- produce ---

    async def send(self, principal: Principal, messages: Sequence[OutgoingMessage], *,
                   create_topics: bool = False) -> list[SendResult]:
        """Store messages; under ``sync`` flush return once they are durable.

        Each message is authorized once, on its subject when it has one (which must lie in its
        topic) and else on its topic. ``create_topics``: topics that do not exist are created
        with default settings when ``auto_create_topics`` is on (MQTT publishes)."""
        if self._closing:
            raise Unavailable("the broker is shutting down; retry against the restarted broker")
        if not messages:
            raise InvalidArgument("a send needs at least one message")
        for message in messages:
            self._authorize_send(principal, message)
        if create_topics:
            for topic in {m.topic for m in messages if m.topic not in self._topics}:
                await self._auto_create(topic)
        return await self._producer.send(self.get_topic, messages)

    def _authorize_send(self, principal: Principal, message: OutgoingMessage) -> None:
        subject = message.properties.get(SUBJECT_PROPERTY)
        if not subject:
            self._allow(principal, Action.PUBLISH, ResourceKind.TOPIC, message.topic)
            return
        if not in_topic(subject, message.topic):
            raise InvalidArgument(
                f"subject {subject[:200]!r} does not belong to topic {message.topic!r}: a "
                f"subject's first level names its topic ({topic_of_subject(subject)!r}); send it "
                "there, or drop the subject")
        if not self.users.subject_allowed(principal, Action.PUBLISH, subject):
            raise AccessDenied(
                f"user {principal.user!r} may not publish to {subject[:200]!r}; ask an "
                "administrator for a rule or a topic permission that allows it")

    # --- message-level (pop) consumption ---

    async def receive(self, principal: Principal, group: str, topic: str, client_id: str, *,
                      expression: str = "*", max_messages: int = 32, invisible_ms: int | None = None,
                      wait_ms: int = 0, queue_id: int | None = None,
                      expression_type: str = "TAG") -> list[Delivery]:
        """Pop up to ``max_messages``, waiting up to ``wait_ms`` for some to arrive.

        A client that asked for an assignment pops only the queue it names, and nothing if
        that queue is no longer its own; any other client pops every queue of the topic.
        """
        self._allow(principal, Action.SUBSCRIBE, ResourceKind.TOPIC, topic)
        config = self.get_topic(topic)
        group_config = await self._group(principal, group)
        tags = parse_filter(expression, expression_type)
        if not 1 <= max_messages <= 1024:
            raise InvalidArgument(f"max_messages {max_messages} is out of range: use 1-1024")
        invisible = self.config.default_invisible_ms if invisible_ms is None else invisible_ms
        if not MIN_INVISIBLE_MS <= invisible <= MAX_INVISIBLE_MS:
            raise InvalidArgument(f"invisible duration {invisible} ms is out of range: use "
                                  f"{MIN_INVISIBLE_MS} ms to 12 h")
        consumer = self._consumer(group, client_id)
        deadline = _now_ms() + min(max(0, wait_ms), self.config.max_long_poll_ms)
        while True:
            self._allow(principal, Action.SUBSCRIBE, ResourceKind.TOPIC, topic)  # revoked meanwhile?
            queues = self._receive_queues(group, topic, client_id, config, queue_id)
            found = await self._pop(consumer, topic, queues, tags, invisible, max_messages,
                                    group_config.retry.max_attempts)
            now = _now_ms()
            if found or now >= deadline or self._closing or topic not in self._topics:
                self._count_out(topic, found)
                return found
            wake = deadline
            for q in queues:
                cursor = self._cursors.get((consumer, topic, q))
                if cursor is not None and (due := cursor.next_deadline()) is not None:
                    wake = min(wake, due)
            await self._signals.wait((topic,), max(0.001, (wake - now) / 1000))

    def _count_out(self, topic: str, deliveries: list[Delivery]) -> None:
        if deliveries:
            self.counters["messages_out", topic] += len(deliveries)
            self.counters["bytes_out", topic] += sum(len(d.body) for d in deliveries)

    def _receive_queues(self, group: str, topic: str, client_id: str, config: TopicConfig,
                        queue_id: int | None) -> list[int]:
        assigned = self._members.assigned(group, client_id, topic)
        if assigned is not None and queue_id is not None and queue_id >= 0:
            return [queue_id] if queue_id in assigned else []
        start = next(self._rotation)
        count = config.queue_count
        return [(start + i) % count for i in range(count)]

    async def _pop(self, consumer: str, topic: str, queues: list[int], tags, invisible_ms: int,
                   limit: int, max_attempts: int) -> list[Delivery]:
        found: list[Delivery] = []
        now = _now_ms()
        for q in queues:
            if len(found) >= limit:
                break
            cursor = self._cursors.open((consumer, topic, q), self._start_offset(consumer, topic, q))
            popped = pop_queue(self._reader, cursor, consumer, topic, q, tags, now, invisible_ms,
                               limit - len(found), max_attempts)
            found += popped.deliveries
            for message in popped.dead:
                await self._dead_letter(consumer, message)
                cursor.ack(message.queue_offset)
        return found

    def _start_offset(self, consumer: str, topic: str, queue_id: int) -> int:
        """Where a consumer new to a queue starts: the earliest message for a group, the
        end for one client of a broadcast group."""
        earliest, end = self._reader.range(topic, queue_id)
        return end if "@" in consumer else earliest

    async def _dead_letter(self, consumer: str, message: Delivery) -> None:
        group = consumer.partition("@")[0]
        dlq = await self._dead_letter_topic(group)
        properties = dict(message.properties)
        subject = properties.pop(SUBJECT_PROPERTY, None)  # it names the origin topic, not the DLQ
        if subject:
            properties["sluice.dlq.origin_subject"] = subject
        properties.update({"sluice.dlq.origin_topic": message.topic,
                           "sluice.dlq.origin_msg_id": message.msg_id,
                           "sluice.dlq.attempts": str(message.attempt)})
        await self._producer.send(self.get_topic, [OutgoingMessage(
            dlq, message.body, message.tag, message.keys, properties, born_ts=message.born_ts)])
        self.counters["dead_lettered", group] += 1
        log.info("message %s of topic %s moved to %s after %d attempts", message.msg_id,
                 message.topic, dlq, message.attempt)

    async def _dead_letter_topic(self, group: str) -> str:
        name = DEAD_LETTER_PREFIX + group
        if name not in self._topics:
            await self._create_internal_topic(TopicConfig(name, queue_count=1))
        return name

    def _flight(self, principal: Principal, group: str, topic: str, receipt_handle: str):
        self._allow(principal, Action.SUBSCRIBE, ResourceKind.TOPIC, topic)
        self._allow(principal, Action.SUBSCRIBE, ResourceKind.GROUP, group)
        self.get_topic(topic)
        consumer_candidates = [group]
        if self._consume_mode(group) is ConsumeMode.BROADCAST:
            consumer_candidates = [k[0] for k in self._cursors.cursors
                                   if k[0].startswith(group + "@") and k[1] == topic]
        for consumer in consumer_candidates:
            try:
                handle = parse_handle(receipt_handle, consumer, topic)
            except InvalidReceiptHandle:
                continue
            cursor = self._cursors.get((consumer, topic, handle.queue_id))
            if cursor is None:
                break
            return consumer, cursor, settle(cursor, handle)
        raise InvalidReceiptHandle("receipt handle does not name a message this group received "
                                   "from this topic; pass the handle exactly as it came with the message")

    async def ack(self, principal: Principal, group: str, topic: str, receipt_handle: str) -> None:
        """Settle a popped message; ReceiptExpired if its invisible duration had ended."""
        _, cursor, offset = self._flight(principal, group, topic, receipt_handle)
        cursor.ack(offset)

    async def change_invisible(self, principal: Principal, group: str, topic: str,
                               receipt_handle: str, invisible_ms: int) -> str:
        """Hide a popped message for ``invisible_ms`` from now; return its new receipt handle."""
        if not 0 <= invisible_ms <= MAX_INVISIBLE_MS:
            raise InvalidArgument(f"invisible duration {invisible_ms} ms is out of range: use 0 to 12 h")
        consumer, cursor, offset = self._flight(principal, group, topic, receipt_handle)
        flight = cursor.extend(offset, _now_ms(), invisible_ms)
        self._signals.notify(topic)  # long polls recompute when the next redelivery is due
        queue_id = parse_handle(receipt_handle, consumer, topic).queue_id
        return make_handle(consumer, topic, queue_id, offset, flight.version)

    async def forward_to_dead_letter(self, principal: Principal, group: str, topic: str,
                                     receipt_handle: str) -> None:
        """Move a popped message to the group's dead-letter topic and settle it."""
        consumer, cursor, offset = self._flight(principal, group, topic, receipt_handle)
        queue_id = parse_handle(receipt_handle, consumer, topic).queue_id
        message = self._reader.read_one(topic, queue_id, offset)
        if message is not None:
            attempt = cursor.inflight[offset].attempt
            await self._dead_letter(consumer, dataclasses.replace(message, attempt=attempt))
        cursor.ack(offset)

    # --- queue-level consumption and offsets ---

    async def pull(self, principal: Principal, group: str, topic: str, queue_id: int, offset: int, *,
                   max_messages: int = 32, wait_ms: int = 0, expression: str = "*",
                   expression_type: str = "TAG") -> PullResult:
        """Read a queue by offset, waiting up to ``wait_ms`` when there is nothing new."""
        self._allow(principal, Action.SUBSCRIBE, ResourceKind.TOPIC, topic)
        config = self.get_topic(topic)
        self._check_queue(config, queue_id)
        tags = parse_filter(expression, expression_type)
        if not 1 <= max_messages <= 10_000:
            raise InvalidArgument(f"max_messages {max_messages} is out of range: use 1-10000")
        deadline = _now_ms() + min(max(0, wait_ms), self.config.max_long_poll_ms)
        while True:
            self._allow(principal, Action.SUBSCRIBE, ResourceKind.TOPIC, topic)  # revoked meanwhile?
            messages, next_offset, earliest, end = pull_queue(self._reader, topic, queue_id, offset,
                                                              max_messages, tags)
            now = _now_ms()
            if messages or now >= deadline or self._closing:
                self._count_out(topic, messages)
                return PullResult(messages, next_offset, earliest, end)
            offset = next_offset
            await self._signals.wait((topic,), (deadline - now) / 1000)

    def _check_queue(self, config: TopicConfig, queue_id: int) -> None:
        if not 0 <= queue_id < config.queue_count:
            raise InvalidArgument(f"queue {queue_id} does not exist in topic {config.name!r}, "
                                  f"which has queues 0-{config.queue_count - 1}")

    def commit_offset(self, principal: Principal, group: str, topic: str, queue_id: int, offset: int,
                      client_id: str = "") -> None:
        """Record that ``group`` has consumed ``topic``/``queue_id`` up to ``offset``."""
        self._allow(principal, Action.SUBSCRIBE, ResourceKind.GROUP, group)
        self._allow(principal, Action.SUBSCRIBE, ResourceKind.TOPIC, topic)
        self._check_queue(self.get_topic(topic), queue_id)
        if offset < 0:
            raise InvalidArgument(f"offset {offset} is negative")
        consumer = self._consumer(group, client_id)
        cursor = self._cursors.open((consumer, topic, queue_id), offset)
        cursor.reset(offset)

    def committed_offset(self, principal: Principal, group: str, topic: str, queue_id: int,
                         client_id: str = "") -> int:
        """The group's committed offset in a queue; -1 if it has none."""
        self._allow(principal, Action.SUBSCRIBE, ResourceKind.GROUP, group)
        self._check_queue(self.get_topic(topic), queue_id)
        cursor = self._cursors.get((self._consumer(group, client_id), topic, queue_id))
        return -1 if cursor is None else cursor.committed

    def offset_at(self, topic: str, queue_id: int, where: str | int) -> int:
        """``'earliest'``, ``'latest'`` or a timestamp in ms: the queue offset there."""
        self._check_queue(self.get_topic(topic), queue_id)
        earliest, end = self._reader.range(topic, queue_id)
        if where == "earliest":
            return earliest
        if where == "latest":
            return end
        if isinstance(where, int):
            return min(end, max(earliest, self.store.offset_for_time(topic, queue_id, where)))
        raise InvalidArgument(f"offset position {where!r} is not 'earliest', 'latest' or a timestamp")

    async def reset_offsets(self, principal: Principal, group: str, topic: str,
                            timestamp_ms: int) -> dict[int, int]:
        """Move the group's position in every queue of ``topic`` to ``timestamp_ms``."""
        self._allow(principal, Action.ADMIN, ResourceKind.GROUP, group)
        self.get_group(group)
        config = self.get_topic(topic)
        moved = {}
        for q in range(config.queue_count):
            offset = self.offset_at(topic, q, timestamp_ms)
            consumers = {k[0] for k in self._cursors.cursors if k[1] == topic
                         and (k[0] == group or k[0].startswith(group + "@"))} or {group}
            for consumer in consumers:
                self._cursors.open((consumer, topic, q), offset).reset(offset)
            moved[q] = offset
        self._signals.notify(topic)
        return moved

    def lag(self, group: str) -> list[QueueLag]:
        """The group's committed offset, end and in-flight count for every queue it consumes."""
        out = []
        for (consumer, topic, q), cursor in sorted(self._cursors.cursors.items()):
            if (consumer == group or consumer.startswith(group + "@")) and topic in self._topics:
                out.append(QueueLag(topic, q, cursor.committed, self._reader.range(topic, q)[1],
                                    len(cursor.inflight)))
        return out

    # --- lookup ---

    def lookup_message(self, principal: Principal, msg_id: str) -> Delivery:
        """The message with id ``msg_id``; MessageNotFound if none."""
        stored = self.store.lookup_id(msg_id)
        if stored is None:
            raise MessageNotFound(f"no message has id {msg_id!r}; it may have aged out with retention")
        self._allow(principal, Action.SUBSCRIBE, ResourceKind.TOPIC, stored.topic)
        return to_delivery(stored)

    def lookup_key(self, principal: Principal, topic: str, key: str, limit: int = 32) -> list[Delivery]:
        """Messages of ``topic`` carrying business key ``key``, newest first."""
        self._allow(principal, Action.SUBSCRIBE, ResourceKind.TOPIC, topic)
        self.get_topic(topic)
        return [to_delivery(m) for m in self.store.lookup_key(topic, key, limit)]



    # --- subject fan-out: subscriptions to named queues and live listeners ---

    def check_subject_filter(self, subject_filter: str) -> None:
        """InvalidArgument unless ``subject_filter`` is a well-formed subject filter."""
        self._fanout.check_filter(subject_filter)

    def bind_queue(self, subject_filter: str, queue: str) -> bool:
        """Index every message whose subject matches into named queue ``queue`` (queue id 0)
        from now on. Bindings live in memory: adapters restore theirs before serving."""
        return self._fanout.bind(subject_filter, QueueTarget(queue))

    def unbind_queue(self, subject_filter: str, queue: str) -> bool:
        """Undo ``bind_queue``."""
        return self._fanout.unbind(subject_filter, QueueTarget(queue))

    def add_listener(self, subject_filter: str, listener: Listener) -> bool:
        """Hand ``listener`` every message whose subject matches, once deliverable."""
        return self._fanout.bind(subject_filter, listener)

    def remove_listener(self, subject_filter: str, listener: Listener) -> bool:
        """Undo ``add_listener``."""
        return self._fanout.unbind(subject_filter, listener)

    def queue_bounds(self, queue: str) -> tuple[int, int]:
        """(earliest, deliverable end) of named queue ``queue``."""
        return self._reader.range(queue, 0)

    def read_queue(self, queue: str, offset: int, max_messages: int) -> tuple[list[Delivery], int]:
        """Up to ``max_messages`` of named queue ``queue`` from ``offset``: (messages, next
        offset). Deliveries carry the queue's own offsets; a start below the earliest retained
        message skips ahead."""
        earliest, end = self._reader.range(queue, 0)
        offset = max(offset, earliest)
        messages = self._reader.read(queue, 0, offset, min(max_messages, end - offset))
        return messages, (messages[-1].queue_offset + 1 if messages else offset)

    def queue_signal(self, queue: str) -> asyncio.Future[None]:
        """A future resolved when named queue ``queue`` next gets deliverable messages (or a
        popped message of it becomes visible again through ``release_popped``)."""
        return self._signals.future(queue)

    def pop_queue(self, queue: str, max_messages: int, invisible_ms: int) -> list[Delivery]:
        """Message-level consumption of named queue ``queue`` shared by several consumers:
        each message goes to one of them and comes back after ``invisible_ms`` unless settled."""
        cursor = self._cursors.open((queue, queue, 0), self._reader.range(queue, 0)[0])
        popped = pop_queue(self._reader, cursor, queue, queue, 0, parse_filter("*"), _now_ms(),
                           invisible_ms, max_messages, 1 << 30)
        return popped.deliveries

    def next_redelivery_ms(self, queue: str) -> int | None:
        """When the earliest popped, unsettled message of ``queue`` becomes visible again."""
        cursor = self._cursors.get((queue, queue, 0))
        return None if cursor is None else cursor.next_deadline()

    def settle_popped(self, queue: str, offset: int) -> None:
        """The popped message at ``offset`` of ``queue`` is done."""
        cursor = self._cursors.get((queue, queue, 0))
        if cursor is not None and offset in cursor.inflight:
            cursor.ack(offset)

    def release_popped(self, queue: str, offset: int) -> None:
        """Make the popped message at ``offset`` of ``queue`` visible again now (its consumer
        left), and wake those waiting on the queue."""
        cursor = self._cursors.get((queue, queue, 0))
        if cursor is not None and offset in cursor.inflight:
            cursor.extend(offset, _now_ms(), 0)
            self._signals.notify(queue)

    def queue_position(self, queue: str) -> tuple[int, frozenset[int]]:
        """Where the single consumer of named queue ``queue`` stands: (first offset not yet
        acked, offsets above it acked out of order). A queue never acked starts at its earliest."""
        cursor = self._cursors.get((queue, queue, 0))
        if cursor is None:
            return self._reader.range(queue, 0)[0], frozenset()
        return cursor.committed, frozenset(cursor.acked)

    def ack_queue(self, queue: str, offset: int) -> None:
        """The single consumer of named queue ``queue`` is done with ``offset`` (saved with the
        offsets every commit interval)."""
        self._cursors.open((queue, queue, 0), self._reader.range(queue, 0)[0]).ack(offset)

    def forget_queue(self, queue: str) -> None:
        """Drop the consumption state of named queue ``queue`` (a session or group that ended)."""
        self._cursors.drop_consumer(queue)

    # --- compacted state (MQTT retained messages and sessions) ---

    async def ensure_compacted(self, topic: str) -> None:
        """Create internal compacted topic ``topic`` (one queue) if it does not exist."""
        await self._create_internal_topic(TopicConfig(topic, queue_count=1, compacted=True))

    def enable_compacted_queue(self, queue: str) -> None:
        """Keep the newest message per key of named queue ``queue`` (see ``load_state``)."""
        self.store.enable_compaction(queue)

    async def put_state(self, topic: str, key: str, value: bytes) -> None:
        """Store ``value`` under ``key`` in compacted topic ``topic``; empty deletes the key.
        Returns once durable under ``sync`` flush."""
        await self._producer.send(self.get_topic, [OutgoingMessage(topic, value, keys=(key,),
                                                                   queue_id=0)])

    def load_state(self, topic: str) -> list[Delivery]:
        """The newest live message per key of compacted topic or queue ``topic``, oldest first."""
        return [to_delivery(m) for m in self.store.compacted(topic)]


DEAD_LETTER_PREFIX = "%DLQ%"
MIN_INVISIBLE_MS = 100
MAX_INVISIBLE_MS = 12 * 3_600_000


def _now_ms() -> int:
    return int(time.time() * 1000)
