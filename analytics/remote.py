"""Reading a running broker over the native pull API (the SDK): the ``endpoint`` option.

Each call opens a short-lived client in its own event loop (executors and Spark's planner have
none), so nothing unpicklable outlives it. Reads do not join a consumer group and commit
nothing: Spark's checkpoint is the position.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping

from sluice.client import ClientConfig, PullConsumer
from sluice.client.errors import NotFoundError
from rocketmq.grpc_protocol.definition_pb2 import QueryOffsetPolicy

READER_GROUP = "sluice-spark"
"""Group named in pull requests; reads by offset never use or move its position."""

Row = tuple[int, str, list[str], str, Mapping[str, str], bytes, int, int]
"""(offset, msg id, keys, tag, properties, body, born ms, store ms)."""


class RemoteTopicNotFound(LookupError):
    """The broker has no such topic."""


def client_config(options: Mapping[str, str]) -> ClientConfig:
    """The SDK config the (lower-cased) source options describe."""
    return ClientConfig(options["endpoint"], access_key=options.get("user", "sluice"),
                        secret_key=options.get("password", "sluice"))


def queue_ranges(config: ClientConfig, topics: list[str]) -> dict[tuple[str, int], tuple[int, int]]:
    """(topic, queue) -> (earliest, end) of every queue of ``topics``."""
    return asyncio.run(_queue_ranges(config, topics))


async def _queue_ranges(config: ClientConfig, topics: list[str]) -> dict[tuple[str, int], tuple[int, int]]:
    consumer = PullConsumer(config, READER_GROUP, topics, unpack=False, auto_commit_interval=None)
    try:
        ranges = {}
        for topic in topics:
            try:
                queues = await consumer.route(topic)
            except NotFoundError:
                raise RemoteTopicNotFound(topic) from None
            for queue in sorted(queues, key=lambda q: q.id):
                earliest = await consumer.query_offset(queue, QueryOffsetPolicy.BEGINNING)
                end = await consumer.query_offset(queue, QueryOffsetPolicy.END)
                ranges[(topic, queue.id)] = (earliest, end)
        return ranges
    finally:
        await consumer.close()


def offsets_for_time(config: ClientConfig, queues: list[tuple[str, int]],
                     timestamp_ms: int) -> dict[tuple[str, int], int]:
    """(topic, queue) -> the first offset stored at or after ``timestamp_ms``, for ``queues``."""
    return asyncio.run(_offsets_for_time(config, queues, timestamp_ms))


async def _offsets_for_time(config: ClientConfig, queues: list[tuple[str, int]],
                            timestamp_ms: int) -> dict[tuple[str, int], int]:
    topics = sorted({topic for topic, _ in queues})
    consumer = PullConsumer(config, READER_GROUP, topics, unpack=False, auto_commit_interval=None)
    try:
        offsets = {}
        for topic in topics:
            for queue in await consumer.route(topic):
                if (topic, queue.id) in queues:
                    offsets[(topic, queue.id)] = await consumer.query_offset(
                        queue, QueryOffsetPolicy.TIMESTAMP, timestamp_ms)
        return offsets
    finally:
        await consumer.close()


def read_range(config: ClientConfig, topic: str, queue_id: int, start: int, end: int,
               batch: int) -> Iterator[list[Row]]:
    """Rows of ``[start, end)`` of one queue, ``batch`` records per pull."""
    loop = asyncio.new_event_loop()
    try:
        consumer = PullConsumer(config, READER_GROUP, [topic], unpack=False,
                                auto_commit_interval=None, batch_size=batch, await_duration=0.0)
        try:
            queue = next(q for q in loop.run_until_complete(consumer.route(topic)) if q.id == queue_id)
            offset = start
            while offset < end:
                messages, next_offset = loop.run_until_complete(consumer.read_queue(queue, offset))
                rows = [(m.offset, m.message_id, list(m.keys), m.tag, m.properties, m.body,
                         m.born_timestamp, m.store_timestamp) for m in messages if m.offset < end]
                if rows:
                    yield rows
                if next_offset <= offset:
                    break
                offset = next_offset
        finally:
            loop.run_until_complete(consumer.close())
    finally:
        loop.close()
