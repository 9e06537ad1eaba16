"""The topic registry: every topic's settings, in memory and in the metadata database.

No authorization here: the faces that call it (``Broker``, ``StateStore``) decide first.
Runs on the event loop; not thread-safe (metadata writes go to a thread).
"""

from __future__ import annotations

import asyncio
import logging
from typing import NamedTuple

from store.api import Store

from .errors import AlreadyExists, InvalidArgument, TopicNotFound
from .metadata import MetadataRepository
from .model import INTERNAL_PREFIX, TopicConfig
from .settings import CoreConfig

log = logging.getLogger(__name__)


class TopicRoute(NamedTuple):
    """What a route lookup answers: the topic's settings, and whether it exists yet (a topic
    that does not is one a first send would create, with these settings)."""

    config: TopicConfig
    exists: bool


class Topics:
    """Topic name -> settings, loaded at start and kept in step with the metadata database."""

    def __init__(self, store: Store, metadata: MetadataRepository, config: CoreConfig) -> None:
        self._store = store
        self._metadata = metadata
        self._config = config
        self._topics: dict[str, TopicConfig] = {}

    def load(self, topics: list[TopicConfig]) -> None:
        """Start from the topics the metadata database holds."""
        self._topics = {t.name: t for t in topics}

    def __contains__(self, name: str) -> bool:
        return name in self._topics

    def get(self, name: str) -> TopicConfig:
        """The topic's settings; TopicNotFound if there is none."""
        topic = self._topics.get(name)
        if topic is None:
            raise TopicNotFound(name)
        return topic

    def list(self) -> list[TopicConfig]:
        """Every topic, by name."""
        return sorted(self._topics.values(), key=lambda t: t.name)

    async def create(self, config: TopicConfig) -> TopicConfig:
        """Create a topic; AlreadyExists if the name is taken."""
        if (existing := self._topics.get(config.name)) is not None:
            raise AlreadyExists(self._exists_already(existing))
        await asyncio.to_thread(self._metadata.create_topic, config)
        self._topics[config.name] = config
        if config.compacted:
            self._store.enable_compaction(config.name)
        return config

    async def update(self, config: TopicConfig) -> TopicConfig:
        """Change a topic's retention, tier retention and body schema; TopicNotFound if there
        is none, InvalidArgument if ``config`` changes what cannot change."""
        existing = self.get(config.name)
        fixed = ("queue_count", "message_type", "compacted")
        if changed := [f for f in fixed if getattr(existing, f) != getattr(config, f)]:
            raise InvalidArgument(f"topic {config.name!r}: {', '.join(changed)} cannot change; "
                                  "only retention_ms, tier_retention_ms and body_schema can "
                                  "(delete the topic and create it again for the rest)")
        await asyncio.to_thread(self._metadata.update_topic, config)
        self._topics[config.name] = config
        return config

    def _exists_already(self, existing: TopicConfig) -> str:
        """Why a topic cannot be created again: what it is, and how to change that."""
        text = (f"topic {existing.name!r} exists already, as a {existing.message_type.value} "
                f"topic with {existing.queue_count} queues")
        if self._config.auto_create_topics \
                and existing == TopicConfig(existing.name, self._config.auto_topic_queues):
            text += " (what a send or an MQTT publish to a topic that does not exist creates)"
        return (text + "; its type and queues cannot change: delete it and create it again "
                "(its messages are deleted with it), or choose another name")

    async def ensure(self, config: TopicConfig) -> TopicConfig:
        """Topic ``config.name``, created with ``config`` unless it exists (the broker's own
        topics: dead-letter topics, compacted state, auto-created topics)."""
        if config.name not in self._topics:
            try:
                await asyncio.to_thread(self._metadata.create_topic, config)
            except AlreadyExists:
                pass
            self._topics.setdefault(config.name, config)
            log.info("created topic %s", config.name)
        if config.compacted:
            self._store.enable_compaction(config.name)
        return self._topics[config.name]

    async def auto_create(self, name: str) -> TopicConfig:
        """Topic ``name`` for a publish already authorized, created with default settings if
        ``auto_create_topics`` is on; TopicNotFound otherwise."""
        return await self.ensure(self.prospective(name))

    def prospective(self, name: str) -> TopicConfig:
        """The settings ``auto_create`` would create topic ``name`` with; TopicNotFound if
        ``auto_create_topics`` is off or the name is an internal one (the broker's own state,
        made only by the broker). Creates nothing."""
        if not self._config.auto_create_topics or name.startswith(INTERNAL_PREFIX):
            raise TopicNotFound(name)
        return TopicConfig(name, self._config.auto_topic_queues)

    async def delete(self, name: str) -> None:
        """Delete a topic's metadata; TopicNotFound if there is none."""
        self.get(name)
        await asyncio.to_thread(self._metadata.delete_topic, name)
        del self._topics[name]

    def retention_floors(self, now_ms: int) -> dict[tuple[str, int], int]:
        """(topic, queue) -> first offset within the topic's own ``retention_ms``, for every
        topic that has one."""
        floors = {}
        for topic in list(self._topics.values()):
            if topic.retention_ms is not None:
                for q in range(topic.queue_count):
                    floors[(topic.name, q)] = self._store.offset_for_time(
                        topic.name, q, now_ms - topic.retention_ms)
        return floors
