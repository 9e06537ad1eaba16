"""The service facade over a real store and SQLite metadata: send, pop, pull, groups, offsets."""
from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import pytest

from core.errors import (AccessDenied, BadFilter, GroupNotFound, InvalidReceiptHandle,
                         MessageTooLarge, ReceiptExpired, TopicNotFound)
from core.metadata import MetadataRepository
from core.model import (SYSTEM, Action, ConsumeMode, GroupConfig, OutgoingMessage, Permission,
                        ResourceKind, RetryPolicy, TopicConfig)
from core.assembly import Core
from core.routing import TopicSyntax
from core.service import Broker
from core.settings import CoreConfig
from store import FileStore, MemoryStore, StoreConfig

CONFIG = CoreConfig(heartbeat_timeout_ms=300, offset_commit_interval_ms=50)
SUBJECTS = TopicSyntax("/", "+", "#", multi_last=True, dollar_hidden=True)
"""Subject filters as MQTT writes them (the composition root gives core MQTT's syntax)."""
Scenario = Callable[[Broker], Awaitable[None]]


def run_core(tmp_path, scenario: Callable[[Core], Awaitable[None]], *, store: str = "memory",
             config: CoreConfig = CONFIG,
             loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = None) -> None:
    """Run ``scenario`` against a started core, then close it (on a loop of ``loop_factory``)."""
    async def main() -> None:
        opened = (MemoryStore() if store == "memory"
                  else FileStore(str(tmp_path / "store"), StoreConfig(segment_size=1 << 20)))
        metadata = MetadataRepository.for_data_dir(str(tmp_path))
        core = Core(opened, metadata, str(tmp_path), config, subject_syntax=SUBJECTS)
        await core.start()
        try:
            await scenario(core)
        finally:
            await core.close()
            opened.close()
            metadata.close()
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(main())


def run(tmp_path, scenario: Scenario, *, store: str = "memory", config: CoreConfig = CONFIG) -> None:
    """Run ``scenario`` against the client API of a started core, then close it."""
    async def with_broker(core: Core) -> None:
        await scenario(core.broker)
    run_core(tmp_path, with_broker, store=store, config=config)


async def topic(broker: Broker, name: str = "orders", queues: int = 4) -> None:
    await broker.create_topic(SYSTEM, TopicConfig(name, queue_count=queues))


async def send(broker: Broker, count: int, name: str = "orders", tag: str = "", prefix: str = "m") -> None:
    await broker.send(SYSTEM, [OutgoingMessage(name, f"{prefix}{i}".encode(), tag=tag) for i in range(count)])


def bodies(deliveries) -> set[bytes]:
    return {d.body for d in deliveries}


@pytest.mark.parametrize("store", ["memory", "file"])
def test_pop_delivers_each_message_once_and_ack_settles_it(tmp_path, store):
    async def scenario(broker: Broker) -> None:
        await topic(broker)
        await send(broker, 20)
        got = await broker.receive(SYSTEM, "g", "orders", "c1", max_messages=32, invisible_ms=60_000)
        assert bodies(got) == {f"m{i}".encode() for i in range(20)}
        assert await broker.receive(SYSTEM, "g", "orders", "c1", invisible_ms=60_000) == []
        for delivery in got:
            await broker.ack(SYSTEM, "g", "orders", delivery.receipt_handle)
        assert [lag.lag for lag in broker.lag("g")] == [0, 0, 0, 0]
    run(tmp_path, scenario, store=store)


def test_unacked_message_is_redelivered_after_its_invisible_duration(tmp_path):
    async def scenario(broker: Broker) -> None:
        await topic(broker, queues=1)
        await send(broker, 1)
        first = await broker.receive(SYSTEM, "g", "orders", "c1", invisible_ms=200)
        again = await broker.receive(SYSTEM, "g", "orders", "c1", invisible_ms=60_000, wait_ms=5_000)
        assert [d.body for d in again] == [b"m0"] and again[0].attempt == 2 == first[0].attempt + 1
        with pytest.raises(ReceiptExpired):
            await broker.ack(SYSTEM, "g", "orders", first[0].receipt_handle)
        await broker.ack(SYSTEM, "g", "orders", again[0].receipt_handle)
    run(tmp_path, scenario)


def test_change_invisible_duration_supersedes_the_old_handle(tmp_path):
    async def scenario(broker: Broker) -> None:
        await topic(broker, queues=1)
        await send(broker, 1)
        [delivery] = await broker.receive(SYSTEM, "g", "orders", "c1", invisible_ms=200)
        handle = await broker.change_invisible(SYSTEM, "g", "orders", delivery.receipt_handle, 60_000)
        assert await broker.receive(SYSTEM, "g", "orders", "c1", wait_ms=500) == []
        with pytest.raises(ReceiptExpired):
            await broker.ack(SYSTEM, "g", "orders", delivery.receipt_handle)
        await broker.ack(SYSTEM, "g", "orders", handle)
    run(tmp_path, scenario)


def test_malformed_or_foreign_receipt_handles_are_refused(tmp_path):
    async def scenario(broker: Broker) -> None:
        await topic(broker, queues=1)
        await topic(broker, "other", queues=1)
        await send(broker, 1)
        [delivery] = await broker.receive(SYSTEM, "g", "orders", "c1")
        for handle in ["", "garbage", "a.b.c.d.e", "x" * 1000]:
            with pytest.raises(InvalidReceiptHandle):
                await broker.ack(SYSTEM, "g", "orders", handle)
        with pytest.raises(InvalidReceiptHandle):
            await broker.ack(SYSTEM, "another-group", "orders", delivery.receipt_handle)
        await broker.ack(SYSTEM, "g", "orders", delivery.receipt_handle)
    run(tmp_path, scenario)


def test_message_goes_to_the_dead_letter_topic_after_max_attempts(tmp_path):
    async def scenario(broker: Broker) -> None:
        await topic(broker, queues=1)
        await broker.create_group(SYSTEM, GroupConfig("g", retry=RetryPolicy(max_attempts=2)))
        await send(broker, 1)
        attempts = []
        for _ in range(2):
            got = await broker.receive(SYSTEM, "g", "orders", "c1", invisible_ms=100, wait_ms=5_000)
            attempts += [d.attempt for d in got]
        assert attempts == [1, 2]
        assert await broker.receive(SYSTEM, "g", "orders", "c1", invisible_ms=100, wait_ms=600) == []
        dead = await broker.pull(SYSTEM, "dlq-reader", "%DLQ%g", 0, 0)
        assert [m.body for m in dead.messages] == [b"m0"]
        assert dead.messages[0].properties["sluice.dlq.origin_topic"] == "orders"
        assert broker.lag("g")[0].lag == 0
    run(tmp_path, scenario)


def test_tag_filter_delivers_only_matching_tags(tmp_path):
    async def scenario(broker: Broker) -> None:
        await topic(broker, queues=2)
        for tag in ["A", "B", "C"]:
            await send(broker, 3, tag=tag, prefix=tag)
        got = await broker.receive(SYSTEM, "g", "orders", "c1", expression="A || C", max_messages=100)
        assert {d.tag for d in got} == {"A", "C"} and len(got) == 6
        with pytest.raises(BadFilter):
            await broker.receive(SYSTEM, "g", "orders", "c1", expression="A ||")
        with pytest.raises(BadFilter, match="position 5"):
            await broker.receive(SYSTEM, "g", "orders", "c1", expression="a > ", expression_type="SQL92")
    run(tmp_path, scenario)


def test_sql92_filter_settles_rejected_messages_for_the_group_only(tmp_path):
    async def scenario(broker: Broker) -> None:
        await topic(broker, queues=1)
        await broker.send(SYSTEM, [OutgoingMessage("orders", b"m%d" % n, tag="T", properties={"n": str(n)})
                                   for n in range(6)])
        got = await broker.receive(SYSTEM, "g", "orders", "c1", expression="n >= 4 AND TAGS = 'T'",
                                   expression_type="SQL92", max_messages=100)
        assert [d.body for d in got] == [b"m4", b"m5"]
        for delivery in got:
            await broker.ack(SYSTEM, "g", "orders", delivery.receipt_handle)
        assert await broker.receive(SYSTEM, "g", "orders", "c1", expression="n >= 0",
                                    expression_type="SQL92") == []
        everything = await broker.receive(SYSTEM, "other", "orders", "c1", max_messages=100)
        assert len(everything) == 6
    run(tmp_path, scenario)


def test_long_poll_is_woken_by_a_send(tmp_path):
    async def scenario(broker: Broker) -> None:
        await topic(broker, queues=2)
        await broker.create_group(SYSTEM, GroupConfig("g"))
        waiting = asyncio.create_task(broker.receive(SYSTEM, "g", "orders", "c1", wait_ms=20_000))
        await asyncio.sleep(0)  # one turn: the receive finds nothing and parks on the topic
        assert not waiting.done()
        await send(broker, 1)
        got = await asyncio.wait_for(waiting, 10)  # the poll waits 20 s unless the send wakes it
        assert [d.body for d in got] == [b"m0"]
    run(tmp_path, scenario)


def test_a_long_poll_cancelled_as_it_is_woken_ends_cancelled(tmp_path):
    """A consumer stopping (its task cancelled) while a send wakes its long poll must stop,
    not go on polling with the cancellation lost."""
    async def scenario(core: Core) -> None:
        broker = core.broker
        await topic(broker, queues=1)
        await broker.create_group(SYSTEM, GroupConfig("g"))
        waiting = asyncio.create_task(broker.receive(SYSTEM, "g", "orders", "c1", wait_ms=60_000))
        await asyncio.sleep(0)  # one turn: the receive finds nothing and parks on the topic
        assert not waiting.done()
        core.engine.signals.notify("orders")  # woken ...
        waiting.cancel()  # ... and cancelled in the same turn
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(waiting, 10)
    run_core(tmp_path, scenario)


def test_queues_are_split_and_rebalanced_when_a_member_leaves_or_dies(tmp_path):
    async def scenario(broker: Broker) -> None:
        await topic(broker, queues=8)
        for client in ["a", "b", "c"]:
            await broker.heartbeat(SYSTEM, "g", client)
        owned = {c: broker.assignment(SYSTEM, "g", "orders", c) for c in "abc"}
        assert sorted(q for qs in owned.values() for q in qs) == list(range(8))
        assert all(len(qs) in (2, 3) for qs in owned.values())
        broker.leave("g", "c")
        owned = {c: broker.assignment(SYSTEM, "g", "orders", c) for c in "ab"}
        assert sorted(owned["a"] + owned["b"]) == list(range(8))
        deadline = time.monotonic() + 10  # "b" stops heartbeating; "a" keeps going
        while broker.assignment(SYSTEM, "g", "orders", "a") != list(range(8)):
            assert time.monotonic() < deadline, "dead member was never evicted"
            await broker.heartbeat(SYSTEM, "g", "a")
            await asyncio.sleep(0.05)
    run(tmp_path, scenario)


def test_a_member_pops_only_its_assigned_queue(tmp_path):
    async def scenario(broker: Broker) -> None:
        await topic(broker, queues=2)
        await send(broker, 4)
        for client in ["a", "b"]:
            await broker.heartbeat(SYSTEM, "g", client)
        mine = broker.assignment(SYSTEM, "g", "orders", "a")
        assert mine == [0]
        assert {d.queue_id for d in await broker.receive(SYSTEM, "g", "orders", "a", queue_id=0)} == {0}
        assert await broker.receive(SYSTEM, "g", "orders", "a", queue_id=1) == []
    run(tmp_path, scenario)


def test_broadcast_delivers_every_message_to_every_member(tmp_path):
    async def scenario(broker: Broker) -> None:
        await topic(broker, queues=2)
        await broker.create_group(SYSTEM, GroupConfig("b", consume_mode=ConsumeMode.BROADCAST))
        for client in ["x", "y"]:
            assert await broker.receive(SYSTEM, "b", "orders", client) == []
        await send(broker, 5)
        for client in ["x", "y"]:
            got = await broker.receive(SYSTEM, "b", "orders", client, max_messages=10)
            assert len(got) == 5
            for delivery in got:
                await broker.ack(SYSTEM, "b", "orders", delivery.receipt_handle)
        assert broker.assignment(SYSTEM, "b", "orders", "x") == [0, 1]
    run(tmp_path, scenario)


IN_LOG = CoreConfig(heartbeat_timeout_ms=300, offset_commit_interval_ms=50, replicated_state=True)
STATE_HOMES = pytest.mark.parametrize("config", [CONFIG, IN_LOG], ids=["side files", "replicated in the log"])


@STATE_HOMES
def test_pull_and_committed_offsets_survive_a_restart(tmp_path, config):
    async def first(broker: Broker) -> None:
        await topic(broker, queues=1)
        await send(broker, 10)
        result = await broker.pull(SYSTEM, "g", "orders", 0, 0, max_messages=4)
        assert [m.queue_offset for m in result.messages] == [0, 1, 2, 3] and result.next_offset == 4
        broker.commit_offset(SYSTEM, "g", "orders", 0, result.next_offset)

    async def second(broker: Broker) -> None:
        assert broker.committed_offset(SYSTEM, "g", "orders", 0) == 4
        result = await broker.pull(SYSTEM, "g", "orders", 0, 4, max_messages=100)
        assert [m.body for m in result.messages] == [f"m{i}".encode() for i in range(4, 10)]
    run(tmp_path, first, store="file", config=config)
    run(tmp_path, second, store="file", config=config)
    assert (tmp_path / "offsets.json").exists() is (config is CONFIG), "offsets in the log need no side file"


@STATE_HOMES
def test_acked_pops_are_not_redelivered_after_a_restart(tmp_path, config):
    handles = []

    async def first(broker: Broker) -> None:
        await topic(broker, queues=1)
        await send(broker, 6)
        got = await broker.receive(SYSTEM, "g", "orders", "c1", max_messages=6, invisible_ms=100)
        for delivery in got:
            if delivery.queue_offset % 2 == 0:
                await broker.ack(SYSTEM, "g", "orders", delivery.receipt_handle)
        handles.extend(d.receipt_handle for d in got)

    async def second(broker: Broker) -> None:
        got = await broker.receive(SYSTEM, "g", "orders", "c1", max_messages=10)
        assert sorted(d.queue_offset for d in got) == [1, 3, 5]
        assert {d.attempt for d in got} == {2}
        with pytest.raises(ReceiptExpired):
            await broker.ack(SYSTEM, "g", "orders", handles[1])
    run(tmp_path, first, store="file", config=config)
    run(tmp_path, second, store="file", config=config)


def test_reset_offsets_by_time_rewinds_the_group(tmp_path):
    async def scenario(broker: Broker) -> None:
        await topic(broker, queues=1)
        await send(broker, 3)
        got = await broker.receive(SYSTEM, "g", "orders", "c1", max_messages=10)
        for delivery in got:
            await broker.ack(SYSTEM, "g", "orders", delivery.receipt_handle)
        assert await broker.reset_offsets(SYSTEM, "g", "orders", 0) == {0: 0}
        assert len(await broker.receive(SYSTEM, "g", "orders", "c1", max_messages=10)) == 3
    run(tmp_path, scenario)


def test_bad_sends_are_refused_and_store_nothing(tmp_path):
    async def scenario(broker: Broker) -> None:
        await topic(broker, queues=1)
        with pytest.raises(TopicNotFound):
            await broker.send(SYSTEM, [OutgoingMessage("nope", b"x")])
        with pytest.raises(MessageTooLarge):
            await broker.send(SYSTEM, [OutgoingMessage("orders", b"ok"),
                                       OutgoingMessage("orders", b"x" * (CONFIG.max_message_bytes + 1))])
        assert broker.describe_topic("orders").queues[0].max_offset == 0
    run(tmp_path, scenario)


def test_permissions_are_checked_on_domain_names(tmp_path):
    async def scenario(broker: Broker) -> None:
        await topic(broker, queues=1)
        await topic(broker, "audit", queues=1)
        broker.users.create_user("app", "secret")
        broker.users.grant(Permission("app", ResourceKind.TOPIC, "ord*", frozenset({Action.PUBLISH})))
        app = await broker.authenticate("app", "secret")
        await broker.send(app, [OutgoingMessage("orders", b"x")])
        with pytest.raises(AccessDenied):
            await broker.send(app, [OutgoingMessage("audit", b"x")])
        with pytest.raises(AccessDenied):
            await broker.receive(app, "g", "orders", "c1")
    run(tmp_path, scenario)


def test_a_topic_retention_limit_hides_older_messages_from_consumers(tmp_path):
    async def scenario(core: Core) -> None:
        broker = core.broker
        await broker.create_topic(SYSTEM, TopicConfig("short", queue_count=1, retention_ms=60_000))
        await topic(broker, "long", queues=1)
        await send(broker, 3, "short")
        await send(broker, 3, "long")
        stored = broker.describe_topic("short").queues[0]
        assert (stored.min_offset, stored.max_offset) == (0, 3)
        await core.apply_retention(now_ms=int(time.time() * 1000) + 120_000)
        assert broker.describe_topic("short").queues[0].min_offset == 3
        assert (await broker.pull(SYSTEM, "g", "short", 0, 0)).messages == []
        assert await broker.receive(SYSTEM, "g", "short", "c1") == []
        assert len((await broker.pull(SYSTEM, "g", "long", 0, 0)).messages) == 3
    run_core(tmp_path, scenario)


def test_in_flight_bookkeeping_stays_proportional_to_what_is_unacked():
    from core.cursors import Cursor
    cursor = Cursor(committed=0, next=0)
    for offset in range(50_000):
        cursor.deliver(offset, now_ms=0, invisible_ms=12 * 3_600_000)
        cursor.ack(offset)
    assert cursor.committed == 50_000 and not cursor.inflight
    assert len(cursor.expiries) <= 2_000


def test_not_found_errors_name_the_resource_in_one_sentence(tmp_path):
    """Every raise site hands TopicNotFound/GroupNotFound a name, which they put in a sentence;
    a sentence handed in would read as one sentence wrapped in another."""
    async def scenario(broker: Broker) -> None:
        errors = []
        for attempt in (broker.send(SYSTEM, [OutgoingMessage("nope", b"x")]),
                        broker.send(SYSTEM, [OutgoingMessage("nope", b"x")], create_topics=True),
                        broker.receive(SYSTEM, "ghost", "nope", "c1"),
                        broker.pull(SYSTEM, "g", "nope", 0, 0),
                        broker.delete_topic(SYSTEM, "nope")):
            with pytest.raises(TopicNotFound) as missing:
                await attempt
            errors.append(str(missing.value))
        with pytest.raises(GroupNotFound) as missing_group:
            await broker.delete_group(SYSTEM, "ghost")
        errors.append(str(missing_group.value))
        await topic(broker, queues=1)
        with pytest.raises(GroupNotFound) as missing_group:
            await broker.receive(SYSTEM, "ghost", "orders", "c1")
        errors.append(str(missing_group.value))
        assert set(errors[:5]) == {"topic 'nope' does not exist; create it first "
                                   "(`sluice topic create nope`) or check the name"}
        assert set(errors[5:]) == {"consumer group 'ghost' does not exist; create it (`sluice "
                                   "group create ghost`) or let a consumer's heartbeat create it"}
    run(tmp_path, scenario, config=CoreConfig(auto_create_topics=False, auto_create_groups=False))


def test_sends_are_appended_in_the_order_made_while_a_topic_is_being_created(tmp_path):
    """A send that finds its topic exists does not overtake an earlier one still creating its
    topic: an AMQP connection overlapping its publishes with their fsyncs relies on this, as
    both can land in one queue."""
    async def scenario(core: Core) -> None:
        broker = core.broker
        await topic(broker, "existing", queues=1)
        first = asyncio.create_task(broker.send_decided(
            [OutgoingMessage("created-now", b"m1", also_into=("%SYS%q",))]))
        await asyncio.sleep(0)  # the first send is waiting for its topic's metadata write
        second = asyncio.create_task(broker.send_decided(
            [OutgoingMessage("existing", b"m2", also_into=("%SYS%q",))]))
        await asyncio.gather(first, second)
        messages, _ = core.queues.read("%SYS%q", 0, 10)
        assert [m.body for m in messages] == [b"m1", b"m2"]
    run_core(tmp_path, scenario)


def test_a_fifo_group_gets_a_queues_next_messages_only_once_the_previous_ones_are_settled(tmp_path):
    async def scenario(broker: Broker) -> None:
        await topic(broker, queues=2)
        await broker.create_group(SYSTEM, GroupConfig("ordered", fifo=True))
        await broker.send(SYSTEM, [OutgoingMessage("orders", b"a%d" % i, message_group="a")
                                   for i in range(5)])
        first = await broker.receive(SYSTEM, "ordered", "orders", "c1", max_messages=2)
        assert [d.body for d in first] == [b"a0", b"a1"]
        assert await broker.receive(SYSTEM, "ordered", "orders", "c2") == []  # a1 still in flight
        await broker.ack(SYSTEM, "ordered", "orders", first[0].receipt_handle)
        assert await broker.receive(SYSTEM, "ordered", "orders", "c2") == []
        waiting = asyncio.create_task(broker.receive(SYSTEM, "ordered", "orders", "c2",
                                                     max_messages=2, wait_ms=10_000))
        await asyncio.sleep(0)  # parked: the queue is blocked
        await broker.ack(SYSTEM, "ordered", "orders", first[1].receipt_handle)
        second = await asyncio.wait_for(waiting, 5)  # the ack woke it, long before 10 s
        assert [d.body for d in second] == [b"a2", b"a3"]
        retry = await broker.change_invisible(SYSTEM, "ordered", "orders", second[0].receipt_handle, 0)
        await broker.ack(SYSTEM, "ordered", "orders", second[1].receipt_handle)
        again = await broker.receive(SYSTEM, "ordered", "orders", "c1", max_messages=8)
        assert [(d.body, d.attempt) for d in again] == [(b"a2", 2)]  # the retry before a4
        assert retry != again[0].receipt_handle
        plain = await broker.receive(SYSTEM, "plain", "orders", "c1", max_messages=8)
        assert len(plain) == 5  # a group without fifo is not held back
    run(tmp_path, scenario)
