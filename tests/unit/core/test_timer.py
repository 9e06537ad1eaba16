"""Delayed messages: held in the log until due, sent then with their id and properties,
recallable until then, and kept across a restart without firing twice."""
from __future__ import annotations

import time

import pytest

from core import timer
from core.errors import InvalidArgument, NotRecallable
from core.model import SYSTEM, OutgoingMessage
from core.settings import CoreConfig
from tests.unit.core.test_broker import CONFIG, run, run_core, topic


@pytest.fixture(autouse=True)
def second_buckets(monkeypatch):
    """Minutes of one second, loaded 200 ms ahead: tests cross many of them in seconds."""
    monkeypatch.setattr(timer, "BUCKET_MS", 1000)
    monkeypatch.setattr(timer, "LOAD_AHEAD_MS", 200)


def in_ms(delay: int) -> int:
    return int(time.time() * 1000) + delay


async def receive_all(broker, count: int, group: str = "g", wait_ms: int = 10_000) -> list:
    got: list = []
    deadline = time.monotonic() + wait_ms / 1000
    while len(got) < count and time.monotonic() < deadline:
        batch = await broker.receive(SYSTEM, group, "orders", "c1", max_messages=32, wait_ms=wait_ms)
        for delivery in batch:
            await broker.ack(SYSTEM, group, "orders", delivery.receipt_handle)
        got += batch
    return got


def test_a_delayed_message_is_delivered_when_due_with_its_id_and_properties(tmp_path):
    async def scenario(broker) -> None:
        await topic(broker, queues=2)
        due = in_ms(1500)
        [held, now] = await broker.send(SYSTEM, [
            OutgoingMessage("orders", b"later", tag="T", keys=("k",), properties={"a": "1"},
                            delivery_ts=due),
            OutgoingMessage("orders", b"now")])
        assert held.recall_handle and held.topic.startswith(timer.TIMER_PREFIX)
        assert not now.recall_handle and now.topic == "orders"
        first = await receive_all(broker, 1)
        assert [d.body for d in first] == [b"now"]
        [late] = await receive_all(broker, 1)
        arrived = int(time.time() * 1000)
        assert late.body == b"later" and late.msg_id == held.msg_id
        assert (late.tag, late.keys, dict(late.properties)) == ("T", ("k",), {"a": "1"})
        assert due <= arrived < due + 1000
        assert await broker.receive(SYSTEM, "g", "orders", "c1", wait_ms=300) == []
    run(tmp_path, scenario, store="file")


def test_messages_fire_in_due_order_across_minutes(tmp_path):
    async def scenario(broker) -> None:
        await topic(broker, queues=1)
        base = in_ms(600)
        delays = [1900, 300, 1100, 0, 2600, 700]
        await broker.send(SYSTEM, [OutgoingMessage("orders", str(d).encode(), delivery_ts=base + d)
                                   for d in delays])
        got = await receive_all(broker, len(delays))
        assert [int(d.body) for d in got] == sorted(delays)
    run(tmp_path, scenario, store="file")


def test_a_recalled_message_is_never_delivered(tmp_path):
    async def scenario(broker) -> None:
        await topic(broker, queues=1)
        [keep, drop] = await broker.send(SYSTEM, [
            OutgoingMessage("orders", b"keep", delivery_ts=in_ms(800)),
            OutgoingMessage("orders", b"drop", delivery_ts=in_ms(800))])
        await broker.recall(SYSTEM, "orders", drop.recall_handle)
        with pytest.raises(NotRecallable, match="recalled already"):
            await broker.recall(SYSTEM, "orders", drop.recall_handle)
        got = await receive_all(broker, 1)
        assert [d.body for d in got] == [b"keep"]
        assert await broker.receive(SYSTEM, "g", "orders", "c1", wait_ms=500) == []
        with pytest.raises(NotRecallable, match="delivered"):
            await broker.recall(SYSTEM, "orders", keep.recall_handle)
    run(tmp_path, scenario, store="file")


def test_recall_checks_the_handle_and_its_topic(tmp_path):
    async def scenario(broker) -> None:
        await topic(broker, queues=1)
        await topic(broker, "other", queues=1)
        [held] = await broker.send(SYSTEM, [OutgoingMessage("orders", b"x", delivery_ts=in_ms(60_000))])
        with pytest.raises(NotRecallable, match="'other'"):
            await broker.recall(SYSTEM, "other", held.recall_handle)
        bucket, offset, msg_id = timer.parse_recall_handle(held.recall_handle)
        with pytest.raises(NotRecallable):
            await broker.recall(SYSTEM, "orders", timer.recall_handle(bucket, offset, "forged"))
        for malformed in ("", "x", "1:2", "a:b:c", "1:2:" + "x" * 300):
            with pytest.raises(InvalidArgument, match="recall handle"):
                await broker.recall(SYSTEM, "orders", malformed)
        await broker.recall(SYSTEM, "orders", held.recall_handle)
    run(tmp_path, scenario, store="file")


def test_a_delay_beyond_the_limit_is_refused_and_nothing_of_the_batch_is_stored(tmp_path):
    async def scenario(broker) -> None:
        await topic(broker, queues=1)
        with pytest.raises(InvalidArgument, match="core.max_delay_ms"):
            await broker.send(SYSTEM, [OutgoingMessage("orders", b"a"),
                                       OutgoingMessage("orders", b"b", delivery_ts=in_ms(120_000))])
        with pytest.raises(InvalidArgument, match="does not exist"):
            await broker.send(SYSTEM, [OutgoingMessage("orders", b"c", delivery_ts=in_ms(500)),
                                       OutgoingMessage("orders", b"d", queue_id=7)])
        assert await broker.receive(SYSTEM, "g", "orders", "c1", wait_ms=1500) == []
    run(tmp_path, scenario, store="file",
        config=CoreConfig(**{**CONFIG.__dict__, "max_delay_ms": 60_000}))


def test_pending_messages_survive_a_restart_and_fired_ones_do_not_fire_again(tmp_path):
    handles = {}

    async def before(core) -> None:
        broker = core.broker
        await topic(broker, queues=1)
        results = await broker.send(SYSTEM, [
            OutgoingMessage("orders", b"early", delivery_ts=in_ms(300)),
            OutgoingMessage("orders", b"due-while-down", delivery_ts=in_ms(1200)),
            OutgoingMessage("orders", b"recalled", delivery_ts=in_ms(1200)),
            OutgoingMessage("orders", b"after-restart", delivery_ts=in_ms(4000))])
        handles.update(zip(["early", "down", "recalled", "after"], results))
        await broker.recall(SYSTEM, "orders", handles["recalled"].recall_handle)
        got = await receive_all(broker, 1)
        assert [d.body for d in got] == [b"early"]

    async def after(core) -> None:
        got = await receive_all(core.broker, 2)
        assert [d.body for d in got] == [b"due-while-down", b"after-restart"]
        assert got[0].msg_id == handles["down"].msg_id
        assert await core.broker.receive(SYSTEM, "g", "orders", "c1", wait_ms=500) == []

    run_core(tmp_path, before, store="file")
    time.sleep(1.5)  # the broker stays down while a message falls due (time passing is the point)
    run_core(tmp_path, after, store="file")


def test_an_unreadable_mark_is_logged_and_pending_messages_still_fire(tmp_path, caplog):
    async def before(core) -> None:
        await topic(core.broker, queues=1)
        await core.broker.send(SYSTEM, [OutgoingMessage("orders", b"later", delivery_ts=in_ms(500))])

    async def after(core) -> None:
        got = await receive_all(core.broker, 1)
        assert [d.body for d in got] == [b"later"]

    run_core(tmp_path, before, store="file")
    (tmp_path / timer.FILE_NAME).write_text("{not json")
    run_core(tmp_path, after, store="file")
    assert "timer.json is unreadable" in caplog.text
