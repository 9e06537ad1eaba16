"""What core's faces share: one store with its writer and reader, the topic and group
registries, cursors, fan-out, the delay timer, open transactions, lite topics, the message tracer, and the
timers that save offsets, expire members and apply retention, and the tiering loop.

``core.assembly.Core`` builds one and hands it to the faces (``Broker``, ``NamedQueues``,
``StateStore``); adapters never see it. Runs on the event loop; not thread-safe.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from typing import TYPE_CHECKING

from store.api import RetentionReport, Store
from store.errors import StoreError

from . import clock
from .consume import Reader
from .cursors import CursorBook
from .delivery import RecentMessages, TopicSignals
from .delivered_marks import MARKS_TOPIC as DELIVERED_MARKS_TOPIC
from .errors import SluiceError
from .durable import DurableWaiters
from .fanout import Fanout
from .groups import Groups
from .memory_alarm import MemoryAlarm, watermark_bytes
from .metadata import MetadataRepository
from .model import INTERNAL_PREFIX, Delivery, OutgoingMessage, TopicConfig
from .produce import Producer
from .routing import TopicSyntax
from .settings import CoreConfig
from .timer import MARK_TOPIC as TIMER_MARK_TOPIC, DelayTimer
from .topic_map import SubjectTopics
from .topics import Topics
from .lite import LiteTopics
from .trace import Tracer
from .transactions import Transactions

if TYPE_CHECKING:
    from .tiering import TieringLoop

log = logging.getLogger(__name__)


OFFSETS_TOPIC = INTERNAL_PREFIX + "offsets"
"""Where consumer offsets live with ``replicated_state``: one record per consumer, compacted."""


class Engine:
    """Core's shared state over one store and one metadata repository.

    ``await start()`` on the event loop that will use it, ``await close()`` before closing the
    store. ``producer`` and ``reader`` exist once started.
    """

    def __init__(self, store: Store, metadata: MetadataRepository, data_dir: str,
                 config: CoreConfig, *, flush: str, subject_syntax: TopicSyntax,
                 subject_topics: SubjectTopics) -> None:
        self.store = store
        self.metadata = metadata
        self.config = config
        self._durable_sends = flush == "sync"
        self.cursors = CursorBook(data_dir, from_file=not config.replicated_state)
        self._data_dir = data_dir
        self.recent = RecentMessages(config.recent_cache_bytes)
        self.memory = MemoryAlarm(watermark_bytes(config.memory_high_watermark))
        self.signals = TopicSignals()
        self.fanout = Fanout(subject_syntax)
        self.tracer = Tracer(store, on=config.message_trace)
        self.subject_topics = subject_topics
        self.topics = Topics(store, metadata, config)
        self.groups = Groups(metadata, config, self.cursors)
        self.closing = False
        """Shutting down: long polls answer at once and sends are refused."""
        self.counters: Counter[tuple[str, str]] = Counter()
        """(metric, topic or group) -> count: ``messages_in``, ``bytes_in``, ``messages_out``,
        ``bytes_out`` per topic and ``dead_lettered`` per group."""
        self.producer: Producer
        self.waiters: DurableWaiters
        self.reader: Reader
        self.timer: DelayTimer
        self.transactions: Transactions
        self.lite: LiteTopics
        self._retention_floors: dict[tuple[str, int], int] = {}
        """(topic, queue) -> first offset within the topic's own retention limit."""
        self._tasks: list[asyncio.Task] = []
        self.tiering: TieringLoop | None = None
        """Copies sealed segments to the object store, when the composition root sets one up
        before ``start``."""

    async def start(self) -> None:
        """Load metadata; start the writer, the reader and the timers. Runs on the loop."""
        loop = asyncio.get_running_loop()
        store = self.store
        durable = store.durable_offset
        waiters = self.waiters = DurableWaiters(loop, durable,
                                                getattr(store, "visible_offset", durable))
        store.add_listener(waiters.listener)
        store.add_health_listener(waiters.health_listener)
        waiters.store_health(store.degraded)
        self.producer = Producer(store, waiters, self.recent, self.signals, self.fanout,
                                 self.subject_topics, durable=self._durable_sends,
                                 max_message_bytes=self.config.max_message_bytes)
        self.counters = self.producer.counters
        self.reader = Reader(store, self.recent, self.producer.deliverable_end,
                             self._retention_floors)
        if self.config.replicated_state:
            for topic in (TIMER_MARK_TOPIC, DELIVERED_MARKS_TOPIC):
                await self.topics.ensure(TopicConfig(topic, queue_count=1, compacted=True))
        self.timer = DelayTimer(self.producer, self.reader, self.topics.get, self._data_dir,
                                self.config.max_delay_ms,
                                marks_in_log=store if self.config.replicated_state else None)
        waiters.health_watchers.append(self.timer.store_health)
        self.timer.store_health(waiters.store_failure)
        metadata = self.metadata
        topics, groups, subscriptions = await asyncio.to_thread(
            lambda: (metadata.list_topics(), metadata.list_groups(), metadata.list_subscriptions()))
        self.topics.load(topics)
        queues = await asyncio.to_thread(store.queues)
        if self.config.replicated_state:
            await self._adopt_log_topics(queues)
            await self._load_offsets()
        self.groups.load(groups, subscriptions)
        self.memory.start()
        self.timer.start(queues)
        self.transactions = Transactions(self.producer, self.reader, store.lookup_id,
                                         self.topics.get, self._data_dir, self.config)
        await self.transactions.start()
        self.lite = LiteTopics(store, self.producer, self.topics, self.config)
        await self.lite.start()
        self.tracer.start(self.producer, self.reader)
        self._tasks = [asyncio.create_task(self.groups.expire_members()),
                       asyncio.create_task(self._commit_offsets()),
                       asyncio.create_task(self._retain())]
        if self.tiering is not None:
            await self.tiering.start(self.apply_retention)

    def begin_shutdown(self) -> None:
        """Answer every pending long poll at once and refuse new sends; acks still count."""
        self.closing = True
        self.signals.notify_all()

    async def close(self) -> None:
        """Stop timers, wake every long poll with an empty answer, persist offsets. Closes only
        what ``start`` got to, if it failed part way."""
        self.begin_shutdown()
        self.memory.stop()
        for part in ("timer", "transactions", "lite"):
            started = getattr(self, part, None)
            if started is not None:
                await started.close()
        await self.tracer.close()
        if self.tiering is not None:
            await self.tiering.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self.signals.notify_all()
        if not hasattr(self, "producer"):
            return
        try:
            if self.config.replicated_state:
                await self._store_offsets()
            else:
                self.cursors.write(self.cursors.snapshot())
        except (OSError, SluiceError, StoreError) as error:  # a full disk, or too few replicas
            log.error("could not save consumer offsets at shutdown (%s); consumers resume from "
                      "the offsets saved last and get some messages again", error)

    def count_out(self, topic: str, deliveries: list[Delivery]) -> None:
        """Count messages handed to consumers of ``topic``."""
        if deliveries:
            self.counters["messages_out", topic] += len(deliveries)
            self.counters["bytes_out", topic] += sum(len(d.body) for d in deliveries)

    async def apply_retention(self, now_ms: int | None = None) -> RetentionReport:
        """Run the store's retention (whole segments, off the loop), then hide messages older
        than each topic's own ``retention_ms`` from its consumers."""
        now = clock.now_ms() if now_ms is None else now_ms
        report = await asyncio.to_thread(self.store.apply_retention, now)
        if report.deleted_segments:
            log.info("retention deleted %d segments (%d bytes); the log now starts at offset %d",
                     len(report.deleted_segments), report.deleted_bytes, report.log_min_offset)
        self._retention_floors.update(self.topics.retention_floors(now))
        return report

    async def _adopt_log_topics(self, queues: list[tuple[str, int]]) -> None:
        """Know every topic the log holds (``replicated_state``): one created on another node
        is missing from this node's metadata database."""
        counts: dict[str, int] = {}
        for topic, queue_id in queues:
            counts[topic] = max(counts.get(topic, 0), queue_id + 1)
        for topic, count in sorted(counts.items()):
            if topic not in self.topics and not topic.startswith(INTERNAL_PREFIX):
                log.warning("topic %r is in the replicated log but not in this node's metadata: taken "
                            "with its %d queues and default settings", topic, count)
                await self.topics.ensure(TopicConfig(topic, queue_count=count))

    async def _load_offsets(self) -> None:
        """Take the consumer offsets stored in the log (``replicated_state``)."""
        await self.topics.ensure(TopicConfig(OFFSETS_TOPIC, queue_count=1, compacted=True))
        for stored in await asyncio.to_thread(self.store.compacted, OFFSETS_TOPIC):
            if stored.body and stored.keys:
                self.cursors.load_consumer(stored.keys[0], stored.body)

    async def _store_offsets(self) -> None:
        """Append a record for each consumer whose offsets changed; return once durable."""
        changed = self.cursors.changed_consumers()
        if not changed:
            return
        await self.producer.send(self.topics.get, [OutgoingMessage(OFFSETS_TOPIC, data, keys=(consumer,), queue_id=0)
                                                   for consumer, data in changed.items()])
        for consumer, data in changed.items():
            self.cursors.stored(consumer, data)

    async def _commit_offsets(self) -> None:
        period = self.config.offset_commit_interval_ms / 1000
        failing = False
        while True:
            await asyncio.sleep(period)
            try:
                if self.config.replicated_state:
                    await self._store_offsets()
                else:
                    await asyncio.to_thread(self.cursors.write, self.cursors.snapshot())
            except (OSError, SluiceError, StoreError) as error:  # a full disk, too few replicas: logged once, retried
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
