"""Transactional messages in core: invisible until committed, dropped on rollback, checked back
when left open, and kept across a restart with their check counts, delivered once."""
from __future__ import annotations

import asyncio
import dataclasses

import pytest

from core import transactions
from core.errors import InvalidArgument, QuotaExceeded, TransactionNotFound
from core.model import SYSTEM, MessageType, OutgoingMessage, TopicConfig
from tests.unit.core.test_broker import CONFIG, run, run_core

QUICK = dataclasses.replace(CONFIG, transaction_check_delay_ms=100, transaction_check_interval_ms=100)


async def payments(broker) -> None:
    await broker.create_topic(SYSTEM, TopicConfig("payments", 2, MessageType.TRANSACTION))


def half(body: bytes, msg_id: str = "") -> OutgoingMessage:
    return OutgoingMessage("payments", body, keys=("k",), properties={"a": "1"},
                           msg_id=msg_id or body.decode(), transactional=True)


async def drain(broker, wait_ms: int = 300) -> list:
    got = []
    while batch := await broker.receive(SYSTEM, "g", "payments", "c1", max_messages=32, wait_ms=wait_ms):
        for delivery in batch:
            await broker.ack(SYSTEM, "g", "payments", delivery.receipt_handle)
        got += batch
    return got


def test_a_committed_message_is_delivered_with_its_id_and_a_rolled_back_one_never(tmp_path):
    async def scenario(broker) -> None:
        await payments(broker)
        [commit, rollback] = await broker.send(SYSTEM, [half(b"commit"), half(b"rollback")])
        assert commit.transaction_id and commit.msg_id == "commit"
        assert await drain(broker) == []
        await broker.end_transaction(SYSTEM, "payments", "rollback", rollback.transaction_id, False)
        await broker.end_transaction(SYSTEM, "payments", "commit", commit.transaction_id, True)
        [got] = await drain(broker)
        assert (got.body, got.msg_id, got.keys, dict(got.properties)) == \
            (b"commit", "commit", ("k",), {"a": "1"})
        for result in (commit, rollback):
            with pytest.raises(TransactionNotFound, match="already"):
                await broker.end_transaction(SYSTEM, "payments", result.msg_id, result.transaction_id, True)
        with pytest.raises(TransactionNotFound):
            await broker.end_transaction(SYSTEM, "other", "commit", commit.transaction_id, True)
    run(tmp_path, scenario, store="file")


def test_transactional_sends_are_refused_when_mixed_delayed_or_beyond_the_limit(tmp_path):
    async def scenario(broker) -> None:
        await payments(broker)
        with pytest.raises(InvalidArgument, match="apart from the others"):
            await broker.send(SYSTEM, [half(b"a"), OutgoingMessage("payments", b"b")])
        with pytest.raises(InvalidArgument, match="cannot also be delayed"):
            await broker.send(SYSTEM, [dataclasses.replace(half(b"a"), delivery_ts=2**41)])
        await broker.send(SYSTEM, [half(b"a"), half(b"b")])
        with pytest.raises(QuotaExceeded, match="max_open_transactions"):
            await broker.send(SYSTEM, [half(b"c")])
    run(tmp_path, scenario, store="file", config=dataclasses.replace(CONFIG, max_open_transactions=2))


def test_open_transactions_and_their_checks_survive_a_restart(tmp_path):
    asked: list[tuple[str, str]] = []
    first_ask = asyncio.Event()

    def checker(topic, message, transaction_id) -> bool:
        asked.append((message.msg_id, transaction_id))
        first_ask.set()
        return True

    async def before(core) -> None:
        broker = core.broker
        broker.set_transaction_checker(checker)
        await payments(broker)
        results = await broker.send(SYSTEM, [half(b"decided"), half(b"open")])
        await broker.end_transaction(SYSTEM, "payments", "decided", results[0].transaction_id, False)
        await first_ask.wait()
        assert asked[0] == ("open", results[1].transaction_id)

    async def after(core) -> None:
        broker = core.broker
        broker.set_transaction_checker(checker)
        assert core.engine.transactions.open_count == 1
        while core.engine.transactions.open_count:  # one check left, then discarded
            await asyncio.sleep(0.02)
        assert len(asked) == 2 and await drain(broker) == []

    config = dataclasses.replace(QUICK, transaction_check_max=2, transaction_check_interval_ms=60_000)
    run_core(tmp_path, before, store="file", config=config)
    run_core(tmp_path, after, store="file",
             config=dataclasses.replace(config, transaction_check_interval_ms=100))


def test_a_commit_interrupted_after_sending_does_not_send_twice(tmp_path, monkeypatch):
    async def scenario(broker) -> None:
        await payments(broker)
        [result] = await broker.send(SYSTEM, [half(b"once")])
        record = transactions.Transactions._record

        async def failing(self, outcomes):
            raise OSError("disk full")
        monkeypatch.setattr(transactions.Transactions, "_record", failing)
        with pytest.raises(OSError):
            await broker.end_transaction(SYSTEM, "payments", "once", result.transaction_id, True)
        monkeypatch.setattr(transactions.Transactions, "_record", record)
        await broker.end_transaction(SYSTEM, "payments", "once", result.transaction_id, True)
        assert [d.body for d in await drain(broker)] == [b"once"]
    run(tmp_path, scenario, store="file")


def test_a_committed_message_sent_before_a_crash_is_not_sent_again(tmp_path):
    """The commit's send was durable, its outcome record was not: after the restart the
    transaction is open, and committing it (the producer's answer) finds the message sent."""
    async def before(core) -> None:
        await payments(core.broker)
        [result] = await core.broker.send(SYSTEM, [half(b"once")])
        opened = core.engine.transactions
        entry = opened._open[result.queue_offset]
        await opened._send_committed(result.queue_offset, entry)  # the crash comes next

    async def after(core) -> None:
        broker = core.broker
        txn = transactions.transaction_id(next(iter(core.engine.transactions._open)), "once")
        await broker.end_transaction(SYSTEM, "payments", "once", txn, True)
        assert [d.body for d in await drain(broker)] == [b"once"]

    run_core(tmp_path, before, store="file")
    run_core(tmp_path, after, store="file")
