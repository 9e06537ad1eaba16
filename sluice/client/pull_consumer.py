"""PullConsumer: queue-level consumption by offset, for stream processing and Spark.

The group's members own queues (QueryAssignment: split in clustering groups, all of them in
broadcast groups). One fetcher per owned queue long-polls PullMessage from its position and
keeps up to ``prefetch`` answers buffered; ``pull()`` hands them out, unpacking packed
batches into one message per body. Positions are committed with UpdateOffset, on ``commit()``
and every ``auto_commit_interval`` seconds. Runs on one event loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field

from rocketmq.grpc_protocol.definition_pb2 import (ClientType, Code, MessageQueue,
                                                   QueryOffsetPolicy, Settings)
from rocketmq.grpc_protocol.service_pb2 import (GetOffsetRequest, PullMessageRequest,
                                                QueryOffsetRequest, UpdateOffsetRequest)

from .client import Client, describe_subscription
from .config import ClientConfig
from .convert import duration, expand_packed, message_from_proto, tag_filter
from .errors import (OK_CODES, NotFoundError, PackedBatchError, SluiceClientError,
                     error_from_status, raise_for_status)
from .model import ReceivedMessage, TopicQueue

log = logging.getLogger(__name__)
_MAX_FETCH_PAUSE = 10.0
_POLICIES = {"earliest": QueryOffsetPolicy.BEGINNING, "latest": QueryOffsetPolicy.END}


@dataclass(eq=False)
class _Partition:
    """An owned queue: ``position`` is the next offset for the caller (what a commit stores),
    ``fetch_offset`` the next one to fetch. A seek replaces the whole object."""

    key: TopicQueue
    queue: MessageQueue
    prefetch: int
    position: int | None = None
    committed: int | None = None
    fetch_offset: int = 0
    credits: asyncio.Semaphore = field(init=False)
    task: asyncio.Task[None] | None = None

    def __post_init__(self) -> None:
        self.credits = asyncio.Semaphore(self.prefetch)


@dataclass(eq=False)
class _Fetched:
    """One PullMessage answer waiting for the caller."""

    partition: _Partition
    messages: list[ReceivedMessage]
    next_offset: int
    taken: int = 0


class PullConsumer(Client):
    """Reads ``topics`` for ``group`` by offset.

    Where a queue with no committed offset starts: ``start_from`` is ``"earliest"``,
    ``"latest"`` (the default) or a timestamp in ms since the epoch. With auto-commit on,
    positions of messages already returned by ``pull`` are committed, so after a crash a message
    is read again (at least once) unless it was returned before the last commit.
    """

    client_type = ClientType.PULL_CONSUMER

    def __init__(self, config: ClientConfig, group: str, topics: Iterable[str], *,
                 start_from: str | int = "latest", auto_commit_interval: float | None = 5.0,
                 await_duration: float = 5.0, batch_size: int = 64, prefetch: int = 2,
                 assignment_interval: float = 5.0, unpack: bool = True) -> None:
        if not group:
            raise ValueError("a consumer needs a group name")
        if start_from not in _POLICIES and not isinstance(start_from, int):
            raise ValueError(f"start_from must be 'earliest', 'latest' or a timestamp in ms, "
                             f"got {start_from!r}")
        if batch_size < 1 or prefetch < 1:
            raise ValueError("batch_size and prefetch must be at least 1")
        super().__init__(config, group)
        self.topics = list(dict.fromkeys(topics))
        if not self.topics:
            raise ValueError("a pull consumer needs at least one topic")
        self.start_from = start_from
        self.auto_commit_interval = auto_commit_interval
        self.await_duration = await_duration
        self.batch_size = batch_size
        self.prefetch = prefetch
        self.assignment_interval = assignment_interval
        self.unpack = unpack
        """True: one message per packed body. False: packed records come whole, for callers
        that split them with ``unpack_bodies`` (no message object per body: stream speed)."""
        self._partitions: dict[TopicQueue, _Partition] = {}
        self._ready: deque[_Fetched] = deque()
        self._has_data = asyncio.Event()
        self._reassign = asyncio.Event()

    def describe(self, settings: Settings) -> None:
        """Announce the group and its topics (every tag)."""
        describe_subscription(self, settings, dict.fromkeys(self.topics, "*"))

    async def on_start(self) -> None:
        """Take the first assignment; start fetching (and auto-committing)."""
        await self._rebalance()
        self.spawn(self.rebalance_loop(self._rebalance, self.assignment_interval, self._reassign))
        if self.auto_commit_interval:
            self.spawn(self._auto_commit_loop(self.auto_commit_interval))

    async def close(self) -> None:
        """Stop fetching, commit positions if auto-commit is on, disconnect."""
        if self._running and not self._closed:
            await self._stop_background()
            if self.auto_commit_interval:
                try:
                    await self._commit(list(self._partitions.values()))
                except SluiceClientError as error:
                    log.warning("%s: final commit failed: %s", self.client_id, error)
        await super().close()
        self._has_data.set()

    def assignment(self) -> list[TopicQueue]:
        """The queues this consumer owns now."""
        return sorted(self._partitions)

    def seek(self, topic: str, queue_id: int, offset: int) -> None:
        """Read ``topic``/``queue_id`` from ``offset`` next; buffered messages of it are dropped.

        The queue must be in ``assignment()``. Runs on the event loop.
        """
        key = TopicQueue(topic, queue_id)
        old = self._partitions.get(key)
        if old is None:
            raise ValueError(f"queue {topic}/{queue_id} is not assigned to this consumer "
                             f"(assignment: {self.assignment()})")
        if old.task is not None:
            old.task.cancel()
        self._own(_Partition(key, old.queue, self.prefetch, position=offset,
                             committed=old.committed, fetch_offset=offset))

    async def pull(self, max_messages: int = 256, timeout: float | None = None) -> list[ReceivedMessage]:
        """Up to ``max_messages`` messages, waiting up to ``timeout`` (default ``await_duration``)
        for the first; empty if none came."""
        self.check_running()
        if max_messages < 1:
            raise ValueError(f"max_messages must be positive, got {max_messages}")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (self.await_duration if timeout is None else timeout)
        while True:
            messages = self._take(max_messages)
            remaining = deadline - loop.time()
            if messages or remaining <= 0 or self._closed:
                return messages
            self._has_data.clear()
            try:
                await asyncio.wait_for(self._has_data.wait(), remaining)
            except asyncio.TimeoutError:
                return []

    async def poll(self, max_messages: int = 256) -> AsyncIterator[list[ReceivedMessage]]:
        """Yield non-empty batches of messages until the consumer is closed."""
        while not self._closed:
            messages = await self.pull(max_messages)
            if messages:
                yield messages

    async def commit(self) -> None:
        """Store every owned queue's position as the group's committed offset (UpdateOffset)."""
        self.check_running()
        await self._commit(list(self._partitions.values()))

    # --- handing out fetched messages ---

    def _take(self, limit: int) -> list[ReceivedMessage]:
        taken: list[ReceivedMessage] = []
        while self._ready and len(taken) < limit:
            fetched = self._ready[0]
            partition = fetched.partition
            if self._partitions.get(partition.key) is not partition:  # revoked or sought
                self._ready.popleft()
                continue
            chunk = fetched.messages[fetched.taken:fetched.taken + limit - len(taken)]
            taken += chunk
            fetched.taken += len(chunk)
            if fetched.taken == len(fetched.messages):
                self._ready.popleft()
                partition.position = fetched.next_offset
                partition.credits.release()
            else:  # a record whose bodies were partly returned is read again, whole, after a restart
                partition.position = fetched.messages[fetched.taken].offset
        return taken

    # --- ownership ---

    async def _rebalance(self) -> None:
        wanted: dict[TopicQueue, MessageQueue] = {}
        for topic in self.topics:
            for queue in await self.assigned_queues(topic):
                wanted[TopicQueue(topic, queue.id)] = queue
        revoked = [self._partitions.pop(key) for key in self._partitions.keys() - wanted.keys()]
        for partition in revoked:
            if partition.task is not None:
                partition.task.cancel()
        if revoked and self.auto_commit_interval:
            await self._commit(revoked)  # so the next owner resumes where this one stopped
        for key in wanted.keys() - self._partitions.keys():
            self._own(_Partition(key, wanted[key], self.prefetch))

    def _own(self, partition: _Partition) -> None:
        self._partitions[partition.key] = partition
        partition.task = self.spawn(self._fetch_loop(partition))

    async def _commit(self, partitions: list[_Partition]) -> None:
        for partition in partitions:
            position = partition.position
            if position is None or position == partition.committed:
                continue
            request = UpdateOffsetRequest(group=self.resource(self.group),
                                          message_queue=partition.queue, offset=position)
            raise_for_status((await self._transport.unary("UpdateOffset", request)).status)
            partition.committed = position

    async def _auto_commit_loop(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await self._commit(list(self._partitions.values()))
            except SluiceClientError as error:
                log.warning("%s: auto-commit failed: %s", self.client_id, error)

    # --- fetching ---

    async def _fetch_loop(self, partition: _Partition) -> None:
        """Fetch one queue into the buffer until cancelled, pausing after errors."""
        pause = 0.0
        while True:
            try:
                await self._fetch_once(partition)
                pause = 0.0
            except SluiceClientError as error:
                pause = min(max(pause * 2, 0.5), _MAX_FETCH_PAUSE)
                log.warning("%s: pull from %s/%d failed (retrying in %.1fs): %s",
                            self.client_id, *partition.key, pause, error)
                self._reassign.set()
                await asyncio.sleep(pause)

    async def _fetch_once(self, partition: _Partition) -> None:
        """One PullMessage, once fewer than ``prefetch`` answers of this queue are buffered."""
        if partition.position is None:
            partition.committed = await self._committed_offset(partition.queue)
            if partition.committed is None:  # a new group: the start is committed at the next commit
                partition.position = await self._start_from(partition.queue)
            else:
                partition.position = partition.committed
            partition.fetch_offset = partition.position
        await partition.credits.acquire()
        offset = partition.fetch_offset
        try:
            messages, next_offset = await self.read_queue(partition.queue, offset)
        except SluiceClientError as error:
            partition.credits.release()
            if error.code != Code.ILLEGAL_OFFSET:
                raise
            partition.fetch_offset = await self._clamp(partition.queue, offset)
            if partition.fetch_offset == offset:  # in range, yet refused: not ours to fix
                raise
            return
        if not messages and next_offset == offset:
            partition.credits.release()
            return
        partition.fetch_offset = next_offset
        self._ready.append(_Fetched(partition, messages, next_offset))
        self._has_data.set()

    async def read_queue(self, queue: MessageQueue, offset: int) -> tuple[list[ReceivedMessage], int]:
        """Read ``queue`` from ``offset`` (long-polling up to ``await_duration``) without touching
        the group's position: the messages, packed batches unpacked, and the next offset.
        Needs no ``start()``, so it reads without joining the group."""
        request = PullMessageRequest(
            group=self.resource(self.group), message_queue=queue, offset=offset,
            batch_size=self.batch_size, filter_expression=tag_filter("*"),
            long_polling_timeout=duration(self.await_duration))
        responses = await self._transport.server_stream(
            "PullMessage", request, timeout=self.await_duration + self.config.request_timeout)
        messages: list[ReceivedMessage] = []
        next_offset = None
        for response in responses:
            content = response.WhichOneof("content")
            if content == "message":
                message = message_from_proto(response.message)
                messages += self._expand(message) if self.unpack else (message,)
            elif content == "next_offset":
                next_offset = response.next_offset
            elif content == "status" and response.status.code not in (*OK_CODES, Code.MESSAGE_NOT_FOUND):
                raise error_from_status(response.status)
        if next_offset is None:
            next_offset = messages[-1].offset + 1 if messages else offset
        return messages, next_offset

    def _expand(self, message: ReceivedMessage) -> list[ReceivedMessage]:
        try:
            return expand_packed(message)
        except PackedBatchError as error:  # hand it over whole rather than stall the queue
            log.error("%s: %s; delivering it unpacked", self.client_id, error)
            return [message]

    async def _committed_offset(self, queue: MessageQueue) -> int | None:
        """The group's committed offset of ``queue``, or None if it never committed one."""
        try:
            response = await self._transport.unary(
                "GetOffset", GetOffsetRequest(group=self.resource(self.group), message_queue=queue))
            raise_for_status(response.status)
        except NotFoundError:
            return None
        return response.offset if response.offset >= 0 else None

    async def _start_from(self, queue: MessageQueue) -> int:
        """The offset ``start_from`` names in ``queue``."""
        if isinstance(self.start_from, str):
            return await self.query_offset(queue, _POLICIES[self.start_from])
        return await self.query_offset(queue, QueryOffsetPolicy.TIMESTAMP, self.start_from)

    async def query_offset(self, queue: MessageQueue, policy: QueryOffsetPolicy.ValueType,
                           timestamp_ms: int | None = None) -> int:
        """The offset at the beginning or end of ``queue``, or the first at ``timestamp_ms``."""
        request = QueryOffsetRequest(message_queue=queue, query_offset_policy=policy)
        if timestamp_ms is not None:
            request.timestamp.FromMilliseconds(timestamp_ms)
        response = await self._transport.unary("QueryOffset", request)
        raise_for_status(response.status)
        return response.offset

    async def _clamp(self, queue: MessageQueue, offset: int) -> int:
        """``offset`` moved into the queue's current range (after retention or a wild seek)."""
        low = await self.query_offset(queue, QueryOffsetPolicy.BEGINNING)
        high = await self.query_offset(queue, QueryOffsetPolicy.END)
        log.warning("%s: offset %d of %s/%d is outside [%d, %d]; moving into range",
                    self.client_id, offset, queue.topic.name, queue.id, low, high)
        return min(max(offset, low), high)
