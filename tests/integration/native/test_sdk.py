"""The SDK against a real broker (fixtures in conftest.py): produce, pop, push and pull
consumption, packed batches, filters, errors, the sync facade, and a broker restart."""
from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from core.model import SYSTEM, ConsumeMode, GroupConfig, MessageType
from sluice.client import (BadRequestError, ClientConfig, InvalidReceiptHandleError,
                           LiteSimpleConsumer, Message, NotFoundError,
                           Producer, PullConsumer, PushConsumer, ReceivedMessage, SimpleConsumer,
                           Sql92, SyncProducer, SyncSimpleConsumer, TopicNotFoundError,
                           UnauthorizedError)

TIMEOUT = 20


def config_for(broker: Any, **overrides: Any) -> ClientConfig:
    return ClientConfig(broker.endpoint, broker.user, broker.password, request_timeout=5, **overrides)


def run(test: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(test(), 120))


async def pull_until(consumer: PullConsumer, count: int) -> list[ReceivedMessage]:
    """Pull until ``count`` messages came; fail after TIMEOUT seconds."""
    messages: list[ReceivedMessage] = []
    deadline = time.monotonic() + TIMEOUT
    while len(messages) < count:
        assert time.monotonic() < deadline, f"only {len(messages)} of {count} messages arrived"
        messages += await consumer.pull(count - len(messages), timeout=1)
    return messages


def test_sent_plain_batched_and_packed_messages_are_pulled_back(native_broker):
    native_broker.create_topic("orders", queues=4)
    native_broker.create_group("readers")

    async def test() -> None:
        async with Producer(config_for(native_broker), ["orders"]) as producer:
            plain = await producer.send(Message("orders", b"one", tag="t", keys=["k1"],
                                                properties={"region": "eu"}))
            batch = await producer.send_batch([Message("orders", b"b%d" % i) for i in range(3)])
            packed = await producer.send_packed("orders", [b"p0", b"p1", b"", b"p3"], tag="telemetry")
        async with PullConsumer(config_for(native_broker), "readers", ["orders"],
                                start_from="earliest", auto_commit_interval=None) as consumer:
            assert len(consumer.assignment()) == 4
            pulled = await pull_until(consumer, 8)
        by_id: dict[str, list[ReceivedMessage]] = {}
        for message in pulled:
            by_id.setdefault(message.message_id, []).append(message)
        first = by_id[plain.message_id][0]
        assert (first.body, first.tag, first.keys, first.properties["region"]) == (b"one", "t", ("k1",), "eu")
        assert [by_id[r.message_id][0].body for r in batch] == [b"b0", b"b1", b"b2"]
        bodies = by_id[packed.message_id]
        assert [(m.body, m.batch_index, m.tag) for m in bodies] == [
            (b"p0", 0, "telemetry"), (b"p1", 1, "telemetry"), (b"", 2, "telemetry"), (b"p3", 3, "telemetry")]
        assert len({(m.queue_id, m.offset) for m in bodies}) == 1
        for receipt in (plain, *batch, packed):
            assert by_id[receipt.message_id][0].offset == receipt.offset
    run(test)


def test_receipt_names_the_queue_the_message_is_in(native_broker):
    native_broker.create_topic("orders", queues=4)
    native_broker.create_group("readers")

    async def test() -> None:
        receipts = []
        for _ in range(2):  # each producer starts its round robin at queue 0
            async with Producer(config_for(native_broker)) as producer:
                receipts.append(await producer.send(Message("orders", b"x")))
        async with PullConsumer(config_for(native_broker), "readers", ["orders"],
                                start_from="earliest", auto_commit_interval=None) as consumer:
            where = {m.message_id: (m.queue_id, m.offset) for m in await pull_until(consumer, 2)}
        assert [where[r.message_id] for r in receipts] == [(r.queue_id, r.offset) for r in receipts]
    run(test)


def test_simple_consumer_receives_retries_and_acks(native_broker):
    native_broker.create_topic("jobs", queues=2)
    native_broker.create_group("workers")

    async def test() -> None:
        async with Producer(config_for(native_broker)) as producer:
            await producer.send(Message("jobs", b"job-1"))
        async with SimpleConsumer(config_for(native_broker), "workers", {"jobs": "*"},
                                  invisible_duration=30, await_duration=1) as consumer:
            first = await receive_one(consumer)
            assert (first.body, first.delivery_attempt) == (b"job-1", 1)
            old_handle = first.receipt_handle
            await consumer.change_invisible_duration(first, 0.1)
            assert first.receipt_handle and first.receipt_handle != old_handle
            again = await receive_one(consumer)
            assert (again.message_id, again.delivery_attempt) == (first.message_id, 2)
            with pytest.raises(InvalidReceiptHandleError):
                await consumer.ack(first)  # superseded by the redelivery's handle
            await consumer.ack(again)
            assert await consumer.receive(16) == [] and await consumer.receive(16) == []
    run(test)


async def receive_one(consumer: SimpleConsumer) -> ReceivedMessage:
    deadline = time.monotonic() + TIMEOUT
    while not (messages := await consumer.receive(1)):
        assert time.monotonic() < deadline, "no message arrived"
    return messages[0]


def test_tag_filter_selects_messages(native_broker):
    native_broker.create_topic("events", queues=1)
    native_broker.create_group("picky")

    async def test() -> None:
        async with SimpleConsumer(config_for(native_broker), "picky", {"events": "a || b"},
                                  await_duration=1) as consumer:
            async with Producer(config_for(native_broker)) as producer:
                for tag in ("a", "c", "b"):
                    await producer.send(Message("events", tag.encode(), tag=tag))
            got = [await receive_one(consumer), await receive_one(consumer)]
            assert sorted(m.tag for m in got) == ["a", "b"]
            assert await consumer.receive(16) == []
    run(test)


def test_sql92_filter_selects_messages_by_property_and_tag(native_broker):
    native_broker.create_topic("payments", queues=2)
    native_broker.create_group("large-eu")
    sent = [("eu", "150", "card"), ("us", "500", "card"), ("eu", "20", "card"), ("eu", "900", "wire"),
            ("eu", "abc", "card")]

    async def test() -> None:
        selector = Sql92("region = 'eu' AND amount > 100 AND TAGS IN ('card', 'cash')")
        async with SimpleConsumer(config_for(native_broker), "large-eu", {"payments": selector},
                                  await_duration=1) as consumer:
            async with Producer(config_for(native_broker)) as producer:
                for region, amount, tag in sent:
                    await producer.send(Message("payments", f"{region}-{amount}".encode(), tag=tag,
                                                properties={"region": region, "amount": amount}))
            got = await receive_one(consumer)
            assert got.body == b"eu-150" and got.properties == {"region": "eu", "amount": "150"}
            await consumer.ack(got)
            assert await consumer.receive(16) == []
    run(test)


def test_a_malformed_sql92_filter_is_refused_naming_the_position(native_broker):
    native_broker.create_topic("payments", queues=1)

    async def test() -> None:
        async with SimpleConsumer(config_for(native_broker), "g", {"payments": Sql92("amount >")},
                                  await_duration=1) as consumer:
            with pytest.raises(BadRequestError, match="position 9"):
                await consumer.receive(1)
    run(test)


def test_push_consumer_acks_successes_retries_failures_then_dead_letters(native_broker):
    native_broker.create_topic("tasks", queues=2)
    native_broker.create_topic("%DLQ%pushers", queues=1)  # so its arrival can be long-polled
    native_broker.create_group("pushers", max_attempts=2, initial_backoff_ms=100, max_backoff_ms=200)

    async def test() -> None:
        calls: Counter[bytes] = Counter()
        attempts: list[int] = []
        done = asyncio.Event()

        async def listener(message: ReceivedMessage) -> None:
            calls[message.body] += 1
            if message.body == b"bad":
                attempts.append(message.delivery_attempt)
                if len(attempts) == 2:
                    done.set()
                raise RuntimeError("cannot process")

        async with PushConsumer(config_for(native_broker), "pushers", {"tasks": "*"}, listener,
                                await_duration=1, assignment_interval=1) as consumer:
            assert consumer.retry_policy.max_attempts == 2
            assert consumer.retry_policy.initial_backoff == 0.1
            async with Producer(config_for(native_broker)) as producer:
                await producer.send_batch([Message("tasks", b"good"), Message("tasks", b"bad")])
            await asyncio.wait_for(done.wait(), TIMEOUT)
            dead = await asyncio.to_thread(native_broker.run, lambda b: b.pull(
                SYSTEM, "check", "%DLQ%pushers", 0, 0, wait_ms=TIMEOUT * 1000))
            assert [m.body for m in dead.messages] == [b"bad"]
        assert attempts == [1, 2] and calls == {b"good": 1, b"bad": 2}
    run(test)


def test_push_consumer_runs_sync_listeners_in_threads_within_the_limit(native_broker):
    native_broker.create_topic("work", queues=4)
    native_broker.create_group("limited")
    lock = threading.Lock()
    state = {"running": 0, "peak": 0, "done": 0}
    all_done = threading.Event()

    def listener(message: ReceivedMessage) -> None:
        with lock:
            state["running"] += 1
            state["peak"] = max(state["peak"], state["running"])
        time.sleep(0.05)  # work, so that listener calls overlap
        with lock:
            state["running"] -= 1
            state["done"] += 1
            if state["done"] == 20:
                all_done.set()

    async def test() -> None:
        async with PushConsumer(config_for(native_broker), "limited", {"work": "*"}, listener,
                                max_concurrency=3, await_duration=1) as consumer:
            async with Producer(config_for(native_broker)) as producer:
                await producer.send_batch([Message("work", b"%d" % i) for i in range(20)])
            assert await asyncio.to_thread(all_done.wait, TIMEOUT), state
            assert len(consumer.assignment()) == 4
        assert 1 < state["peak"] <= 3
    run(test)


def test_pull_consumer_commits_and_a_successor_resumes(native_broker):
    native_broker.create_topic("stream", queues=1)
    native_broker.create_group("etl")

    async def test() -> None:
        async with Producer(config_for(native_broker)) as producer:
            await producer.send_batch([Message("stream", b"%d" % i) for i in range(6)])
            await producer.send_packed("stream", [b"p0", b"p1", b"p2"])
        async with PullConsumer(config_for(native_broker), "etl", ["stream"], start_from="earliest",
                                auto_commit_interval=None) as first:
            assert [m.body for m in await pull_until(first, 4)] == [b"0", b"1", b"2", b"3"]
            await first.commit()
            assert [m.body for m in await pull_until(first, 3)] == [b"4", b"5", b"p0"]
            await first.commit()  # stops inside the packed record: it is read again, whole
        async with PullConsumer(config_for(native_broker), "etl", ["stream"],
                                auto_commit_interval=None) as second:
            assert [m.body for m in await pull_until(second, 3)] == [b"p0", b"p1", b"p2"]
            second.seek("stream", 0, 1)
            assert [m.body for m in await pull_until(second, 2)] == [b"1", b"2"]
            with pytest.raises(ValueError, match="not assigned"):
                second.seek("stream", 7, 0)
    run(test)


def test_pull_consumer_starts_at_latest_and_auto_commits_on_close(native_broker):
    native_broker.create_topic("ticks", queues=2)
    native_broker.create_group("live")

    async def test() -> None:
        async with Producer(config_for(native_broker)) as producer:
            await producer.send(Message("ticks", b"old"))
            async with PullConsumer(config_for(native_broker), "live", ["ticks"]) as consumer:
                assert await consumer.pull(timeout=0.5) == []
                await producer.send(Message("ticks", b"new"))
                assert [m.body for m in await pull_until(consumer, 1)] == [b"new"]
            await producer.send(Message("ticks", b"newer"))
        async with PullConsumer(config_for(native_broker), "live", ["ticks"],
                                start_from="earliest") as consumer:
            assert [m.body for m in await pull_until(consumer, 1)] == [b"newer"]
    run(test)


def test_transactions_commit_roll_back_and_answer_the_brokers_checks(native_broker_factory):
    nb = native_broker_factory(core={"transaction_check_delay_ms": 300,
                                     "transaction_check_interval_ms": 300})
    nb.create_topic("payments", queues=2, message_type=MessageType.TRANSACTION)

    async def checker(message: ReceivedMessage) -> bool:  # the application's own records
        return message.properties["order"] == "paid"

    async def test() -> None:
        async with Producer(config_for(nb), ["payments"], checker=checker) as producer:
            committed = await producer.send_in_transaction(Message("payments", b"a", properties={"order": "paid"}))
            rolled_back = await producer.send_in_transaction(Message("payments", b"b", properties={"order": "paid"}))
            await committed.commit()
            await rolled_back.rollback()
            with pytest.raises(NotFoundError):
                await committed.rollback()
            for order in ("paid", "cancelled"):  # left open: the checker decides
                await producer.send_in_transaction(Message("payments", order.encode(), properties={"order": order}))
            with pytest.raises(BadRequestError, match="within a transaction"):
                await producer.send(Message("payments", b"plain"))
            async with SimpleConsumer(config_for(nb), "g", {"payments": "*"}, await_duration=1) as consumer:
                got: list[ReceivedMessage] = []
                deadline = time.monotonic() + TIMEOUT
                while len(got) < 2:
                    assert time.monotonic() < deadline, [m.body for m in got]
                    for message in await consumer.receive(8):
                        got.append(message)
                        await consumer.ack(message)
                assert sorted(m.body for m in got) == [b"a", b"paid"]
                assert committed.receipt.message_id in {m.message_id for m in got}
                deadline = time.monotonic() + TIMEOUT
                while nb.run(lambda b: b._engine.transactions.open_count):  # "cancelled" rolled back
                    assert time.monotonic() < deadline, "an open transaction was never decided"
                    await asyncio.sleep(0.05)
                assert await consumer.receive(8) == []
    run(test)


def test_priority_messages_are_received_highest_first(native_broker):
    native_broker.create_topic("tasks", queues=3, message_type=MessageType.PRIORITY)

    async def test() -> None:
        async with Producer(config_for(native_broker), ["tasks"]) as producer:
            receipts = [await producer.send(Message("tasks", f"{p}-{i}".encode(), priority=p))
                        for i, p in enumerate([0, 2, 1, 7, 0])]
            assert [r.queue_id for r in receipts] == [0, 2, 1, 2, 0]  # above the top: the top
            with pytest.raises(BadRequestError, match="not a priority topic"):
                await producer.send(Message("orders", b"x", priority=1))
        async with SimpleConsumer(config_for(native_broker), "g", {"tasks": "*"}, await_duration=1) as consumer:
            got = []
            while len(got) < 5:
                for message in await consumer.receive(2):
                    got.append((message.body, message.priority))
                    await consumer.ack(message)
        assert got == [(b"2-1", 2), (b"7-3", 2), (b"1-2", 1), (b"0-0", 0), (b"0-4", 0)]
    native_broker.create_topic("orders", queues=1)
    run(test)


def test_lite_topics_are_consumed_in_order_as_subscribed_at_run_time(native_broker):
    native_broker.create_topic("chats", queues=4, message_type=MessageType.LITE)

    async def drain(consumer: LiteSimpleConsumer, count: int) -> list[ReceivedMessage]:
        got: list[ReceivedMessage] = []
        deadline = time.monotonic() + TIMEOUT
        while len(got) < count:
            assert time.monotonic() < deadline, [m.body for m in got]
            for message in await consumer.receive(32):
                got.append(message)
                await consumer.ack(message)
        return got

    async def test() -> None:
        async with Producer(config_for(native_broker), ["chats"]) as producer:
            for i in range(3):
                for session in ("s1", "s2"):
                    await producer.send(Message("chats", f"{session}-{i}".encode(), lite_topic=session))
        async with LiteSimpleConsumer(config_for(native_broker), "assistants", "chats", ["s1"],
                                      await_duration=1) as consumer:
            got = await drain(consumer, 3)
            assert [(m.lite_topic, m.body) for m in got] == [("s1", f"s1-{i}".encode()) for i in range(3)]
            await consumer.unsubscribe_lite("s1")
            await consumer.subscribe_lite("s2")
            assert [m.body for m in await drain(consumer, 3)] == [f"s2-{i}".encode() for i in range(3)]
            assert await consumer.receive(32) == []
    run(test)


def test_errors_carry_the_brokers_code_and_message(native_broker_factory):
    native_broker = native_broker_factory(core={"auto_create_topics": False})

    async def test() -> None:
        async with Producer(config_for(native_broker)) as producer:
            with pytest.raises(TopicNotFoundError, match="missing"):
                await producer.send(Message("missing", b"x"))
        with pytest.raises(UnauthorizedError):
            await Producer(ClientConfig(native_broker.endpoint, native_broker.user, "wrong")).start()
    run(test)


def test_sync_facade(native_broker):
    native_broker.create_topic("scripts", queues=2)
    native_broker.create_group("cli")
    with SyncProducer(config_for(native_broker)) as producer:
        receipt = producer.send(Message("scripts", b"hello"))
        packed = producer.send_packed("scripts", [b"a", b"b"])
    with SyncSimpleConsumer(config_for(native_broker), "cli", {"scripts": "*"},
                            await_duration=1) as consumer:
        received: list[ReceivedMessage] = []
        deadline = time.monotonic() + TIMEOUT
        while len(received) < 2:
            assert time.monotonic() < deadline
            received += consumer.receive(16)
        for message in received:
            consumer.ack(message)
    assert {m.message_id for m in received} == {receipt.message_id, packed.message_id}


def test_clients_survive_a_broker_restart(native_broker_process):
    broker = native_broker_process(topics=[("metrics", 2)], groups=[("dash", 16, 1000), ("alerts", 16, 1000)])

    async def test() -> None:
        config = config_for(broker, reconnect_timeout=60)
        pushed = {b"before": asyncio.Event(), b"after": asyncio.Event()}

        async def listener(message: ReceivedMessage) -> None:
            pushed[message.body].set()

        async with Producer(config) as producer, PullConsumer(
                config, "dash", ["metrics"], start_from="earliest", await_duration=1) as puller, \
                PushConsumer(config, "alerts", {"metrics": "*"}, listener, await_duration=1,
                             assignment_interval=1):
            await producer.send(Message("metrics", b"before"))
            assert [m.body for m in await pull_until(puller, 1)] == [b"before"]
            await asyncio.wait_for(pushed[b"before"].wait(), TIMEOUT)
            await asyncio.to_thread(broker.kill)
            restart = asyncio.create_task(asyncio.to_thread(broker.start))
            receipt = await producer.send(Message("metrics", b"after"))  # waits for the broker
            await restart
            assert receipt.message_id
            assert [m.body for m in await pull_until(puller, 1)] == [b"after"]
            await asyncio.wait_for(pushed[b"after"].wait(), TIMEOUT)
    run(test)


def test_a_broadcast_group_delivers_every_message_to_every_member(native_broker):
    native_broker.create_topic("alerts", queues=2)
    native_broker.run(lambda broker: broker.create_group(
        SYSTEM, GroupConfig("screens", consume_mode=ConsumeMode.BROADCAST)))

    async def drain(consumer: SimpleConsumer, count: int) -> list[bytes]:
        got: list[bytes] = []
        deadline = time.monotonic() + TIMEOUT
        while len(got) < count:
            assert time.monotonic() < deadline, f"only {len(got)} of {count} messages arrived"
            for message in await consumer.receive(16):
                got.append(message.body)
                await consumer.ack(message)
        return got

    async def test() -> None:
        members = [SimpleConsumer(config_for(native_broker), "screens", {"alerts": "*"}, await_duration=1)
                   for _ in range(3)]
        for member in members:
            await member.start()
            assert await member.receive(16) == []  # joins at the end of the topic
        async with Producer(config_for(native_broker), ["alerts"]) as producer:
            await asyncio.gather(*(producer.send(Message("alerts", b"a%d" % i)) for i in range(10)))
        expected = sorted(b"a%d" % i for i in range(10))
        for member in members:
            assert sorted(await drain(member, 10)) == expected
            await member.close()
    run(test)


def test_a_pull_consumer_can_take_packed_records_whole(native_broker):
    from sluice.client import BATCH_PROPERTY, unpack_bodies
    native_broker.create_topic("stream", queues=1)

    async def test() -> None:
        async with Producer(config_for(native_broker), ["stream"]) as producer:
            await producer.send_packed("stream", [b"a", b"b", b"c"])
            await producer.send(Message("stream", b"plain"))
        async with PullConsumer(config_for(native_broker), "whole", ["stream"], start_from="earliest",
                                auto_commit_interval=None, unpack=False) as consumer:
            records = await pull_until(consumer, 2)
        assert [r.properties.get(BATCH_PROPERTY) for r in records] == ["3", None]
        assert unpack_bodies(records[0].body) == [b"a", b"b", b"c"] and records[1].body == b"plain"
    run(test)
