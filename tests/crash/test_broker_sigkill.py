"""SIGKILL the whole broker (`sluice serve`, sync flush) while producers send and a consumer acks.

DESIGN.md's durability contract, end to end through the native protocol: every send the broker
acknowledged is consumed after the restart (no loss), and a message whose ack the broker
answered before the kill is delivered again only if that ack landed within the last offset-commit
interval before the kill (the interval at which consumer offsets are saved).
"""
from __future__ import annotations

import asyncio
import base64
import json
import socket
import time
import urllib.request
from pathlib import Path

import pytest

from sluice.client import ClientConfig, Message, Producer, SimpleConsumer, SluiceClientError

COMMIT_INTERVAL_MS = 500
CONFIG = f"""
[core]
offset_commit_interval_ms = {COMMIT_INTERVAL_MS}
[auth]
default_password = "sluice"
"""
TOPIC, GROUP, PRODUCERS = "crash", "crash-readers", 4
SCHEDULING_SLACK_S = 2.0
"""How late a save of the offsets may run on a loaded 2-core machine (fsync included)."""

pytestmark = pytest.mark.crash


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


SENDS_BEFORE_KILL, ACKS_BEFORE_KILL = 3_000, 1_500


class Observed:
    """What the clients saw before the kill."""

    def __init__(self) -> None:
        self.acked_sends: set[bytes] = set()
        self.acked_at: dict[bytes, float] = {}
        """Body -> monotonic time the broker answered our ack."""
        self.enough = asyncio.Event()
        """Set once enough sends and acks happened to kill the broker mid-stream."""

    def check(self) -> None:
        if len(self.acked_sends) >= SENDS_BEFORE_KILL and len(self.acked_at) >= ACKS_BEFORE_KILL:
            self.enough.set()


async def produce(producer: Producer, index: int, seen: Observed) -> None:
    sequence = 0
    while True:
        body = f"p{index}-{sequence}".encode()
        try:
            await producer.send(Message(TOPIC, body))
        except SluiceClientError:
            return
        seen.acked_sends.add(body)
        seen.check()
        sequence += 1


async def consume(consumer: SimpleConsumer, seen: Observed) -> None:
    while True:
        try:
            for message in await consumer.receive(32):
                await consumer.ack(message)
                seen.acked_at[message.body] = time.monotonic()
            seen.check()
        except SluiceClientError:
            return


async def before_kill(endpoint: str, server, seen: Observed) -> float:
    """Send and consume until enough happened, kill the broker mid-stream; return the kill time."""
    config = ClientConfig(endpoint, "sluice", "sluice", reconnect_timeout=2)
    async with Producer(config, [TOPIC]) as producer, \
            SimpleConsumer(config, GROUP, {TOPIC: "*"}, await_duration=1) as consumer:
        tasks = [asyncio.create_task(produce(producer, i, seen)) for i in range(PRODUCERS)]
        tasks.append(asyncio.create_task(consume(consumer, seen)))
        try:
            await asyncio.wait_for(seen.enough.wait(), 120)
        except asyncio.TimeoutError:
            raise AssertionError("the broker did not get through the load in time") from None
        server.kill()
        killed_at = time.monotonic()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return killed_at


async def after_restart(endpoint: str, expected: set[bytes]) -> list[bytes]:
    """Consume until every expected body arrived; return everything delivered after the restart."""
    config = ClientConfig(endpoint, "sluice", "sluice")
    delivered: list[bytes] = []
    async with SimpleConsumer(config, GROUP, {TOPIC: "*"}, await_duration=1) as consumer:
        deadline = time.monotonic() + 120
        while not expected <= set(delivered):
            assert time.monotonic() < deadline, f"{len(expected - set(delivered))} acknowledged sends never arrived"
            for message in await consumer.receive(32):
                delivered.append(message.body)
                await consumer.ack(message)
    return delivered


def test_acknowledged_sends_survive_sigkill_and_acks_are_kept_to_the_commit_interval(sluice_server, tmp_path: Path):
    data_dir = tmp_path / "data"
    ports = ["--native-port", str(free_port()), "--admin-port", str(free_port())]
    server = sluice_server(data_dir, *ports, "--flush", "sync", config=CONFIG)
    server.wait_ready()
    create_topic(server.admin, TOPIC, queues=4)
    seen = Observed()
    killed_at = asyncio.run(before_kill(server.native, server, seen))

    restarted = sluice_server(data_dir, *ports, "--flush", "sync", config=CONFIG)
    restarted.wait_ready()
    delivered = asyncio.run(after_restart(restarted.native, seen.acked_sends - set(seen.acked_at)))

    lost = seen.acked_sends - set(delivered) - set(seen.acked_at)
    assert not lost, f"{len(lost)} acknowledged sends were lost"
    redelivered = [body for body in delivered if body in seen.acked_at]
    window = COMMIT_INTERVAL_MS / 1000 + SCHEDULING_SLACK_S
    too_old = [body for body in redelivered if seen.acked_at[body] < killed_at - window]
    assert not too_old, (f"{len(too_old)} of {len(redelivered)} redelivered messages were acked more "
                         f"than {window:.1f} s before the kill")
    assert restarted.stop() == 0


def create_topic(admin_url: str, name: str, queues: int) -> None:
    """Create a topic through the admin API as the default user."""
    request = urllib.request.Request(
        f"{admin_url}/topics", method="POST", data=json.dumps({"name": name, "queue_count": queues}).encode(),
        headers={"Content-Type": "application/json",
                 "Authorization": "Basic " + base64.b64encode(b"sluice:sluice").decode()})
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status in (200, 201)
