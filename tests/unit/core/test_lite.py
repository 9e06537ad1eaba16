"""Lite topics in core: created by their first message, consumed in order by the clients that
subscribe to them at run time, kept across a restart, and deleted after their TTL."""
from __future__ import annotations

import dataclasses

import pytest

from core import clock, lite
from core.errors import InvalidArgument, QuotaExceeded, ReceiptExpired
from core.model import SYSTEM, GroupConfig, MessageType, OutgoingMessage, RetryPolicy, TopicConfig
from tests.unit.core.test_broker import CONFIG, run, run_core


async def sessions(broker, queues: int = 2) -> None:
    await broker.create_topic(SYSTEM, TopicConfig("sessions", queues, MessageType.LITE))


def to(name: str, body: str) -> OutgoingMessage:
    return OutgoingMessage("sessions", body.encode(), keys=("k",), properties={"a": "1"}, lite_topic=name)


async def receive(broker, client: str = "c1", limit: int = 32, wait_ms: int = 0, group: str = "g") -> list:
    return await broker.receive(SYSTEM, group, "sessions", client, max_messages=limit, wait_ms=wait_ms)


def test_a_client_gets_only_its_lite_topics_each_in_order_one_batch_at_a_time(tmp_path):
    async def scenario(broker) -> None:
        await sessions(broker)
        await broker.send(SYSTEM, [to(name, f"{name}-{i}") for i in range(3) for name in ("s1", "s2", "s3")])
        assert await receive(broker) == []  # subscribed to nothing yet: nothing is lost either
        await broker.sync_lite_subscription(SYSTEM, "g", "sessions", "c1", lite.PARTIAL_ADD, ["s1", "s2"])
        first = await receive(broker)
        assert sorted(d.body.decode() for d in first) == [f"{n}-{i}" for n in ("s1", "s2") for i in range(3)]
        by_topic = {n: [d.body.decode() for d in first if d.lite_topic == n] for n in ("s1", "s2")}
        assert by_topic == {n: [f"{n}-{i}" for i in range(3)] for n in ("s1", "s2")}
        assert (first[0].keys, dict(first[0].properties)) == (("k",), {"a": "1"})
        await broker.send(SYSTEM, [to("s1", "s1-3")])
        assert await receive(broker) == []  # s1's batch is in flight: its next message waits
        for delivery in first:
            await broker.ack(SYSTEM, "g", "sessions", delivery.receipt_handle)
        [later] = await receive(broker, wait_ms=1000)
        assert later.body == b"s1-3"
        await broker.sync_lite_subscription(SYSTEM, "g", "sessions", "c1", lite.COMPLETE_ADD, ["s3"])
        assert sorted(d.body for d in await receive(broker)) == [b"s3-0", b"s3-1", b"s3-2"]
    run(tmp_path, scenario, store="file")


def test_an_unsettled_message_comes_back_then_goes_to_the_dead_letter_topic(tmp_path):
    async def scenario(broker) -> None:
        await sessions(broker, queues=1)
        await broker.create_group(SYSTEM, GroupConfig("g", retry=RetryPolicy(max_attempts=2)))
        await broker.send(SYSTEM, [to("s1", "a"), to("s1", "b")])
        await broker.sync_lite_subscription(SYSTEM, "g", "sessions", "c1", lite.PARTIAL_ADD, ["s1"])
        [a, b] = await broker.receive(SYSTEM, "g", "sessions", "c1", invisible_ms=100)
        await broker.ack(SYSTEM, "g", "sessions", b.receipt_handle)
        handle = await broker.change_invisible(SYSTEM, "g", "sessions", a.receipt_handle, 100)
        with pytest.raises(ReceiptExpired):
            await broker.ack(SYSTEM, "g", "sessions", a.receipt_handle)  # superseded
        [again] = await broker.receive(SYSTEM, "g", "sessions", "c1", invisible_ms=100, wait_ms=2000)
        assert (again.body, again.attempt) == (b"a", 2) and again.receipt_handle != handle
        assert await broker.receive(SYSTEM, "g", "sessions", "c1", invisible_ms=100, wait_ms=500) == []
        dead = await broker.receive(SYSTEM, "dlq-reader", "%DLQ%g", "c9", wait_ms=1000)
        assert [d.body for d in dead] == [b"a"]
    run(tmp_path, scenario, store="file")


def test_positions_and_lite_topics_survive_a_restart(tmp_path):
    async def before(core) -> None:
        broker = core.broker
        await sessions(broker)
        await broker.send(SYSTEM, [to("s1", "old"), to("s2", "other")])
        await broker.sync_lite_subscription(SYSTEM, "g", "sessions", "c1", lite.PARTIAL_ADD, ["s1"])
        [old] = await receive(broker)
        await broker.ack(SYSTEM, "g", "sessions", old.receipt_handle)
        await broker.send(SYSTEM, [to("s1", "new")])

    async def after(core) -> None:
        broker = core.broker
        assert set(core.engine.lite.live) == {("sessions", "s1"), ("sessions", "s2")}
        await broker.sync_lite_subscription(SYSTEM, "g", "sessions", "c1", lite.PARTIAL_ADD, ["s1", "s2"])
        assert sorted(d.body for d in await receive(broker)) == [b"new", b"other"]

    run_core(tmp_path, before, store="file")
    run_core(tmp_path, after, store="file")


def test_a_lite_topic_expires_after_its_ttl_and_a_new_one_starts_empty(tmp_path):
    async def scenario(core) -> None:
        broker = core.broker
        await sessions(broker)
        await broker.send(SYSTEM, [to("s1", "stale")])
        await broker.sync_lite_subscription(SYSTEM, "g", "sessions", "c1", lite.PARTIAL_ADD, ["s1"])
        await core.engine.lite.expire(clock.now_ms() + 301)  # what the expiry timer runs
        assert ("sessions", "s1") not in core.engine.lite.live
        assert await receive(broker) == []
        await broker.send(SYSTEM, [to("s1", "fresh")])
        assert [d.body for d in await receive(broker)] == [b"fresh"]
    run_core(tmp_path, scenario, store="file", config=dataclasses.replace(CONFIG, lite_topic_ttl_ms=300))


def test_lite_sends_are_checked_and_bounded(tmp_path):
    async def scenario(broker) -> None:
        await sessions(broker)
        await broker.create_topic(SYSTEM, TopicConfig("orders", 1))
        with pytest.raises(InvalidArgument, match="names its lite topic"):
            await broker.send(SYSTEM, [OutgoingMessage("sessions", b"x")])
        with pytest.raises(InvalidArgument, match="not of message type LITE"):
            await broker.send(SYSTEM, [OutgoingMessage("orders", b"x", lite_topic="s1")])
        with pytest.raises(InvalidArgument, match="printable"):
            await broker.send(SYSTEM, [to("bad\x00name", "x")])
        await broker.send(SYSTEM, [to("s1", "a"), to("s2", "b")])
        with pytest.raises(QuotaExceeded, match="max_lite_topics"):
            await broker.send(SYSTEM, [to("s3", "c")])
        await broker.send(SYSTEM, [to("s1", "d")])  # an existing one takes more
        with pytest.raises(InvalidArgument, match="not of message type LITE"):
            await broker.sync_lite_subscription(SYSTEM, "g", "orders", "c1", lite.PARTIAL_ADD, ["s1"])
    run(tmp_path, scenario, store="file", config=dataclasses.replace(CONFIG, max_lite_topics=2))


def test_lite_deliveries_and_acks_are_traced(tmp_path):
    async def scenario(broker) -> None:
        await sessions(broker)
        [sent] = await broker.send(SYSTEM, [to("s1", "traced")])
        await broker.sync_lite_subscription(SYSTEM, "g", "sessions", "c1", lite.PARTIAL_ADD, ["s1"])
        [got] = await receive(broker)
        await broker.ack(SYSTEM, "g", "sessions", got.receipt_handle)
        trace = await broker.trace_message(SYSTEM, sent.msg_id)
        assert [(e.event, e.group, e.client) for e in trace.events][-2:] == [
            ("delivered", "g", "c1"), ("acked", "g", "c1")]
    run(tmp_path, scenario, store="file", config=dataclasses.replace(CONFIG, message_trace=True))
