"""Delayed messages: held in the log until due, sent then with their id and properties,
recallable until then, and kept across a restart without firing twice."""
from __future__ import annotations

import asyncio
import errno
import logging
import threading
import time
from collections.abc import Awaitable
from typing import TypeVar

import pytest

from core import clock, timer
from core.errors import InvalidArgument, NotRecallable, QuotaExceeded
from core.model import SYSTEM, OutgoingMessage
from core.settings import CoreConfig
from store.faults import Fault
from tests.unit.core.test_broker import CONFIG, STATE_HOMES, run, run_core, topic

T = TypeVar("T")
WAIT_S = 60
"""Only guards against hanging."""


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


@STATE_HOMES
def test_pending_messages_survive_a_restart_and_fired_ones_do_not_fire_again(tmp_path, config):
    """With ``replicated_state`` the fired-up-to mark (like the offsets) lives in the log."""
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

    run_core(tmp_path, before, store="file", config=config)
    time.sleep(1.5)  # the broker stays down while a message falls due (time passing is the point)
    run_core(tmp_path, after, store="file", config=config)
    assert (tmp_path / timer.FILE_NAME).exists() is (config is CONFIG)


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


class StoppableClock(asyncio.SelectorEventLoop):
    """An event loop whose clock can be stopped: from then on no sleep or timeout ends, and
    only events make progress (callbacks from the store's threads, tasks that finish)."""

    stopped_at: float | None = None

    def time(self) -> float:
        return super().time() if self.stopped_at is None else self.stopped_at

    def stop_clock(self) -> None:
        self.stopped_at = super().time()

    def start_clock(self) -> None:
        self.stopped_at = None


async def within(awaitable: Awaitable[T], what: str) -> T:
    """``await awaitable``, failing after ``WAIT_S`` real seconds even with the loop's clock
    stopped (a thread cancels it)."""
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(awaitable)
    guard = threading.Timer(WAIT_S, lambda: loop.call_soon_threadsafe(task.cancel))
    guard.start()
    try:
        return await task
    except asyncio.CancelledError:
        raise AssertionError(f"{what} within {WAIT_S} s") from None
    finally:
        guard.cancel()


class StopClockOnLog(logging.Handler):
    """Stops the loop's clock when a record starting with ``prefix`` is logged: at once, in
    the logging call, so that whatever the logger does next waits on a stopped clock."""

    def __init__(self, loop: StoppableClock, prefix: str) -> None:
        super().__init__()
        self.loop, self.prefix = loop, prefix
        self.stopped = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if not self.stopped.is_set() and record.getMessage().startswith(self.prefix):
            self.loop.stop_clock()
            self.stopped.set()


def test_messages_due_while_the_disk_is_full_are_sent_as_soon_as_the_store_writes_again(
        tmp_path, faults, monkeypatch):
    """Messages fall due while the store refuses writes. From the timer's failed attempt on,
    neither the wall clock core reads nor the event loop's clock moves: no retry delay can end
    and the minute never changes, so only the store's resume can send them."""
    wall_ms = [int(time.time() * 1000)]
    monkeypatch.setattr(clock, "now_ms", lambda: wall_ms[0])

    async def scenario(core) -> None:
        broker = core.broker
        await topic(broker, queues=1)
        await topic(broker, "other", queues=1)
        wall_ms[0] = int(time.time() * 1000)
        due = wall_ms[0] + 30_000
        await broker.send(SYSTEM, [OutgoingMessage("orders", b"due %d" % i, delivery_ts=due)
                                   for i in range(3)])
        faults.add(Fault("commitlog", "write", errno.ENOSPC))
        with pytest.raises(QuotaExceeded):  # the store fails and the broker knows it
            await broker.send(SYSTEM, [OutgoingMessage("other", b"not stored")])
        failed = StopClockOnLog(asyncio.get_running_loop(), "delayed messages could not be sent")
        logging.getLogger(timer.__name__).addHandler(failed)
        try:
            wall_ms[0] = due  # they fall due, within the same minute
            await within(failed.stopped.wait(), "the timer did not try to send what fell due")
        finally:
            logging.getLogger(timer.__name__).removeHandler(failed)
        faults.lift()
        got: list = []
        try:
            while len(got) < 3:
                got += await within(broker.receive(SYSTEM, "g", "orders", "c1", max_messages=32,
                                                   wait_ms=3_600_000),
                                    "what fell due was not sent once the store wrote again")
        finally:
            failed.loop.start_clock()  # closing the core waits on timeouts
        assert sorted(delivery.body for delivery in got) == [b"due 0", b"due 1", b"due 2"]

    run_core(tmp_path, scenario, store="file", loop_factory=StoppableClock)
