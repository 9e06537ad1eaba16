"""SIGKILL the broker (`sluice serve`, sync flush) with transactions committed, rolled back and
left open. After the restart the open ones are checked back with a producer that reconnects,
and consumers get every committed message exactly once and nothing rolled back."""
from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path

import pytest

from sluice.client import Message, Producer, ReceivedMessage, SimpleConsumer
from tests.crash.test_fifo_sigkill import admin, config, sync_flush_broker

TOPIC, GROUP, EACH = "payments", "billing", 10
CONFIG = """
[core]
transaction_check_delay_ms = 500
transaction_check_interval_ms = 500
[auth]
default_password = "sluice"
"""
KINDS = ("commit", "rollback", "open-commit", "open-rollback")

pytestmark = pytest.mark.crash


async def prepare(endpoint: str) -> None:
    """Commit, roll back, and leave open (the checker knows nothing yet) EACH of each kind."""
    async with Producer(config(endpoint), [TOPIC], checker=lambda message: None) as producer:
        for i in range(EACH):
            for kind in KINDS:
                transaction = await producer.send_in_transaction(Message(TOPIC, f"{kind}:{i}".encode()))
                if kind == "commit":
                    await transaction.commit()
                elif kind == "rollback":
                    await transaction.rollback()


async def decide_and_consume(endpoint: str) -> tuple[Counter[bytes], list[bytes]]:
    """Answer the broker's checks from the application's records, and consume until every
    committed message arrived and every open transaction was decided."""
    asked: list[bytes] = []

    def checker(message: ReceivedMessage) -> bool:
        asked.append(message.body)
        return message.body.startswith(b"open-commit")

    got: Counter[bytes] = Counter()
    expected = {f"{kind}:{i}".encode() for kind in ("commit", "open-commit") for i in range(EACH)}
    deadline = time.monotonic() + 120
    async with Producer(config(endpoint), [TOPIC], checker=checker), \
            SimpleConsumer(config(endpoint), GROUP, {TOPIC: "*"}, await_duration=1) as consumer:
        while not (expected <= set(got) and len(set(asked)) >= 2 * EACH):
            assert time.monotonic() < deadline, (sorted(got), sorted(asked))
            for message in await consumer.receive(32):
                got[message.body] += 1
                await consumer.ack(message)
        for message in await consumer.receive(32):  # a last look: nothing more may come
            got[message.body] += 1
    return got, asked


def test_transactions_survive_sigkill_and_committed_messages_arrive_once(sluice_server, tmp_path: Path):
    start = sync_flush_broker(sluice_server, tmp_path / "data", CONFIG)
    server = start()
    admin(server.admin, "/topics", {"name": TOPIC, "queue_count": 2, "message_type": "transaction"})
    asyncio.run(prepare(server.native))
    server.kill()

    restarted = start()
    got, asked = asyncio.run(decide_and_consume(restarted.native))
    committed = {f"{kind}:{i}".encode() for kind in ("commit", "open-commit") for i in range(EACH)}
    assert set(got) == committed, sorted(set(got) ^ committed)
    assert all(count == 1 for count in got.values()), [b for b, n in got.items() if n > 1]
    assert {body.split(b":")[0] for body in asked} == {b"open-commit", b"open-rollback"}
    assert restarted.stop() == 0
