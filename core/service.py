"""The service facade every protocol adapter calls: topics, groups, send, pop, pull, offsets.

All methods run on the broker's event loop. Methods that may wait (send under ``sync`` flush,
long-polling receive and pull) are coroutines; the rest return at once. Every method that acts
for a client takes the authenticated ``Principal`` first and checks its permission on domain
names before doing anything.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from store.api import Store

from .model import (Delivery, GroupConfig, Member, OutgoingMessage, Principal, PullResult,
                    QueueLag, SendResult, Subscription, TopicConfig)


@dataclass(frozen=True)
class CoreConfig:
    """Broker-wide behaviour of core. Durations in milliseconds."""

    max_message_bytes: int = 4 << 20
    auto_create_groups: bool = True
    heartbeat_timeout_ms: int = 30_000
    offset_commit_interval_ms: int = 1_000
    default_invisible_ms: int = 30_000
    max_long_poll_ms: int = 30_000
    recent_cache_bytes: int = 64 << 20


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
    before closing the store.
    """

    def __init__(self, store: Store, metadata: "MetadataRepository", data_dir: str,
                 config: CoreConfig = CoreConfig()) -> None: ...

    async def start(self) -> None:
        """Load metadata and committed offsets; start timers (redelivery, member expiry, commits)."""

    async def close(self) -> None:
        """Stop timers, wake every long poll with an empty answer, persist offsets."""

    # --- authentication (delegates to core.auth) ---
    def authenticate(self, username: str, password: str) -> Principal:
        """Principal for a username/password pair; raises Unauthenticated."""

    def authenticate_signature(self, access_key: str, signed: bytes, signature_hex: str) -> Principal:
        """Principal for an HMAC-SHA1 signature of ``signed`` made with the user's secret."""

    # --- topics ---
    async def create_topic(self, principal: Principal, config: TopicConfig) -> TopicConfig: ...
    def get_topic(self, name: str) -> TopicConfig: ...          # TopicNotFound
    def list_topics(self) -> list[TopicConfig]: ...
    def describe_topic(self, name: str) -> TopicStats: ...
    async def delete_topic(self, principal: Principal, name: str) -> None: ...

    # --- groups and membership ---
    async def create_group(self, principal: Principal, config: GroupConfig) -> GroupConfig: ...
    def get_group(self, name: str) -> GroupConfig: ...          # GroupNotFound
    def list_groups(self) -> list[GroupConfig]: ...
    def describe_group(self, name: str) -> GroupStats: ...
    async def delete_group(self, principal: Principal, name: str) -> None: ...
    async def heartbeat(self, principal: Principal, group: str, client_id: str,
                        subscriptions: Sequence[Subscription] = ()) -> None: ...
    def leave(self, group: str, client_id: str) -> None: ...
    def assignment(self, principal: Principal, group: str, topic: str, client_id: str) -> list[int]: ...

    # --- produce ---
    async def send(self, principal: Principal, messages: Sequence[OutgoingMessage]) -> list[SendResult]: ...

    # --- message-level (pop) consumption ---
    async def receive(self, principal: Principal, group: str, topic: str, client_id: str, *,
                      expression: str = "*", max_messages: int = 32, invisible_ms: int | None = None,
                      wait_ms: int = 0, queue_id: int | None = None) -> list[Delivery]: ...
    async def ack(self, principal: Principal, group: str, topic: str, receipt_handle: str) -> None: ...
    async def change_invisible(self, principal: Principal, group: str, topic: str,
                               receipt_handle: str, invisible_ms: int) -> str: ...
    async def forward_to_dead_letter(self, principal: Principal, group: str, topic: str,
                                     receipt_handle: str) -> None: ...

    # --- queue-level consumption and offsets ---
    async def pull(self, principal: Principal, group: str, topic: str, queue_id: int, offset: int, *,
                   max_messages: int = 32, wait_ms: int = 0, expression: str = "*") -> PullResult: ...
    def commit_offset(self, principal: Principal, group: str, topic: str, queue_id: int, offset: int,
                      client_id: str = "") -> None: ...
    def committed_offset(self, principal: Principal, group: str, topic: str, queue_id: int,
                         client_id: str = "") -> int: ...
    def offset_at(self, topic: str, queue_id: int, where: str | int) -> int:
        """``'earliest'``, ``'latest'`` or a timestamp in ms: the queue offset there."""
    async def reset_offsets(self, principal: Principal, group: str, topic: str,
                            timestamp_ms: int) -> dict[int, int]: ...
    def lag(self, group: str) -> list[QueueLag]: ...

    # --- lookup ---
    def lookup_message(self, principal: Principal, msg_id: str) -> Delivery: ...   # MessageNotFound
    def lookup_key(self, principal: Principal, topic: str, key: str, limit: int = 32) -> list[Delivery]: ...
