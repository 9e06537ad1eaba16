"""The write path: validate messages, choose queues, append, and publish what became deliverable.

Queue consumers only ever see messages that can no longer vanish: under the ``sync`` flush
policy a message becomes deliverable once durable, under ``async`` once written to the log.
Until then it is neither served to consumers nor counted in the queue's deliverable range.

Live listeners (connected non-persistent MQTT sessions, admin tails) keep nothing and promise
nothing across a crash, so they get a message right after its append, in the loop iteration
that put it in the log's write buffer, while its producer still waits for the fsync. The
exception is a message published for exactly-once delivery (MQTT QoS 2): a subscriber may
not see it twice, which a resend after a crash would cause, so it reaches live listeners once
deliverable, and the messages appended after it wait behind it to keep their order.

Runs on the event loop; not thread-safe.
"""

from __future__ import annotations

import itertools
import logging
import time
import zlib
from collections import Counter
from collections.abc import Callable, Mapping, Sequence

from store.api import AppendResult, Message, Store

from .bounded_cache import IdentityCache
from .delivery import RecentMessages, TopicSignals
from .durable import BatchingAppender, DurableWaiters
from .errors import InvalidArgument, MessageTooLarge
from .fanout import Fanout, Listener
from .interop import MQTT_QOS
from .model import (LITE_KEY_PREFIX, LITE_PROPERTY, MAX_LITE_TOPIC_LENGTH, MESSAGE_GROUP_PROPERTY,
                    SUBJECT_PROPERTY, Delivery, MessageType,
                    OutgoingMessage, SendResult, SharedProperties, TopicConfig)
from .topic_map import SubjectTopics

log = logging.getLogger(__name__)

MAX_PROPERTY_BYTES = 16 << 10
MAX_KEY_BYTES = 16 << 10
"""UTF-8 bytes of a message's keys together (business keys, compacted state keys such as an
MQTT session's client id); the store's limit is 64 KB."""
SHARED_CHECKED_BYTES = 4 << 20
"""What the checks of `SharedProperties` kept by `Producer` may hold."""
_CHECKED_OVERHEAD = 200
EXACTLY_ONCE = "2"
"""The stored ``mqtt.qos`` of a message published for exactly-once delivery."""


class Producer:
    """Appends messages for every adapter and tracks each queue's deliverable end."""

    def __init__(self, store: Store, waiters: DurableWaiters, recent: RecentMessages,
                 signals: TopicSignals, fanout: Fanout, subject_topics: SubjectTopics, *,
                 durable: bool,
                 max_message_bytes: int) -> None:
        self._store = store
        self._fanout = fanout
        self._subject_topics = subject_topics
        self._live: dict[int, tuple[Listener, ...]] = {}
        """id(prepared message) -> the listeners its subject reached, until it is appended."""
        self._held_back = 0
        """Batches whose live deliveries wait until deliverable (see `_appended`)."""
        self._waiters = waiters
        self._recent = recent
        self._signals = signals
        self._durable = durable
        self.max_message_bytes = max_message_bytes
        self._appender = BatchingAppender(store, waiters, durable=durable, on_batch=self._appended)
        self._deliverable: dict[tuple[str, int], int] = {}
        self._round_robin: dict[str, itertools.count] = {}
        self._shared_checked: IdentityCache[SharedProperties, tuple[TopicConfig, int]] = \
            IdentityCache(SHARED_CHECKED_BYTES)
        """SharedProperties -> (the topic configuration they were checked against, their
        queue): checked and placed once, not per message."""
        self.counters: Counter[tuple[str, str]] = Counter()
        """(metric, topic) -> count: ``messages_in`` and ``bytes_in``."""

    def deliverable_end(self, topic: str, queue_id: int) -> int:
        """One past the newest offset of the queue that consumers may see."""
        end = self._deliverable.get((topic, queue_id))
        return self._store.queue_range(topic, queue_id)[1] if end is None else end

    async def send(self, topics: Callable[[str], TopicConfig], messages: Sequence[OutgoingMessage]) -> list[SendResult]:
        """Store ``messages`` (validated first, all or none accepted); return where they landed."""
        prepared = [self._prepare(topics(m.topic), m) for m in messages]
        try:
            results = await self._appender.append_many(prepared)
        finally:
            if self._live:
                for message in prepared:
                    self._live.pop(id(message), None)
        return [SendResult(r.msg_id, r.topic, r.queue_id, r.queue_offset, r.store_ts) for r in results]

    def check(self, topic: TopicConfig, message: OutgoingMessage) -> None:
        """Refuse ``message`` for ``topic`` as a send would, without storing it (the timer
        checks a delayed message when it is sent, not when it falls due)."""
        self._check_message(topic, message)
        self._check_properties(topic, message.properties)
        if message.queue_id is not None:
            self._queue_for(topic, message)

    async def append_internal(self, messages: list[Message]) -> list[AppendResult]:
        """Append records of the broker's own (the timer's), reaching no subscriber; return
        once durable under ``sync`` flush."""
        return await self._appender.append_many(messages)

    def _check_message(self, topic: TopicConfig, message: OutgoingMessage) -> None:
        size = len(message.body)
        if size > self.max_message_bytes:
            raise MessageTooLarge(
                f"message body of {size} bytes exceeds the limit of {self.max_message_bytes} bytes; "
                "split it, or raise core.max_message_bytes in the broker config")
        if (topic.message_type is MessageType.TRANSACTION) != message.transactional:
            raise InvalidArgument(
                f"topic {topic.name!r} takes only messages sent within a transaction"
                if not message.transactional else
                f"topic {topic.name!r} is not transactional; send transactional messages to a "
                "topic created with message type TRANSACTION")
        if (topic.message_type is MessageType.LITE) != bool(message.lite_topic):
            raise InvalidArgument(
                f"topic {topic.name!r} is a lite topic's parent: every message names its lite topic"
                if not message.lite_topic else
                f"topic {topic.name!r} is not of message type LITE; send messages with a lite topic "
                "to a topic created with message type LITE")
        if message.lite_topic:
            _check_lite_topic(message)
        if message.priority is not None:
            if topic.message_type is not MessageType.PRIORITY:
                raise InvalidArgument(f"topic {topic.name!r} is not a priority topic; send messages "
                                      "with a priority to a topic created with message type PRIORITY")
            if message.priority < 0 or message.delivery_ts:
                raise InvalidArgument("a message priority is 0 or more, and a priority message "
                                      "cannot also be delayed")
        if message.keys and sum(len(key.encode()) for key in message.keys) > MAX_KEY_BYTES:
            raise InvalidArgument(f"message keys exceed {MAX_KEY_BYTES} bytes (UTF-8); use "
                                  "shorter keys (a client id or topic used as a key counts)")

    def _prepare(self, topic: TopicConfig, message: OutgoingMessage) -> Message:
        self._check_message(topic, message)
        properties = message.properties  # stored as given: senders hand over a fresh mapping
        keys = tuple(message.keys)
        if type(properties) is SharedProperties and message.queue_id is None \
                and not message.message_group and not message.lite_topic:
            checked = self._shared_checked.get(properties)
            if checked is None or checked[0] is not topic:
                checked = self._check_shared(topic, properties)
            queue_id = checked[1]
        else:
            if message.message_group:
                properties = {**properties, MESSAGE_GROUP_PROPERTY: message.message_group}
            if message.lite_topic:  # found through the key index (``core.lite``)
                properties = {**properties, LITE_PROPERTY: message.lite_topic}
                keys += (LITE_KEY_PREFIX + message.lite_topic,)
            self._check_properties(topic, properties)
            queue_id = self._queue_for(topic, message)
        subject = properties.get(SUBJECT_PROPERTY)
        route = self._fanout.route(subject or topic.name)
        extra = route.queues
        if message.also_into:  # a queue both bound to the subject and named is indexed once
            routed = set(extra)
            extra += tuple((queue, 0) for queue in message.also_into if (queue, 0) not in routed)
        prepared = Message(topic.name, message.body, queue_id, message.tag,
                           keys, properties or None, message.msg_id,
                           message.born_ts or int(time.time() * 1000), extra)
        if route.listeners:
            self._live[id(prepared)] = route.listeners
        return prepared

    def _check_properties(self, topic: TopicConfig, properties: Mapping[str, str]) -> None:
        """InvalidArgument for properties too large, or a subject outside ``topic``."""
        if sum(map(len, properties)) + sum(map(len, properties.values())) > MAX_PROPERTY_BYTES:
            raise InvalidArgument(f"message properties exceed {MAX_PROPERTY_BYTES} bytes; keep "
                                  "large data in the body")
        subject = properties.get(SUBJECT_PROPERTY)
        if subject and not self._subject_topics.contains(subject, topic.name):
            raise InvalidArgument(f"subject {subject[:200]!r} does not belong to topic "
                                  f"{topic.name!r}; a subject's first level names its topic")

    def _check_shared(self, topic: TopicConfig, properties: SharedProperties) -> tuple[TopicConfig, int]:
        """Check properties shared by many messages once per topic configuration (it names the
        queue count), and choose their queue: the subject's, as `_queue_for` does."""
        self._check_properties(topic, properties)
        subject = properties.get(SUBJECT_PROPERTY)
        queue_id = zlib.crc32(subject.encode()) % topic.queue_count if subject \
            else self._queue_for(topic, OutgoingMessage(topic.name, b"", properties=properties))
        checked = (topic, queue_id)
        if subject:  # a round-robin choice is not one to keep
            self._shared_checked.put(properties, checked, 2 * len(subject) + _CHECKED_OVERHEAD)
        return checked

    def _queue_for(self, topic: TopicConfig, message: OutgoingMessage) -> int:
        if topic.message_type is MessageType.PRIORITY:  # the queue is the priority
            return min(message.priority or 0, topic.queue_count - 1)
        if message.lite_topic:  # one lite topic stays in one queue, in order
            return zlib.crc32(message.lite_topic.encode()) % topic.queue_count
        if message.queue_id is not None:
            if not 0 <= message.queue_id < topic.queue_count:
                raise InvalidArgument(f"queue {message.queue_id} does not exist in topic "
                                      f"{topic.name!r}, which has queues 0-{topic.queue_count - 1}")
            return message.queue_id
        if message.message_group:
            return zlib.crc32(message.message_group.encode()) % topic.queue_count
        subject = message.properties.get(SUBJECT_PROPERTY)
        if subject:  # one subject stays in one queue, so readers of the queue see it in order
            return zlib.crc32(subject.encode()) % topic.queue_count
        counter = self._round_robin.get(topic.name)
        if counter is None:
            counter = self._round_robin[topic.name] = itertools.count()
        return next(counter) % topic.queue_count

    def _appended(self, messages: list[Message], results: list[AppendResult]) -> None:
        """On the loop, right after an append: cache the messages, hand them to live listeners
        (see the module docstring), publish them to queues once deliverable."""
        deliverable = self._deliverable
        touched: dict[tuple[str, int], int] = {}
        live_now: list[tuple[tuple[Listener, ...], Delivery]] = []
        held: list[tuple[tuple[Listener, ...], Delivery]] = []
        recent = self._recent
        counts: Counter[str] = Counter()
        sizes: Counter[str] = Counter()
        for message, result in zip(messages, results):
            key = (result.topic, result.queue_id)
            if key not in deliverable:
                deliverable[key] = result.queue_offset
            touched[key] = result.queue_offset + 1
            properties = message.properties or {}
            delivery = Delivery(result.topic, result.queue_id, result.queue_offset, result.msg_id,
                                message.body, message.tag, tuple(message.keys), properties,
                                message.born_ts, result.store_ts)
            recent.add(delivery)
            for queue, queue_id, offset in result.extra:
                key = (queue, queue_id)
                if key not in deliverable:
                    deliverable[key] = offset
                touched[key] = offset + 1
                recent.add(Delivery(queue, queue_id, offset, result.msg_id, message.body,
                                    message.tag, delivery.keys, properties, message.born_ts,
                                    result.store_ts, home_topic=result.topic))
            if self._live and (listeners := self._live.pop(id(message), None)):
                if held or self._held_back or properties.get(MQTT_QOS) == EXACTLY_ONCE:
                    held.append((listeners, delivery))
                else:
                    live_now.append((listeners, delivery))
            counts[result.topic] += 1
            sizes[result.topic] += len(message.body)
        for topic, count in counts.items():
            self.counters["messages_in", topic] += count
            self.counters["bytes_in", topic] += sizes[topic]
        if live_now:
            _deliver(live_now)
        if held:
            self._held_back += 1
        publish = self._waiters.call_when_durable if self._durable else self._waiters.call_when_visible
        publish(results[-1].end_offset, lambda: self._publish(touched, held))

    def _publish(self, touched: dict[tuple[str, int], int],
                 held: list[tuple[tuple[Listener, ...], Delivery]]) -> None:
        """Once deliverable: extend the queues' deliverable ranges, wake their consumers, and
        hand live listeners what was held back."""
        topics = set()
        for key, end in touched.items():
            if end > self._deliverable[key]:
                self._deliverable[key] = end
            topics.add(key[0])
        for topic in topics:
            self._signals.notify(topic)
        if held:
            self._held_back -= 1
            _deliver(held)


def _check_lite_topic(message: OutgoingMessage) -> None:
    name = message.lite_topic
    if len(name) > MAX_LITE_TOPIC_LENGTH or not name.isprintable():
        raise InvalidArgument(f"lite topic {name[:40]!r} is not 1-{MAX_LITE_TOPIC_LENGTH} printable "
                              "characters")
    if message.delivery_ts or message.message_group or message.priority is not None:
        raise InvalidArgument("a message with a lite topic cannot also be delayed, grouped or "
                              "prioritized: its lite topic orders it")
    if any(key.startswith(LITE_KEY_PREFIX) for key in message.keys):
        raise InvalidArgument(f"message keys may not start with {LITE_KEY_PREFIX!r}")


def _deliver(live: list[tuple[tuple[Listener, ...], Delivery]]) -> None:
    """Hand each delivery to its listeners; one failing listener never stops the others."""
    for listeners, delivery in live:
        for listener in listeners:
            try:
                listener.deliver(delivery)
            except Exception:  # noqa: BLE001 - a listener's bug must not fail the producers
                log.exception("live listener %r failed; the other listeners go on", listener)
