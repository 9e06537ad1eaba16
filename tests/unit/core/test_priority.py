"""Priority messages: a priority topic's queue N holds priority N, and pop consumers take the
highest priority first, whatever the order of sending."""
from __future__ import annotations

import time

import pytest

from core.errors import InvalidArgument
from core.model import SYSTEM, MessageType, OutgoingMessage, TopicConfig
from core.service import ALL_QUEUES
from tests.unit.core.test_broker import run


async def tasks(broker) -> None:
    await broker.create_topic(SYSTEM, TopicConfig("tasks", 4, MessageType.PRIORITY))


def test_a_backlog_is_received_highest_priority_first_and_in_order_within_one(tmp_path):
    async def scenario(broker) -> None:
        await tasks(broker)
        sent = [(0, "a"), (2, "b"), (None, "c"), (3, "d"), (9, "e"), (2, "f"), (1, "g")]
        await broker.send(SYSTEM, [OutgoingMessage("tasks", body.encode(), priority=priority)
                                   for priority, body in sent])
        got = []
        while batch := await broker.receive(SYSTEM, "g", "tasks", "c1", max_messages=2):
            got += [(d.queue_id, d.body.decode()) for d in batch]
        # 9 is above the highest priority (3): it counts as 3; no priority counts as 0
        assert got == [(3, "d"), (3, "e"), (2, "b"), (2, "f"), (1, "g"), (0, "a"), (0, "c")]
        assert broker.assignment(SYSTEM, "g", "tasks", "c1") == [ALL_QUEUES]
    run(tmp_path, scenario, store="file")


def test_a_priority_needs_a_priority_topic_and_is_not_negative_or_delayed(tmp_path):
    async def scenario(broker) -> None:
        await tasks(broker)
        await broker.create_topic(SYSTEM, TopicConfig("orders", 4))
        with pytest.raises(InvalidArgument, match="not a priority topic"):
            await broker.send(SYSTEM, [OutgoingMessage("orders", b"x", priority=1)])
        for bad in (OutgoingMessage("tasks", b"x", priority=-1),
                    OutgoingMessage("tasks", b"x", priority=1, delivery_ts=int(time.time() * 1000) + 10_000)):
            with pytest.raises(InvalidArgument, match="0 or more"):
                await broker.send(SYSTEM, [bad])
    run(tmp_path, scenario, store="file")
