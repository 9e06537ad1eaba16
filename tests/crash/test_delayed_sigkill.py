"""SIGKILL the broker (`sluice serve`, sync flush) with delayed messages pending, some of them
recalled, while earlier ones have already fired.

After the restart every acknowledged delayed send that was not recalled is delivered, those
that fell due while the broker was down included, none before its due time; nothing recalled
is ever delivered; and a message that fired before the kill is not sent again as a new copy
beyond the batch in flight (at most once more). Each copy is itself delivered at least once: an
ack answered within the last offset-commit interval before the kill is redelivered after it.
"""
from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path

import pytest

from sluice.client import ClientConfig, Message, Producer, ReceivedMessage, SimpleConsumer
from tests.crash.test_broker_sigkill import create_topic, free_port

TOPIC, GROUP = "timers", "timer-readers"
CONFIG = """
[auth]
default_password = "sluice"
"""
EARLY, PENDING = 50, 200

pytestmark = pytest.mark.crash


def config(endpoint: str) -> ClientConfig:
    return ClientConfig(endpoint, "sluice", "sluice", reconnect_timeout=2)


async def receive_until(consumer: SimpleConsumer, wanted: set[bytes], deadline_s: float,
                        seen: list[tuple[ReceivedMessage, int]]) -> None:
    """Receive (and ack) until every body of ``wanted`` arrived; record arrivals in ``seen``."""
    deadline = time.monotonic() + deadline_s
    while not wanted <= {m.body for m, _ in seen}:
        assert time.monotonic() < deadline, \
            f"{len(wanted - {m.body for m, _ in seen})} delayed messages never arrived"
        for message in await consumer.receive(32):
            seen.append((message, int(time.time() * 1000)))
            await consumer.ack(message)


async def before_kill(endpoint: str, server) -> tuple[dict[bytes, int], set[bytes], list]:
    """Send early and pending delayed messages, recall every third pending one, receive the
    early ones, then kill the broker. Returns (due time per body, recalled bodies, arrivals)."""
    due: dict[bytes, int] = {}
    recalled: set[bytes] = set()
    seen: list[tuple[ReceivedMessage, int]] = []
    async with Producer(config(endpoint), [TOPIC]) as producer, \
            SimpleConsumer(config(endpoint), GROUP, {TOPIC: "*"}, await_duration=1) as consumer:
        now = int(time.time() * 1000)
        messages = [Message(TOPIC, f"early-{i}".encode(), delivery_timestamp=now + 1000 + i * 10)
                    for i in range(EARLY)]
        messages += [Message(TOPIC, f"pending-{i}".encode(), delivery_timestamp=now + 6000 + i * 20)
                     for i in range(PENDING)]
        receipts = await asyncio.gather(*(producer.send(m) for m in messages))
        due = {m.body: m.delivery_timestamp for m in messages}
        for message, receipt in list(zip(messages, receipts))[EARLY::3]:
            await producer.recall(TOPIC, receipt.recall_handle)
            recalled.add(message.body)
        await receive_until(consumer, {m.body for m in messages[:EARLY]}, 60, seen)
        server.kill()
    return due, recalled, seen


async def after_restart(endpoint: str, wanted: set[bytes], quiet_until_ms: int) -> list:
    """Receive until ``wanted`` arrived and the last due time is 2 s past."""
    seen: list[tuple[ReceivedMessage, int]] = []
    async with SimpleConsumer(config(endpoint), GROUP, {TOPIC: "*"}, await_duration=1) as consumer:
        await receive_until(consumer, wanted, 120, seen)
        while int(time.time() * 1000) < quiet_until_ms:
            for message in await consumer.receive(32):
                seen.append((message, int(time.time() * 1000)))
                await consumer.ack(message)
    return seen


def test_pending_and_recalled_delayed_messages_survive_sigkill(sluice_server, tmp_path: Path):
    data_dir = tmp_path / "data"
    ports = ["--native-port", str(free_port()), "--admin-port", str(free_port())]
    server = sluice_server(data_dir, *ports, "--flush", "sync", config=CONFIG)
    server.wait_ready()
    create_topic(server.admin, TOPIC, queues=4)
    due, recalled, before = asyncio.run(before_kill(server.native, server))

    restarted = sluice_server(data_dir, *ports, "--flush", "sync", config=CONFIG)
    restarted.wait_ready()
    pending = {body for body in due if body.startswith(b"pending-")} - recalled
    after = asyncio.run(after_restart(restarted.native, pending, max(due.values()) + 2000))

    arrivals = before + after
    assert not [m.body for m, _ in arrivals if m.body in recalled], "a recalled message was delivered"
    early = [(m.body, at) for m, at in arrivals if at < due[m.body]]
    assert not early, f"delivered before due: {early[:5]}"
    counts = Counter(m.body for m, _ in arrivals)
    assert all(counts[body] == 1 for body in pending), "a pending message was delivered twice"
    copies = Counter(body for body, _, _ in {(m.body, m.queue_id, m.offset) for m, _ in arrivals})
    assert max(copies.values()) <= 2, f"fired more than once more: {copies.most_common(3)}"
    deliveries = Counter((m.body, m.queue_id, m.offset) for m, _ in arrivals)
    assert max(deliveries.values()) <= 2, f"a copy came back more than once: {deliveries.most_common(3)}"
    assert restarted.stop() == 0
