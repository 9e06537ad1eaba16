"""Consumer groups: their settings and subscriptions, live members, and who owns which queue.

A group's cursors are named by its consumer: the group itself, or ``group@client`` for each
client of a broadcast group, which keeps its own position. No authorization here: ``Broker``
decides first. Runs on the event loop; not thread-safe (metadata writes go to a thread).
"""

from __future__ import annotations

import asyncio
import logging

from .clock import now_ms
from .cursors import CursorBook
from .errors import AlreadyExists, GroupNotFound, QuotaExceeded
from .membership import Membership
from .metadata import MetadataRepository
from .model import ConsumeMode, GroupConfig, Member, Subscription
from .settings import CoreConfig

log = logging.getLogger(__name__)


class Groups:
    """Group name -> settings and subscriptions, plus the membership of live clients."""

    def __init__(self, metadata: MetadataRepository, config: CoreConfig, cursors: CursorBook) -> None:
        self._metadata = metadata
        self._config = config
        self._cursors = cursors
        self._groups: dict[str, GroupConfig] = {}
        self._subscriptions: dict[tuple[str, str], Subscription] = {}
        self.members = Membership(config.heartbeat_timeout_ms)

    def load(self, groups: list[GroupConfig], subscriptions: list[Subscription]) -> None:
        """Start from the groups and subscriptions the metadata database holds."""
        self._groups = {g.name: g for g in groups}
        self._subscriptions = {(s.group, s.topic): s for s in subscriptions}

    def get(self, name: str) -> GroupConfig:
        """The group's settings; GroupNotFound if there is none."""
        group = self._groups.get(name)
        if group is None:
            raise GroupNotFound(name)
        return group

    def list(self) -> list[GroupConfig]:
        """Every group, by name."""
        return sorted(self._groups.values(), key=lambda g: g.name)

    def subscriptions(self, name: str) -> tuple[Subscription, ...]:
        """The subscriptions group ``name`` recorded, by topic."""
        return tuple(s for (g, _), s in sorted(self._subscriptions.items()) if g == name)

    def live_members(self, name: str) -> tuple[Member, ...]:
        """The group's clients whose heartbeats are current."""
        return self.members.describe(name)

    async def create(self, config: GroupConfig) -> GroupConfig:
        """Create a consumer group; AlreadyExists if the name is taken."""
        if config.name in self._groups:
            raise AlreadyExists(f"consumer group {config.name!r} exists already")
        await asyncio.to_thread(self._metadata.create_group, config)
        self._groups[config.name] = config
        return config

    async def ensure(self, name: str) -> GroupConfig:
        """The group, created with defaults if unknown and ``auto_create_groups`` is on."""
        group = self._groups.get(name)
        if group is None:
            if not self._config.auto_create_groups:
                raise GroupNotFound(name)
            group = GroupConfig(name)
            try:
                await asyncio.to_thread(self._metadata.create_group, group)
            except AlreadyExists:
                group = await asyncio.to_thread(self._metadata.get_group, name) or group
            group = self._groups.setdefault(name, group)
        return group

    async def delete(self, name: str) -> None:
        """Delete a group, its subscriptions, members and offsets; GroupNotFound if none."""
        self.get(name)
        await asyncio.to_thread(self._metadata.delete_group, name)
        del self._groups[name]
        for key in [key for key in self._subscriptions if key[0] == name]:
            del self._subscriptions[key]
        self.members.drop_group(name)
        self._cursors.drop_consumer(name)

    async def record_subscription(self, subscription: Subscription) -> None:
        """Save ``subscription`` of its group unless it is recorded as it is. While the disk
        refuses writes it is not recorded (the next heartbeat tries again) and the member
        consumes all the same."""
        key = (subscription.group, subscription.topic)
        if self._subscriptions.get(key) != subscription:
            try:
                await asyncio.to_thread(self._metadata.put_subscription, subscription)
            except QuotaExceeded as error:
                log.info("subscription of group %s to topic %s not recorded yet: %s",
                         subscription.group, subscription.topic, error)
                return
            self._subscriptions[key] = subscription

    def heartbeat(self, group: str, client_id: str, topics: set[str] | None) -> None:
        """``client_id`` is a live member of ``group`` (consuming ``topics``, if it said)."""
        self.members.heartbeat(group, client_id, now_ms(), topics)

    def leave(self, group: str, client_id: str) -> None:
        """Remove a client that is shutting down; its queues go to the others."""
        if self.members.leave(group, client_id):
            log.info("member %s left group %s", client_id, group)

    def assignment(self, group: str, topic: str, client_id: str, queue_count: int) -> list[int]:
        """The queues of ``topic`` that ``client_id`` should consume now."""
        if self.consume_mode(group) is ConsumeMode.BROADCAST:
            return list(range(queue_count))
        return list(self.members.assign(group, topic, client_id, queue_count, now_ms()))

    def consume_mode(self, group: str) -> ConsumeMode:
        """How the group's members share a topic (clustering for a group not created yet)."""
        config = self._groups.get(group)
        return config.consume_mode if config else ConsumeMode.CLUSTERING

    def is_fifo(self, group: str) -> bool:
        """Whether the group consumes in message-group order (``GroupConfig.fifo``)."""
        config = self._groups.get(group)
        return config is not None and config.fifo

    def consumer(self, group: str, client_id: str) -> str:
        """Cursor owner: the group, or one client of a broadcast group."""
        if self.consume_mode(group) is ConsumeMode.BROADCAST:
            return f"{group}@{client_id}"
        return group

    def consumers(self, group: str, topic: str) -> set[str]:
        """Every cursor owner of ``group`` that has a cursor in ``topic``."""
        return {k[0] for k in self._cursors.cursors if k[1] == topic
                and (k[0] == group or k[0].startswith(group + "@"))}

    async def expire_members(self) -> None:
        """Forever: drop members whose heartbeats stopped, so their queues are reassigned."""
        period = max(0.05, self._config.heartbeat_timeout_ms / 4000)
        while True:
            await asyncio.sleep(period)
            for group, client_id in self.members.expire(now_ms()):
                log.info("member %s of group %s missed its heartbeats; its queues are reassigned",
                         client_id, group)
