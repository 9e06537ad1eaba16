"""Compacted state: the newest value per key of a compacted topic or queue, kept in the store.

Adapters keep what must survive a restart here (MQTT sessions and retained messages): a put is
a message keyed by the state key (an empty value deletes the key), and compaction keeps the
newest one per key. Topics whose names start with ``%SYS%`` are internal: no user reaches them
through the client API. Runs on the event loop.
"""

from __future__ import annotations

from .consume import to_delivery
from .engine import Engine
from .model import Delivery, OutgoingMessage, TopicConfig


class StateStore:
    """Compacted topics and queues holding adapters' state."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    async def ensure_compacted(self, topic: str) -> None:
        """Create internal compacted topic ``topic`` (one queue) if it does not exist."""
        await self._engine.topics.ensure(TopicConfig(topic, queue_count=1, compacted=True))

    def enable_compacted_queue(self, queue: str) -> None:
        """Keep the newest message per key of named queue ``queue`` (see ``load``)."""
        self._engine.store.enable_compaction(queue)

    async def put(self, topic: str, key: str, value: bytes) -> None:
        """Store ``value`` under ``key`` in compacted topic ``topic``; empty deletes the key.
        Returns once durable under ``sync`` flush."""
        engine = self._engine
        await engine.producer.send(engine.topics.get, [OutgoingMessage(topic, value, keys=(key,),
                                                                       queue_id=0)])

    def load(self, topic: str) -> list[Delivery]:
        """The newest live message per key of compacted topic or queue ``topic``, oldest first."""
        return [to_delivery(m) for m in self._engine.store.compacted(topic)]
