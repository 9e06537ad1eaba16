"""SIGKILL the broker (`sluice serve`, sync flush) while a group is mid-way through many lite
topics. After the restart every lite topic is still there, nothing acked before the kill is
lost from order, and each lite topic resumes at or before where the group was, in order, until
every message arrived."""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from sluice.client import LiteSimpleConsumer, Message, Producer
from tests.crash.test_fifo_sigkill import (CONFIG, admin, config, contiguous, runs,
                                           sync_flush_broker)

TOPIC, GROUP, SESSIONS, PER_SESSION, ACKS_BEFORE_KILL = "chats", "assistants", 20, 30, 250
NAMES = [f"session-{i}" for i in range(SESSIONS)]

pytestmark = pytest.mark.crash


async def produce(endpoint: str) -> None:
    async with Producer(config(endpoint), [TOPIC]) as producer:
        for sequence in range(PER_SESSION):
            await asyncio.gather(*(producer.send(Message(TOPIC, f"{name}:{sequence}".encode(),
                                                         lite_topic=name)) for name in NAMES))


async def consume(endpoint: str, done: Callable[[list[tuple[str, int]]], bool]) -> list[tuple[str, int]]:
    """(lite topic, sequence number) of the messages handled, in order, until ``done(order)``."""
    order: list[tuple[str, int]] = []
    deadline = time.monotonic() + 120
    async with LiteSimpleConsumer(config(endpoint), GROUP, TOPIC, NAMES, await_duration=1) as consumer:
        while not done(order):
            assert time.monotonic() < deadline, f"only {len(order)} messages arrived"
            for message in await consumer.receive(16):
                name, sequence = message.body.decode().split(":")
                assert message.lite_topic == name
                order.append((name, int(sequence)))
                await consumer.ack(message)
    return order


def test_lite_topics_keep_their_order_across_sigkill(sluice_server, tmp_path: Path):
    start = sync_flush_broker(sluice_server, tmp_path / "data", CONFIG)
    server = start()
    admin(server.admin, "/topics", {"name": TOPIC, "queue_count": 4, "message_type": "lite"})
    asyncio.run(produce(server.native))
    before = asyncio.run(consume(server.native, lambda order: len(order) >= ACKS_BEFORE_KILL))
    server.kill()

    restarted = start()
    everything = {(name, s) for name in NAMES for s in range(PER_SESSION)}
    after = asyncio.run(consume(restarted.native, lambda order: everything <= set(before) | set(order)))
    for name, sequences in runs(before).items():
        assert sequences[0] == 0 and contiguous(sequences), (name, sequences)
    for name, sequences in runs(after).items():
        handled = runs(before).get(name, [-1])[-1]
        assert sequences[0] <= handled + 1, (name, "skipped ahead", handled, sequences[:3])
        assert contiguous(sequences) and sequences[-1] == PER_SESSION - 1, (name, sequences)
    assert restarted.stop() == 0
