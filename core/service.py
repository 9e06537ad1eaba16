"""The authenticated client API every adapter calls: topics, groups, send, receive, pull,
offsets and lookups.

Every method that acts for a client takes the authenticated ``Principal`` first and decides its
permission once per operation, on domain names, before doing anything (``core.auth`` caches each
decision until the rights generation moves, so a repeated decision costs a dictionary lookup).
Named queues for adapters (``core.named_queues``) and compacted state (``core.state_store``)
are separate faces over the same ``Engine``. Methods that may wait (send under ``sync`` flush,
long-polling receive and pull) are coroutines; the rest return at once.

Runs on the event loop; not thread-safe.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections import Counter
from collections.abc import Callable, Sequence
from typing import NamedTuple

from store import InvalidCursorError, KeyCursor

from .acl import Withheld, subject_of
from .auth import Users
from .clock import now_ms
from .consume import pull_queue, to_delivery
from .engine import Engine
from .errors import (AccessDenied, CorruptMessage, InvalidArgument, MessageNotFound, NotRecallable,
                     PreconditionFailed, Unavailable)
from .filters import parse_filter
from .memory_alarm import MemoryAlarm
from .model import (SUBJECT_PROPERTY, Action, Delivery, GroupConfig, GroupStats,
                    MessageType, OutgoingMessage, Principal, PullResult, QueueLag, QueueStats, ResourceKind,
                    SendResult, Subscription, TopicConfig, TopicStats)
from .lite_receive import LiteReceiver, is_lite_handle
from .logins import Logins
from .receive import Receiver
from .settings import CoreConfig
from .topics import TopicRoute
from .trace import MessageTrace
from .transactions import Checker, check_transactional

log = logging.getLogger(__name__)

ALL_QUEUES = -1
"""An assignment to pop every queue of a topic (RocketMQ's queue id -1)."""
MAX_LOOKUP_LIMIT = 1000
"""The most messages one lookup by key or time range answers with (a lookup by key pages)."""
ID_LOOKUP_PER_TOPIC = 16
"""The most messages with one id a lookup by id answers with from each topic."""
MIN_INVISIBLE_MS = 100
MAX_INVISIBLE_MS = 12 * 3_600_000


class Broker:
    """The client API over one ``Engine``; ``users`` authenticates and authorizes."""

    def __init__(self, engine: Engine, users: Users) -> None:
        self._engine = engine
        self._topics = engine.topics
        self._groups = engine.groups
        self._receiver = Receiver(engine)
        self._lite_receiver = LiteReceiver(engine)
        self.users = users
        self.logins = Logins(engine.config)
        self._rights_listeners: list[Callable[[str, bool], None]] = []
        self._last_creation: asyncio.Future[None] | None = None
        """Resolved once the latest send that had to wait for topic creation has appended."""

    @property
    def config(self) -> CoreConfig:
        """Core's settings."""
        return self._engine.config

    @property
    def counters(self) -> Counter[tuple[str, str]]:
        """(metric, topic or group) -> count since start (``Engine.counters``)."""
        return self._engine.counters

    def watch_store(self, watcher: Callable[[str | None], None]) -> str | None:
        """Call ``watcher(reason)`` whenever the store stops taking writes (disk full, I/O
        errors) and ``watcher(None)`` once it takes them again; returns the reason now (None:
        it writes). Runs on the event loop, and so do the calls."""
        waiters = self._engine.waiters
        waiters.health_watchers.append(watcher)
        return waiters.store_failure

    def watch_memory(self, watcher: Callable[[bool], None]) -> bool:
        """Call ``watcher(on)`` whenever the memory alarm goes on or off (``core.memory_alarm``);
        returns whether it is on now. Runs on the event loop, and so do the calls."""
        return self._engine.memory.watch(watcher)

    @property
    def memory_alarm(self) -> MemoryAlarm:
        """The memory alarm: whether it is on, the last resident size and the watermark."""
        return self._engine.memory

    # --- authentication and authorization ---

    async def authenticate(self, username: str, password: str, peer_host: str = "") -> Principal:
        """Principal for a username/password pair sent from ``peer_host`` (an IP address);
        raises Unauthenticated (``LoginThrottled`` or ``LoginBusy`` when refused unchecked).

        A password verified before is recognised in memory; any other, right, wrong or for an
        unknown user, costs a scrypt on a login thread, never on the event loop. Failures are
        throttled per address, per address and user name, and per user name (``core.logins``)."""
        users = self.users
        return await self.logins.decide(
            peer_host, username, functools.partial(users.cached_login, username, password),
            functools.partial(users.authenticate, username, password),
            shared=users.login_key(username, password))

    async def authenticate_certificate(self, username: str, peer_host: str = "") -> Principal:
        """Principal of the user that a verified client certificate names (its CN), for a
        connection from ``peer_host``: the user must exist. Throttled as ``authenticate``; the
        look-up runs on a login thread."""
        users = self.users
        return await self.logins.decide(peer_host, username, lambda: None,
                                        functools.partial(users.certificate_login, username))

    async def authenticate_signature(self, access_key: str, signed: bytes, signature_hex: str,
                                     peer_host: str = "") -> Principal:
        """Principal for an HMAC-SHA1 signature of ``signed`` made with the user's secret, sent
        from ``peer_host``: checked in memory once the key was looked up (off the loop), and
        throttled as ``authenticate``."""
        users = self.users
        return await self.logins.decide(
            peer_host, access_key,
            functools.partial(users.cached_signature, access_key, signed, signature_hex),
            functools.partial(users.authenticate_signature, access_key, signed, signature_hex))

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
        access-control rules, else the topic permission of its topic (``core.acl``). The
        decision for a publish that ``send_decided`` then stores. Cached until rights change
        (``rights_generation`` moves)."""
        return self.users.subject_allowed(principal, action, subject)

    def filter_allowed(self, principal: Principal, subject_filter: str) -> bool:
        """Whether ``principal`` may subscribe to ``subject_filter`` (``core.acl``). Messages
        delivered through the subscription are each checked with ``subject_allowed``."""
        return self.users.filter_allowed(principal, subject_filter)

    def withheld_by_rules(self, principal: Principal) -> Withheld | None:
        """What the access rules withhold from ``principal`` reading messages now (a queue,
        a pop, a pull, a lookup): a message whose subject (``core.acl.subject_of``) the most
        specific matching rule denies it; each one withheld is counted as
        ``messages_withheld`` of the topic it was sent to. None when no rule on subscribing
        applies to the reader (an admin, or no rule of its own or everyone's): nothing to check
        per message. Ask again for each read, as rules change; decisions are cached per (user,
        subject) until they do. Runs on the event loop."""
        users = self.users
        if not users.rules_bind(principal, Action.SUBSCRIBE):
            return None
        counters = self._engine.counters

        def withheld(delivery: Delivery) -> bool:
            if not users.rule_denies(principal, Action.SUBSCRIBE, subject_of(delivery)):
                return False
            counters["messages_withheld", delivery.home_topic or delivery.topic] += 1
            return True
        return withheld

    @property
    def rights_generation(self) -> int:
        """Moves whenever any user's rights change; decisions cached by adapters expire with it."""
        return self.users.generation

    def on_rights_changed(self, listener: Callable[[str, bool], None]) -> None:
        """Call ``listener(user, exists)`` on this event loop after a user's rights changed
        (``*``: a rule for everyone), so adapters end at once what is no longer allowed. Runs on
        the event loop."""
        if not self._rights_listeners:
            loop = asyncio.get_running_loop()
            self.users.add_listener(lambda user, exists: loop.call_soon_threadsafe(
                self._rights_changed, user, exists))
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
        return await self._topics.create(config)

    async def update_topic(self, principal: Principal, config: TopicConfig) -> TopicConfig:
        """Change a topic's retention, tier retention and body schema (``Topics.update``)."""
        self._allow(principal, Action.ADMIN, ResourceKind.TOPIC, config.name)
        return await self._topics.update(config)

    def get_topic(self, name: str) -> TopicConfig:
        """The topic's settings; TopicNotFound if there is none."""
        return self._topics.get(name)

    async def route_topic(self, principal: Principal, name: str) -> TopicRoute:
        """A topic a client looks up to use (a route lookup): its settings, and whether it
        exists. A missing topic that ``principal`` may publish to is answered, when
        ``auto_create_topics`` is on, with the settings its first send will create it with
        (RocketMQ's ``autoCreateTopicEnable``, the rule an MQTT publish follows), but not
        created: a lookup does not say whether a producer or a consumer asks, and reading a
        mistyped name must not make a topic of it. TopicNotFound otherwise."""
        if name in self._topics or not self.allowed(principal, Action.PUBLISH, name):
            return TopicRoute(self._topics.get(name), exists=True)
        return TopicRoute(self._topics.prospective(name), exists=False)

    def list_topics(self) -> list[TopicConfig]:
        """Every topic, by name."""
        return self._topics.list()

    def describe_topic(self, name: str) -> TopicStats:
        """A topic's settings and each queue's offset range."""
        topic = self._topics.get(name)
        reader = self._engine.reader
        return TopicStats(topic, tuple(QueueStats(q, *reader.range(name, q))
                                       for q in range(topic.queue_count)))

    async def wait_for_topic(self, name: str, timeout_s: float) -> None:
        """Return once topic ``name`` takes a message (the first one creates it), or after
        ``timeout_s``: for readers of a topic that does not exist yet."""
        await self._engine.signals.wait((name,), timeout_s)

    async def delete_topic(self, principal: Principal, name: str) -> None:
        """Delete a topic's metadata; its stored messages age out with retention."""
        self._allow(principal, Action.ADMIN, ResourceKind.TOPIC, name)
        await self._topics.delete(name)
        self._engine.recent.forget_topic(name)
        self._engine.signals.notify(name)

    # --- groups and membership ---

    async def create_group(self, principal: Principal, config: GroupConfig) -> GroupConfig:
        """Create a consumer group; AlreadyExists if the name is taken."""
        self._allow(principal, Action.ADMIN, ResourceKind.GROUP, config.name)
        return await self._groups.create(config)

    def get_group(self, name: str) -> GroupConfig:
        """The group's settings; GroupNotFound if there is none."""
        return self._groups.get(name)

    def list_groups(self) -> list[GroupConfig]:
        """Every group, by name."""
        return self._groups.list()

    def describe_group(self, name: str) -> GroupStats:
        """A group's settings, live members, subscriptions and lag."""
        group = self._groups.get(name)
        return GroupStats(group, self._groups.live_members(name), self._groups.subscriptions(name),
                          tuple(self.lag(name)))

    async def delete_group(self, principal: Principal, name: str) -> None:
        """Delete a group, its subscriptions and its offsets."""
        self._allow(principal, Action.ADMIN, ResourceKind.GROUP, name)
        await self._groups.delete(name)

    async def _group(self, principal: Principal, name: str) -> GroupConfig:
        """The group a consumer acts in, created with defaults if unknown and auto-creation is on."""
        self._allow(principal, Action.SUBSCRIBE, ResourceKind.GROUP, name)
        return await self._groups.ensure(name)

    async def heartbeat(self, principal: Principal, group: str, client_id: str,
                        subscriptions: Sequence[Subscription] = ()) -> None:
        """Keep ``client_id`` a live member of ``group``; record its subscriptions."""
        await self._group(principal, group)
        for subscription in subscriptions:
            self._allow(principal, Action.SUBSCRIBE, ResourceKind.TOPIC, subscription.topic)
            self._topics.get(subscription.topic)
            parse_filter(subscription.expression, subscription.expression_type)
            await self._groups.record_subscription(subscription)
        self._groups.heartbeat(group, client_id, {s.topic for s in subscriptions} or None)

    def leave(self, group: str, client_id: str) -> None:
        """Remove a client that is shutting down; its queues go to the others."""
        self._groups.leave(group, client_id)
        self._engine.lite.leave(group, client_id)

    async def sync_lite_subscription(self, principal: Principal, group: str, topic: str, client_id: str,
                                     action: str, lite_topics: Sequence[str]) -> None:
        """Change which lite topics of ``topic`` (a LITE topic) ``client_id`` consumes in
        ``group``: ``core.lite.PARTIAL_ADD`` and the other actions."""
        self._allow(principal, Action.SUBSCRIBE, ResourceKind.TOPIC, topic)
        await self._group(principal, group)
        config = self._topics.get(topic)
        if config.message_type is not MessageType.LITE:
            raise InvalidArgument(f"topic {topic!r} is not of message type LITE; lite topics live "
                                  "in a topic created with message type LITE")
        self._engine.lite.sync(group, topic, client_id, action, lite_topics)

    def assignment(self, principal: Principal, group: str, topic: str, client_id: str) -> list[int]:
        """The queues of ``topic`` that ``client_id`` should consume now; ``[ALL_QUEUES]`` for
        a priority topic, which every member pops whole, the highest priority first."""
        self._allow(principal, Action.SUBSCRIBE, ResourceKind.TOPIC, topic)
        self._allow(principal, Action.SUBSCRIBE, ResourceKind.GROUP, group)
        config = self._topics.get(topic)
        if config.message_type is MessageType.PRIORITY:
            return [ALL_QUEUES]
        return self._groups.assignment(group, topic, client_id, config.queue_count)

    # --- produce ---

    async def send(self, principal: Principal, messages: Sequence[OutgoingMessage], *,
                   create_topics: bool = False) -> list[SendResult]:
        """Store messages; under ``sync`` flush return once they are durable.

        Each message is authorized once, on its subject when it has one (which must lie in its
        topic) and else on its topic. ``create_topics``: topics that do not exist are created
        with default settings when ``auto_create_topics`` is on (MQTT wills, native sends)."""
        self._check_sendable(messages)
        for message in messages:
            self._authorize_send(principal, message)
        return await self._store(messages, create_topics, principal.user)

    async def send_decided(self, messages: Sequence[OutgoingMessage]) -> list[SendResult]:
        """Store publishes whose authorization the caller decided one by one, as it received
        them, with ``subject_allowed`` (an adapter answering a denial per message in-band, as
        MQTT does per PUBLISH): nothing is authorized twice. Each message's subject must lie in
        its topic; topics that do not exist are created when ``auto_create_topics`` is on."""
        self._check_sendable(messages)
        return await self._store(messages, True, "")

    def _check_sendable(self, messages: Sequence[OutgoingMessage]) -> None:
        if self._engine.closing:
            raise Unavailable("the broker is shutting down; retry against the restarted broker")
        if not messages:
            raise InvalidArgument("a send needs at least one message")

    async def _store(self, messages: Sequence[OutgoingMessage], create_topics: bool,
                     user: str) -> list[SendResult]:
        """Store messages authorized already; ``user`` sent them (lite topics they create count
        against its quota)."""
        topics = self._topics
        if create_topics and (self._last_creation is not None
                              or any(m.topic not in topics for m in messages)):
            await self._create_in_order(messages)
        if check_transactional(messages):
            return await self._engine.transactions.prepare(messages)
        if any(m.lite_topic for m in messages):
            return await self._store_lite(messages, user)
        now = now_ms()
        if not any(m.delivery_ts > now for m in messages):
            return await self._engine.producer.send(topics.get, messages)
        return await self._store_delayed(messages, now)

    async def _store_lite(self, messages: Sequence[OutgoingMessage], user: str) -> list[SendResult]:
        """A send to lite topics by ``user``: the registry records of lite topics it creates (or
        keeps alive) go first, in the same append (``core.lite``)."""
        topics, lite = self._topics, self._engine.lite
        for message in messages:  # refused before a lite topic is noted
            self._engine.producer.check(topics.get(message.topic), message)
        records = lite.registry_records(messages, user)
        results = await self._engine.producer.send(topics.get, [*records, *messages])
        results = results[len(records):]
        lite.sent(messages, results)
        return results

    async def _store_delayed(self, messages: Sequence[OutgoingMessage], now: int) -> list[SendResult]:
        """A send with delayed messages: those go to the timer, the rest are sent now; the
        results keep the messages' order."""
        delayed = [m for m in messages if m.delivery_ts > now]
        immediate = [m for m in messages if m.delivery_ts <= now]
        for message in immediate:  # all or none accepted: check before the timer stores any
            self._engine.producer.check(self._topics.get(message.topic), message)
        scheduled = iter(await self._engine.timer.schedule(delayed))
        sent = iter(await self._engine.producer.send(self._topics.get, immediate) if immediate else ())
        return [next(scheduled) if m.delivery_ts > now else next(sent) for m in messages]

    async def recall(self, principal: Principal, topic: str, handle: str) -> None:
        """Cancel a delayed message that has not fallen due, by the recall handle its send
        returned; the sender needs the publish right on its topic. NotRecallable when it was
        delivered or recalled already."""
        self._allow(principal, Action.PUBLISH, ResourceKind.TOPIC, topic)
        held_for, bucket, offset = self._engine.timer.check_recall(handle)
        if held_for != topic:
            raise NotRecallable(f"no delayed message of topic {topic!r} has this recall handle")
        await self._engine.timer.recall(bucket, offset)

    async def end_transaction(self, principal: Principal, topic: str, msg_id: str,
                              transaction_id: str, commit: bool) -> None:
        """Commit (deliver) or roll back (drop) the message of an open transaction, by the
        transaction id its send returned; needs the publish right on its topic.
        TransactionNotFound once it was decided or discarded."""
        self._allow(principal, Action.PUBLISH, ResourceKind.TOPIC, topic)
        transactions = self._engine.transactions
        await transactions.end(transactions.check_end(topic, msg_id, transaction_id), commit)

    def set_transaction_checker(self, checker: Checker) -> None:
        """Have ``checker`` ask a producer of the topic to decide a transaction left open
        (``core.transactions``); the adapter that can reach producers sets it."""
        self._engine.transactions.checker = checker

    async def _create_in_order(self, messages: Sequence[OutgoingMessage]) -> None:
        """Create the missing topics of ``messages`` after every earlier send that waited for
        one has appended, so sends are appended in the order they were made: one that finds
        its topics exists does not overtake one still creating (a connection overlapping its
        publishes with their fsyncs relies on this). The caller appends right after, in the same
        event-loop step."""
        previous = self._last_creation
        mine = self._last_creation = asyncio.get_running_loop().create_future()
        try:
            if previous is not None:
                await asyncio.shield(previous)
            for topic in {m.topic for m in messages if m.topic not in self._topics}:
                await self._topics.auto_create(topic)
        finally:
            mine.set_result(None)
            if self._last_creation is mine:
                self._last_creation = None

    def topic_of_subject(self, subject: str) -> str:
        """The topic that stores messages sent with ``subject`` (``core.topic_map``)."""
        return self._engine.subject_topics.topic_of(subject)

    def _authorize_send(self, principal: Principal, message: OutgoingMessage) -> None:
        subject = message.properties.get(SUBJECT_PROPERTY)
        if not subject:
            self._allow(principal, Action.PUBLISH, ResourceKind.TOPIC, message.topic)
            return
        if not self._engine.subject_topics.contains(subject, message.topic):
            raise InvalidArgument(
                f"subject {subject[:200]!r} does not belong to topic {message.topic!r}: a "
                f"subject belongs to topic {self.topic_of_subject(subject)!r}; send it "
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
        that queue is no longer its own; any other client pops every queue of the topic. A
        message an access rule withholds from the caller is settled for the group, like one
        its filter does not match (``withheld_by_rules``).
        """
        self._allow(principal, Action.SUBSCRIBE, ResourceKind.TOPIC, topic)
        config = self._topics.get(topic)
        group_config = await self._group(principal, group)
        selector = parse_filter(expression, expression_type)
        if not 1 <= max_messages <= 1024:
            raise InvalidArgument(f"max_messages {max_messages} is out of range: use 1-1024")
        invisible = self.config.default_invisible_ms if invisible_ms is None else invisible_ms
        if not MIN_INVISIBLE_MS <= invisible <= MAX_INVISIBLE_MS:
            raise InvalidArgument(f"invisible duration {invisible} ms is out of range: use "
                                  f"{MIN_INVISIBLE_MS} ms to 12 h")
        if config.message_type is MessageType.LITE:  # the client's lite topics, each in order
            return await self._lite_receiver.receive(
                group_config, config, client_id, invisible, max_messages, wait_ms,
                lambda: self._allow(principal, Action.SUBSCRIBE, ResourceKind.TOPIC, topic),
                lambda: self.withheld_by_rules(principal))
        return await self._receiver.receive(
            group_config, config, client_id, selector, invisible, max_messages, wait_ms, queue_id,
            lambda: self._allow(principal, Action.SUBSCRIBE, ResourceKind.TOPIC, topic),
            lambda: self.withheld_by_rules(principal))

    def _allow_settling(self, principal: Principal, group: str, topic: str) -> None:
        self._allow(principal, Action.SUBSCRIBE, ResourceKind.TOPIC, topic)
        self._allow(principal, Action.SUBSCRIBE, ResourceKind.GROUP, group)
        self._topics.get(topic)

    async def ack(self, principal: Principal, group: str, topic: str, receipt_handle: str) -> None:
        """Settle a popped message; ReceiptExpired if its invisible duration had ended."""
        self._allow_settling(principal, group, topic)
        if is_lite_handle(receipt_handle):
            self._lite_receiver.ack(group, topic, receipt_handle)
        else:
            self._receiver.ack(group, topic, receipt_handle)

    async def change_invisible(self, principal: Principal, group: str, topic: str,
                               receipt_handle: str, invisible_ms: int) -> str:
        """Hide a popped message for ``invisible_ms`` from now; return its new receipt handle."""
        if not 0 <= invisible_ms <= MAX_INVISIBLE_MS:
            raise InvalidArgument(f"invisible duration {invisible_ms} ms is out of range: use 0 to 12 h")
        self._allow_settling(principal, group, topic)
        if is_lite_handle(receipt_handle):
            return self._lite_receiver.change_invisible(group, topic, receipt_handle, invisible_ms)
        return self._receiver.change_invisible(group, topic, receipt_handle, invisible_ms)

    async def forward_to_dead_letter(self, principal: Principal, group: str, topic: str,
                                     receipt_handle: str) -> None:
        """Move a popped message to the group's dead-letter topic and settle it."""
        self._allow_settling(principal, group, topic)
        if is_lite_handle(receipt_handle):
            await self._lite_receiver.forward_to_dead_letter(group, topic, receipt_handle)
        else:
            await self._receiver.forward_to_dead_letter(group, topic, receipt_handle)

    def trace_push(self, group: str, message: Delivery, event: str, detail: str) -> None:
        """Record a push subscription's step with ``message`` (``core.trace.PUSH_EVENTS``) in
        its trace, when message tracing is on."""
        tracer = self._engine.tracer
        if tracer.on:
            tracer.pushed(group, message, event, detail)

    # --- queue-level consumption and offsets ---

    async def pull(self, principal: Principal, group: str, topic: str, queue_id: int, offset: int, *,
                   max_messages: int = 32, wait_ms: int = 0, expression: str = "*",
                   expression_type: str = "TAG") -> PullResult:
        """Read a queue by offset, waiting up to ``wait_ms`` when there is nothing new.
        Messages an access rule withholds from the caller are skipped; the next offset moves
        past them."""
        self._allow(principal, Action.SUBSCRIBE, ResourceKind.TOPIC, topic)
        config = self._topics.get(topic)
        _check_queue(config, queue_id)
        selector = parse_filter(expression, expression_type)
        if not 1 <= max_messages <= 10_000:
            raise InvalidArgument(f"max_messages {max_messages} is out of range: use 1-10000")
        engine = self._engine
        deadline = now_ms() + min(max(0, wait_ms), self.config.max_long_poll_ms)
        while True:
            messages, next_offset, earliest, end = pull_queue(
                engine.reader, topic, queue_id, offset, max_messages, selector,
                self.withheld_by_rules(principal))
            now = now_ms()
            if messages or now >= deadline or engine.closing:
                engine.count_out(topic, messages)
                return PullResult(messages, next_offset, earliest, end)
            offset = next_offset
            await engine.signals.wait((topic,), (deadline - now) / 1000)
            self._allow(principal, Action.SUBSCRIBE, ResourceKind.TOPIC, topic)  # revoked meanwhile?

    def commit_offset(self, principal: Principal, group: str, topic: str, queue_id: int, offset: int,
                      client_id: str = "") -> None:
        """Record that ``group`` has consumed ``topic``/``queue_id`` up to ``offset``."""
        self._allow(principal, Action.SUBSCRIBE, ResourceKind.GROUP, group)
        self._allow(principal, Action.SUBSCRIBE, ResourceKind.TOPIC, topic)
        _check_queue(self._topics.get(topic), queue_id)
        if offset < 0:
            raise InvalidArgument(f"offset {offset} is negative")
        consumer = self._groups.consumer(group, client_id)
        self._engine.cursors.open((consumer, topic, queue_id), offset).reset(offset)

    def committed_offset(self, principal: Principal, group: str, topic: str, queue_id: int,
                         client_id: str = "") -> int:
        """The group's committed offset in a queue; -1 if it has none."""
        self._allow(principal, Action.SUBSCRIBE, ResourceKind.GROUP, group)
        _check_queue(self._topics.get(topic), queue_id)
        cursor = self._engine.cursors.get((self._groups.consumer(group, client_id), topic, queue_id))
        return -1 if cursor is None else cursor.committed

    def offset_at(self, topic: str, queue_id: int, where: str | int) -> int:
        """``'earliest'``, ``'latest'`` or a timestamp in ms: the queue offset there."""
        _check_queue(self._topics.get(topic), queue_id)
        earliest, end = self._engine.reader.range(topic, queue_id)
        if where == "earliest":
            return earliest
        if where == "latest":
            return end
        if isinstance(where, int):
            return min(end, max(earliest, self._engine.store.offset_for_time(topic, queue_id, where)))
        raise InvalidArgument(f"offset position {where!r} is not 'earliest', 'latest' or a timestamp")

    async def reset_offsets(self, principal: Principal, group: str, topic: str,
                            timestamp_ms: int) -> dict[int, int]:
        """Move the group's position in every queue of ``topic`` to ``timestamp_ms``."""
        self._allow(principal, Action.ADMIN, ResourceKind.GROUP, group)
        self._groups.get(group)
        config = self._topics.get(topic)
        cursors = self._engine.cursors
        moved = {}
        for q in range(config.queue_count):
            offset = self.offset_at(topic, q, timestamp_ms)
            for consumer in self._groups.consumers(group, topic) or {group}:
                cursors.open((consumer, topic, q), offset).reset(offset)
            moved[q] = offset
        self._engine.signals.notify(topic)
        return moved

    def lag(self, group: str) -> list[QueueLag]:
        """The group's committed offset, end and in-flight count for every queue it consumes."""
        reader, topics = self._engine.reader, self._topics
        return [QueueLag(topic, q, cursor.committed, reader.range(topic, q)[1], len(cursor.inflight))
                for (consumer, topic, q), cursor in sorted(self._engine.cursors.cursors.items())
                if (consumer == group or consumer.startswith(group + "@")) and topic in topics]

    # --- lookup ---

    def lookup_messages(self, principal: Principal, msg_id: str, topic: str = "") -> list[Delivery]:
        """The messages with id ``msg_id`` that ``principal`` may read, newest first: those of
        ``topic``, or of every topic it may subscribe to (at most ``ID_LOOKUP_PER_TOPIC`` of
        each). Producers choose ids, so several messages may share one: each topic is searched
        on its own and none hides another's; those an access rule withholds from the caller are
        left out. MessageNotFound when there is none; AccessDenied
        for a ``topic`` it may not read."""
        if topic:
            self._allow(principal, Action.SUBSCRIBE, ResourceKind.TOPIC, topic)
            topics = [topic]
        else:
            topics = [t.name for t in self._topics.list()
                      if self.allowed(principal, Action.SUBSCRIBE, t.name)]
        found = [to_delivery(m) for m in self._engine.store.lookup_id(msg_id, topics, ID_LOOKUP_PER_TOPIC)]
        withheld = self.withheld_by_rules(principal)
        if withheld is not None:  # as if absent: a rule's subjects are not even confirmed
            found = [m for m in found if not withheld(m)]
        if not found:
            raise MessageNotFound(f"no message has id {msg_id!r}; it may have aged out with retention")
        return found

    async def trace_message(self, principal: Principal, msg_id: str, topic: str = "") -> MessageTrace:
        """The message with id ``msg_id`` and what happened to it since it was stored
        (``core.trace``): the newest ``lookup_messages`` finds, the others listed beside it.
        PreconditionFailed while tracing is off."""
        newest, *others = self.lookup_messages(principal, msg_id, topic)
        if not self._engine.tracer.on:
            raise PreconditionFailed("message tracing is off on this broker; set "
                                     "core.message_trace = true (SLUICE_CORE_MESSAGE_TRACE=true) "
                                     "and restart it; messages delivered from then on are traced")
        return await self._engine.tracer.trace(newest, others)

    def find_in_time(self, principal: Principal, topic: str, start_ms: int, end_ms: int,
                     limit: int = 32) -> list[Delivery]:
        """Messages of ``topic`` stored from ``start_ms`` to ``end_ms`` (inclusive), oldest
        first, at most ``limit`` (1-``MAX_LOOKUP_LIMIT``): each queue is entered at its first
        message stored at or after ``start_ms`` (the consume queue's time index) and read
        forward. Messages an access rule withholds from the caller are left out."""
        self._allow(principal, Action.SUBSCRIBE, ResourceKind.TOPIC, topic)
        config = self._topics.get(topic)
        if end_ms < start_ms:
            raise InvalidArgument(f"the range ends ({end_ms}) before it starts ({start_ms})")
        _check_limit(limit)
        reader, store = self._engine.reader, self._engine.store
        withheld = self.withheld_by_rules(principal)
        found: list[Delivery] = []
        for queue_id in range(config.queue_count):
            earliest, end = reader.range(topic, queue_id)
            offset = max(earliest, store.offset_for_time(topic, queue_id, start_ms))
            taken = 0
            while offset < end and taken < limit:
                try:
                    batch = reader.read(topic, queue_id, offset, min(64, end - offset))
                except CorruptMessage:
                    offset += 1  # logged by the reader; the rest of the range is still found
                    continue
                if not batch:
                    break
                in_range = [m for m in batch if m.store_ts <= end_ms]
                readable = in_range if withheld is None else [m for m in in_range if not withheld(m)]
                found += readable
                taken += len(readable)
                if len(in_range) < len(batch):
                    break
                offset = batch[-1].queue_offset + 1
        found.sort(key=lambda m: (m.store_ts, m.queue_id, m.queue_offset))
        return found[:limit]

    def lookup_key(self, principal: Principal, topic: str, key: str, limit: int = 32,
                   after: str = "") -> MessagePage:
        """Messages of ``topic`` carrying business key ``key``, newest first, at most ``limit``
        (1-``MAX_LOOKUP_LIMIT``); with ``after`` (a page's ``next``), those older than that page.
        Messages an access rule withholds from the caller are left out (a page may come short)."""
        self._allow(principal, Action.SUBSCRIBE, ResourceKind.TOPIC, topic)
        self._topics.get(topic)
        _check_limit(limit)
        try:
            cursor = _parse_cursor(after) if after else None
            page = self._engine.store.lookup_key_page(topic, key, limit, cursor)
        except InvalidCursorError:
            raise InvalidArgument(f"cursor {after[:40]!r} does not continue a lookup of key "
                                  f"{key[:80]!r} in this topic; start again without it") from None
        following = page.next
        found = [to_delivery(m) for m in page.messages]
        withheld = self.withheld_by_rules(principal)
        return MessagePage(found if withheld is None else [m for m in found if not withheld(m)],
                           f"{following.offset}.{following.entry}" if following else "")


class MessagePage(NamedTuple):
    """A page of a lookup, newest first."""

    messages: list[Delivery]
    next: str
    """Pass as ``after`` for the next page; empty when no more follow."""


def _parse_cursor(text: str) -> KeyCursor:
    offset, dot, entry = text.partition(".")
    if not (dot and text.isascii() and offset.isdigit() and entry.isdigit() and len(text) <= 40):
        raise InvalidArgument(f"cursor {text[:40]!r} is malformed: pass the next value a lookup "
                              "returned, as it was")
    return KeyCursor(int(offset), int(entry))


def _check_limit(limit: int) -> None:
    if not 1 <= limit <= MAX_LOOKUP_LIMIT:
        raise InvalidArgument(f"limit {limit} is out of range: use 1-{MAX_LOOKUP_LIMIT}")


def _check_queue(config: TopicConfig, queue_id: int) -> None:
    if not 0 <= queue_id < config.queue_count:
        raise InvalidArgument(f"queue {queue_id} does not exist in topic {config.name!r}, "
                              f"which has queues 0-{config.queue_count - 1}")
