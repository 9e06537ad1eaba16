"""Per-message trace through the core: events of pop consumption, authorization, the cap."""
from __future__ import annotations

import dataclasses

import pytest

from core.assembly import Core
from core.errors import AccessDenied, MessageNotFound, PreconditionFailed
from core.model import SYSTEM, Action, GroupConfig, OutgoingMessage, Permission, ResourceKind, RetryPolicy
from core.service import Broker
from core.trace import MAX_EVENTS, TRACE_TOPIC

from .test_broker import CONFIG, run, run_core, topic

TRACED = dataclasses.replace(CONFIG, message_trace=True)


def steps(trace) -> list[tuple]:
    return [(e.event, e.group, e.client, e.attempt, e.detail) for e in trace.events]


async def send_one(broker: Broker, body: bytes) -> str:
    [sent] = await broker.send(SYSTEM, [OutgoingMessage("orders", body)])
    return sent.msg_id


@pytest.mark.parametrize("store", ["memory", "file"])
def test_trace_follows_a_message_through_retry_ack_and_dead_letter(tmp_path, store):
    async def scenario(broker: Broker) -> None:
        await topic(broker, queues=1)
        await broker.create_group(SYSTEM, GroupConfig("g", retry=RetryPolicy(max_attempts=3)))
        retried_id = await send_one(broker, b"a")
        dead_id = await send_one(broker, b"b")
        first = await broker.receive(SYSTEM, "g", "orders", "c1", invisible_ms=60_000)
        a, b = sorted(first, key=lambda d: d.body)
        await broker.change_invisible(SYSTEM, "g", "orders", a.receipt_handle, 0)
        [again] = await broker.receive(SYSTEM, "g", "orders", "c2", invisible_ms=60_000)
        await broker.ack(SYSTEM, "g", "orders", again.receipt_handle)
        await broker.forward_to_dead_letter(SYSTEM, "g", "orders", b.receipt_handle)

        trace = await broker.trace_message(SYSTEM, retried_id)
        assert (trace.message.msg_id, trace.message.body, trace.truncated) == (retried_id, b"a", False)
        assert steps(trace) == [
            ("delivered", "g", "c1", 1, ""),
            ("retried", "g", "c1", 1, "invisible time changed to 0 ms"),
            ("retried", "g", "c2", 2, "invisible time ended"),
            ("delivered", "g", "c2", 2, ""),
            ("acked", "g", "c2", 0, "")]
        times = [e.time_ms for e in trace.events]
        assert times == sorted(times) and times[0] >= trace.message.store_ts
        assert steps(await broker.trace_message(SYSTEM, dead_id)) == [
            ("delivered", "g", "c1", 1, ""), ("dead_lettered", "g", "c1", 1, "%DLQ%g")]
    run(tmp_path, scenario, store=store, config=TRACED)


def test_a_message_past_its_attempts_is_traced_to_the_dead_letter_topic(tmp_path):
    async def scenario(broker: Broker) -> None:
        await topic(broker, queues=1)
        await broker.create_group(SYSTEM, GroupConfig("g", retry=RetryPolicy(max_attempts=1)))
        msg_id = await send_one(broker, b"a")
        [got] = await broker.receive(SYSTEM, "g", "orders", "c1", invisible_ms=60_000)
        await broker.change_invisible(SYSTEM, "g", "orders", got.receipt_handle, 0)
        assert await broker.receive(SYSTEM, "g", "orders", "c1", invisible_ms=60_000) == []
        assert [e.event for e in (await broker.trace_message(SYSTEM, msg_id)).events] == [
            "delivered", "retried", "dead_lettered"]
    run(tmp_path, scenario, config=TRACED)


def test_trace_needs_the_subscribe_right_on_the_message_topic(tmp_path):
    async def scenario(broker: Broker) -> None:
        await topic(broker, queues=1)
        msg_id = await send_one(broker, b"a")
        broker.users.create_user("app", "secret")
        broker.users.grant(Permission("app", ResourceKind.TOPIC, "orders", frozenset({Action.PUBLISH})))
        app = await broker.authenticate("app", "secret")
        with pytest.raises(MessageNotFound):  # its topic is not searched
            await broker.trace_message(app, msg_id)
        with pytest.raises(AccessDenied):
            await broker.trace_message(app, msg_id, topic="orders")
        with pytest.raises(AccessDenied):  # nor through the internal topic
            await broker.pull(app, "g", TRACE_TOPIC, 0, 0)
    run(tmp_path, scenario, config=TRACED)


def test_a_trace_answers_with_the_newest_events_when_there_are_too_many(tmp_path):
    async def scenario(broker: Broker) -> None:
        await topic(broker, queues=1)
        msg_id = await send_one(broker, b"a")
        [got] = await broker.receive(SYSTEM, "g", "orders", "c1", invisible_ms=60_000)
        handle = got.receipt_handle
        for i in range(MAX_EVENTS + 5):
            handle = await broker.change_invisible(SYSTEM, "g", "orders", handle, 60_000 + i)
        trace = await broker.trace_message(SYSTEM, msg_id)
        assert trace.truncated and len(trace.events) == MAX_EVENTS
        assert trace.events[-1].detail == f"invisible time changed to {60_000 + MAX_EVENTS + 4} ms"
    run(tmp_path, scenario, config=TRACED)


def test_tracing_off_writes_nothing_and_says_how_to_turn_it_on(tmp_path):
    async def scenario(core: Core) -> None:
        broker = core.broker
        await topic(broker, queues=1)
        msg_id = await send_one(broker, b"a")
        [got] = await broker.receive(SYSTEM, "g", "orders", "c1", invisible_ms=60_000)
        await broker.ack(SYSTEM, "g", "orders", got.receipt_handle)
        with pytest.raises(PreconditionFailed, match="core.message_trace = true"):
            await broker.trace_message(SYSTEM, msg_id)
        assert core.engine.store.queue_range(TRACE_TOPIC, 0) == (0, 0)
    run_core(tmp_path, scenario)


async def tenant(broker: Broker, name: str, topic_name: str, group: str):
    """A user who may publish to and consume ``topic_name`` through ``group``, and nothing else."""
    broker.users.create_user(name, "secret")
    broker.users.grant(Permission(name, ResourceKind.TOPIC, topic_name,
                                  frozenset({Action.PUBLISH, Action.SUBSCRIBE})))
    broker.users.grant(Permission(name, ResourceKind.GROUP, group, frozenset({Action.SUBSCRIBE})))
    return await broker.authenticate(name, "secret")


@pytest.mark.parametrize("store", ["memory", "file"])
def test_an_id_reused_in_another_topic_hides_neither_message_nor_trace(tmp_path, store):
    async def scenario(broker: Broker) -> None:
        await topic(broker, "orders", queues=1)
        await topic(broker, "spam", queues=1)
        alice = await tenant(broker, "alice", "orders", "g")
        bob = await tenant(broker, "bob", "spam", "h")
        await broker.send(alice, [OutgoingMessage("orders", b"alice's", msg_id="order-7")])
        [mine] = await broker.receive(alice, "g", "orders", "c1", invisible_ms=60_000)
        await broker.ack(alice, "g", "orders", mine.receipt_handle)
        await broker.send(bob, [OutgoingMessage("spam", b"bob's", msg_id="order-7")])  # newer
        [theirs] = await broker.receive(bob, "h", "spam", "c2", invisible_ms=60_000)
        await broker.change_invisible(bob, "h", "spam", theirs.receipt_handle, 0)
        [theirs] = await broker.receive(bob, "h", "spam", "c2", invisible_ms=60_000)
        await broker.forward_to_dead_letter(bob, "h", "spam", theirs.receipt_handle)

        assert [m.body for m in broker.lookup_messages(alice, "order-7")] == [b"alice's"]
        assert [m.body for m in broker.lookup_messages(bob, "order-7")] == [b"bob's"]
        trace = await broker.trace_message(alice, "order-7")
        assert (trace.message.body, trace.same_id) == (b"alice's", ())
        assert steps(trace) == [("delivered", "g", "c1", 1, ""), ("acked", "g", "c1", 0, "")]
        trace = await broker.trace_message(bob, "order-7")
        assert [e.event for e in trace.events] == ["delivered", "retried", "retried", "delivered",
                                                   "dead_lettered"]
        with pytest.raises(AccessDenied):
            await broker.trace_message(alice, "order-7", topic="spam")

        everything = await broker.trace_message(SYSTEM, "order-7")  # may read both: sees both
        assert everything.message.body == b"bob's"
        assert [m.body for m in everything.same_id] == [b"alice's"]
        named = await broker.trace_message(SYSTEM, "order-7", topic="orders")
        own = await broker.trace_message(alice, "order-7")
        assert (named.message.body, steps(named)) == (b"alice's", steps(own))
    run(tmp_path, scenario, store=store, config=TRACED)
