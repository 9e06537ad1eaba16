"""SIGKILL the broker (`sluice serve`, sync flush) while a FIFO consumer group is mid-way
through many message groups.

Before the kill, with failures retried after a backoff, and after the restart, each message
group is handled in the order it was sent (a restart may go back to the last saved position,
never reorder or skip), and every message arrives.
"""
from __future__ import annotations

import asyncio
import base64
import json
import time
import urllib.request
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sluice.client import ClientConfig, Message, Producer, SimpleConsumer
from tests.crash.test_broker_sigkill import free_port

TOPIC, GROUP, GROUPS, PER_GROUP, ACKS_BEFORE_KILL = "orders", "ordered", 20, 50, 300
BACKOFF_S = 0.3
CONFIG = """
[core]
offset_commit_interval_ms = 200
[auth]
default_password = "sluice"
"""

pytestmark = pytest.mark.crash


def admin(url: str, path: str, body: dict) -> None:
    request = urllib.request.Request(
        f"{url}{path}", method="POST", data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json",
                 "Authorization": "Basic " + base64.b64encode(b"sluice:sluice").decode()})
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status in (200, 201)


def sync_flush_broker(sluice_server, data_dir: Path, config: str = CONFIG) -> Callable[[], Any]:
    """A function that starts `sluice serve --flush sync` on ``data_dir``, on the same ports
    each time, and returns it once ready: call it again after a SIGKILL to restart."""
    ports = ["--native-port", str(free_port()), "--admin-port", str(free_port())]

    def start() -> Any:
        server = sluice_server(data_dir, *ports, "--flush", "sync", config=config)
        server.wait_ready()
        return server
    return start


def config(endpoint: str) -> ClientConfig:
    return ClientConfig(endpoint, "sluice", "sluice", reconnect_timeout=2)


async def consume(endpoint: str, done: Callable[[list[tuple[str, int]]], bool],
                  fail_every: int = 0) -> list[tuple[str, int]]:
    """(message group, sequence number) of the messages handled, in order, until
    ``done(order)``. Each message is acked once handled; with ``fail_every``, the first
    attempt of every such message fails, as a FIFO application handles a failure: it and the
    rest of its group in the batch come back after a backoff, and nothing else of the group is
    handled meanwhile."""
    order: list[tuple[str, int]] = []
    deadline = time.monotonic() + 120
    async with SimpleConsumer(config(endpoint), GROUP, {TOPIC: "*"}, await_duration=1) as consumer:
        while not done(order):
            assert time.monotonic() < deadline, f"only {len(order)} messages arrived"
            failed: set[str] = set()
            for message in await consumer.receive(16):
                group, sequence = message.body.decode().split(":")
                if fail_every and message.delivery_attempt == 1 and int(sequence) % fail_every == 3:
                    failed.add(group)
                if group in failed:
                    await consumer.change_invisible_duration(message, BACKOFF_S)
                    continue
                order.append((group, int(sequence)))
                await consumer.ack(message)
    return order


async def produce(endpoint: str) -> None:
    async with Producer(config(endpoint), [TOPIC]) as producer:
        for sequence in range(PER_GROUP):
            await asyncio.gather(*(producer.send(Message(TOPIC, f"g{g}:{sequence}".encode(),
                                                         message_group=f"g{g}"))
                                   for g in range(GROUPS)))


def runs(order: list[tuple[str, int]]) -> dict[str, list[int]]:
    """Each message group's sequence numbers in delivery order."""
    by_group: dict[str, list[int]] = defaultdict(list)
    for group, sequence in order:
        by_group[group].append(sequence)
    return by_group


def contiguous(sequences: list[int]) -> bool:
    return sequences == list(range(sequences[0], sequences[0] + len(sequences)))


def test_fifo_groups_keep_their_order_across_sigkill(sluice_server, tmp_path: Path):
    start = sync_flush_broker(sluice_server, tmp_path / "data")
    server = start()
    admin(server.admin, "/topics", {"name": TOPIC, "queue_count": 4, "message_type": "fifo"})
    admin(server.admin, "/groups", {"name": GROUP, "fifo": True})
    asyncio.run(produce(server.native))
    before = asyncio.run(consume(server.native, lambda order: len(order) >= ACKS_BEFORE_KILL,
                                 fail_every=7))
    server.kill()

    restarted = start()
    everything = {(f"g{g}", s) for g in range(GROUPS) for s in range(PER_GROUP)}
    after = asyncio.run(consume(restarted.native,
                                lambda order: everything <= set(before) | set(order)))
    for group, sequences in runs(before).items():
        assert sequences[0] == 0 and contiguous(sequences), (group, sequences)
    for group, sequences in runs(after).items():
        handled = runs(before).get(group, [-1])[-1]
        assert sequences[0] <= handled + 1, (group, "skipped ahead", handled, sequences[:3])
        assert contiguous(sequences) and sequences[-1] == PER_GROUP - 1, (group, sequences)
    assert restarted.stop() == 0
