"""The rules behind messages leaving AMQP queues: argument checks worded as RabbitMQ words
them, the parsed policy, x-death bookkeeping, cycles, expirations; and core's peek/take of a
named queue's head."""
from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest
from pamqp.commands import Basic, Confirm, Queue

from core.errors import PreconditionFailed
from core.model import OutgoingMessage
from protocols.amqp.dead_letters import is_cycle, record_death
from protocols.amqp.queue_arguments import (DEFAULT_DELIVERY_LIMIT, QueuePolicy, check,
                                           check_equivalent, policy)
from protocols.amqp.queue_limits import expires_at, parse_expiration
from tests.unit.amqp.fake_wire import Client, run
from tests.unit.amqp.test_messages import publish
from tests.unit.amqp.test_topic_bindings import send_subject

NOW = datetime(2026, 1, 2, 3, 4, 5, 678_000, tzinfo=UTC)


def refused(arguments: dict, **flags: bool) -> str:
    options = {"durable": True, "exclusive": False, "auto_delete": False} | flags
    with pytest.raises(PreconditionFailed) as error:
        check(arguments, "q", "/", **options)
    return str(error.value)


def test_argument_types_and_values_are_checked_as_rabbitmq_checks_them():
    assert refused({"x-message-ttl": 1.5}) == \
        "invalid arg 'x-message-ttl' for queue 'q' in vhost '/': {unacceptable_type,double}"
    assert refused({"x-expires": 0}).endswith(": {value_zero,0}")
    assert refused({"x-expires": 1 << 33}).endswith(f": {{value_too_large,{1 << 33}}}")
    assert refused({"x-max-length-bytes": True}).endswith(": {unacceptable_type,bool}")
    assert refused({"x-dead-letter-exchange": 5}).endswith(": {unacceptable_type,long}")
    assert refused({"x-overflow": b"drop-tail"}).endswith(": invalid_overflow")
    assert refused({"x-queue-type": "quorum"}, auto_delete=True) == \
        "invalid property 'auto-delete' for queue 'q' in vhost '/'"
    assert refused({"x-queue-type": "quorum", "x-overflow": "reject-publish-dlx"}) == \
        "invalid arg 'x-overflow' with value 'reject-publish-dlx' for queue 'q' in vhost '/'"
    check({"x-message-ttl": 0, "x-max-length": 0, "x-overflow": "reject-publish-dlx",
           "x-dead-letter-exchange": "", "x-dead-letter-routing-key": b"k",
           "x-queue-type": "classic", "unknown": object()}, "q", "/",
          durable=False, exclusive=True, auto_delete=True)


def test_the_policy_of_stored_arguments():
    assert policy({}) is None and policy({"x-queue-type": "classic", "other": 1}) is None
    assert policy({"x-message-ttl": 5, "x-dead-letter-exchange": "dlx"}) == QueuePolicy(
        message_ttl=5, dead_letter_exchange="dlx")
    assert policy({"x-queue-type": "quorum"}).delivery_limit == DEFAULT_DELIVERY_LIMIT
    assert policy({"x-queue-type": "quorum", "x-delivery-limit": -1}).delivery_limit is None
    assert policy({"x-delivery-limit": 3}) is None, "a classic queue has no delivery limit"
    assert policy({"x-queue-type": "stream", "x-max-length-bytes": 10}) is None


def test_a_first_death_writes_x_death_and_moves_expiration_into_it():
    properties = Basic.Properties(headers={"a": 1}, expiration="500", message_id="m")
    dead = record_death(properties, "q", "expired", "ex", ["k"], NOW)
    assert dead.expiration is None and dead.message_id == "m"
    assert dead.headers["x-death"] == [{
        "count": 1, "reason": "expired", "queue": "q", "time": NOW.replace(microsecond=0),
        "exchange": "ex", "routing-keys": ["k"], "original-expiration": "500"}]
    assert (dead.headers["x-first-death-queue"], dead.headers["x-last-death-reason"]) == \
        ("q", "expired")


def test_deaths_merge_per_queue_and_reason_newest_first():
    first = record_death(Basic.Properties(), "q", "rejected", "", ["q"], NOW)
    second = record_death(first, "r", "expired", "dlx", ["q"], NOW)
    third = record_death(second, "q", "rejected", "", ["q"], NOW)
    assert [(d["queue"], d["reason"], d["count"]) for d in third.headers["x-death"]] == \
        [("q", "rejected", 2), ("r", "expired", 1)]
    assert third.headers["x-first-death-queue"] == "q"
    assert (third.headers["x-last-death-queue"], third.headers["x-last-death-reason"]) == \
        ("q", "rejected")


def test_a_cycle_without_a_rejection_is_detected():
    expired = record_death(Basic.Properties(), "q", "expired", "", ["q"], NOW).headers
    assert is_cycle(expired, "q") and not is_cycle(expired, "other")
    rejected = record_death(Basic.Properties(headers=expired), "r", "rejected", "", ["q"],
                            NOW).headers
    assert not is_cycle(rejected, "q")


def test_expirations_parse_as_rabbitmq_parses_them_and_the_smaller_ttl_wins():
    assert parse_expiration(None) is None and parse_expiration("0") == 0
    with pytest.raises(PreconditionFailed, match="invalid expiration '1.5': "
                                                 "{leftover_string,\".5\"}"):
        parse_expiration("1.5")
    ttl = QueuePolicy(message_ttl=1000)
    assert expires_at(ttl, {}, 10) == 1010
    assert expires_at(ttl, {"amqp.expiration": "20"}, 10) == 30
    assert expires_at(QueuePolicy(), {"amqp.expiration": "bad"}, 10) is None
    assert expires_at(QueuePolicy(), {}, 10) is None


def test_peek_shows_the_head_without_taking_it_and_take_hides_it(tmp_path):
    async def scenario(frontend, core):
        queues = core.queues
        await core.broker.send_decided([OutgoingMessage("t", b"%d" % n, also_into=("nq",))
                                        for n in range(3)])
        assert [m.body for m in queues.peek("nq", 5)] == [b"0", b"1", b"2"]
        assert queues.ready("nq") == 3
        queues.take("nq", 0, 60_000)
        assert [m.body for m in queues.peek("nq", 5)] == [b"1", b"2"]
        [popped] = queues.pop("nq", 1, 60_000)
        assert popped.body == b"1" and [m.body for m in queues.peek("nq", 5)] == [b"2"]
        queues.settle("nq", 0)
        assert queues.ready("nq") == 1
    run(tmp_path, scenario)


async def declare(client, queue: str, **arguments) -> None:
    assert isinstance(await client.call(1, Queue.Declare(queue=queue, arguments=arguments)),
                      Queue.DeclareOk)


async def confirmed(client, body: bytes, key: str) -> type:
    """Publish with confirms on channel 1: Basic.Ack or Basic.Nack."""
    publish(client, body, key=key)
    return type((await client.next())[1])


def test_drop_head_settles_the_oldest_into_the_dead_letter_queue(tmp_path):
    async def scenario(frontend, core):
        client = Client(frontend)
        await client.open()
        await declare(client, "dead")
        await declare(client, "capped", **{"x-max-length": 1, "x-dead-letter-exchange": "",
                                           "x-dead-letter-routing-key": "dead"})
        await client.call(1, Confirm.Select())
        assert await confirmed(client, b"old", "capped") is Basic.Ack
        assert await confirmed(client, b"new", "capped") is Basic.Ack
        await frontend.settled()
        host = core.vhosts.get("/")
        assert [m.body for m in core.queues.peek(host.named("capped"), 5)] == [b"new"]
        [dead] = core.queues.peek(host.named("dead"), 5)
        assert dead.body == b"old" and '"reason":"maxlen"' in dead.properties["amqp.headers"]
    run(tmp_path, scenario)


def test_reject_publish_nacks_only_what_does_not_fit(tmp_path):
    async def scenario(frontend, core):
        client = Client(frontend)
        await client.open()
        await declare(client, "one", **{"x-max-length": 1, "x-overflow": "reject-publish"})
        await client.call(1, Confirm.Select())
        assert await confirmed(client, b"a", "one") is Basic.Ack
        assert await confirmed(client, b"b", "one") is Basic.Nack
        assert core.queues.ready(core.vhosts.get("/").named("one")) == 1
    run(tmp_path, scenario)


def test_a_quorum_message_past_its_limit_leaves_when_it_is_returned(tmp_path):
    async def scenario(frontend, core):
        client = Client(frontend)
        await client.open()
        assert isinstance(await client.call(1, Queue.Declare(
            queue="qq", durable=True, arguments={"x-queue-type": "quorum",
                                                 "x-delivery-limit": 0})), Queue.DeclareOk)
        await client.call(1, Confirm.Select())
        assert await confirmed(client, b"x", "qq") is Basic.Ack
        get = await client.call(1, Basic.Get(queue="qq"))
        await client.next()
        await client.next()
        named = core.vhosts.get("/").named("qq")
        assert core.queues.attempts(named, 0) == 1
        client.send_method(1, Basic.Nack(get.delivery_tag, requeue=True))
        await client.call(1, Basic.Qos(prefetch_count=1))  # the nack was carried out
        assert core.queues.ready(named) == 0 and core.queues.attempts(named, 0) == 0
        assert isinstance(await client.call(1, Basic.Get(queue="qq")), Basic.GetEmpty)
    run(tmp_path, scenario)


def test_ready_bytes_follow_deliveries_without_reading_the_queue(tmp_path):
    async def scenario(frontend, core):
        client = Client(frontend)
        await client.open()
        await declare(client, "b", **{"x-max-length-bytes": 10,
                                      "x-overflow": "reject-publish"})
        await client.call(1, Confirm.Select())
        assert await confirmed(client, b"12345", "b") is Basic.Ack
        assert await confirmed(client, b"67890", "b") is Basic.Ack
        assert await confirmed(client, b"x", "b") is Basic.Nack
        get = await client.call(1, Basic.Get(queue="b"))
        await client.next()
        await client.next()
        assert await confirmed(client, b"abcde", "b") is Basic.Ack, "the delivery made room"
        client.send_method(1, Basic.Reject(get.delivery_tag, requeue=True))
        assert await confirmed(client, b"", "b") is Basic.Nack, "the requeue took it back"
        assert isinstance(await client.call(1, Queue.Purge(queue="b")), Queue.PurgeOk)
        assert await confirmed(client, b"0123456789", "b") is Basic.Ack
    run(tmp_path, scenario)


def test_redeclarations_compare_the_limits_as_rabbitmq_words_it():
    check_equivalent({"x-message-ttl": 5, "x-other": 1}, {"x-message-ttl": 5}, "q", "/")
    with pytest.raises(PreconditionFailed) as error:
        check_equivalent({"x-overflow": "drop-head"}, {"x-overflow": "reject-publish"}, "q",
                         "/")
    assert str(error.value) == ("inequivalent arg 'x-overflow' for queue 'q' in vhost '/': "
                                "received 'reject-publish' but current is 'drop-head'")
    with pytest.raises(PreconditionFailed, match="received the value '5000000000' of type "
                                                 "'long' but current is none"):
        check_equivalent({}, {"x-max-length-bytes": 5_000_000_000}, "q", "/")


def test_messages_from_other_protocols_meet_drop_head_and_ttl(tmp_path):
    async def scenario(frontend, core):
        client = Client(frontend)
        await client.open()
        await declare(client, "dead")
        await declare(client, "capped", **{"x-max-length": 1})
        await declare(client, "short", **{"x-message-ttl": 20, "x-dead-letter-exchange": "",
                                          "x-dead-letter-routing-key": "dead"})
        for queue in ("capped", "short"):
            await client.call(1, Queue.Bind(queue=queue, exchange="amq.topic",
                                            routing_key="devices.*.telemetry"))
        host = core.vhosts.get("/")
        for n in range(3):
            await send_subject(core, f"devices/d{n}/telemetry", b"%d" % n)
        await asyncio.sleep(0)  # one turn: the growth callbacks run
        assert [m.body for m in core.queues.peek(host.named("capped"), 5)] == [b"2"]

        async def three_dead() -> None:
            while core.queues.ready(host.named("dead")) < 3:
                await core.queues.signal(host.named("dead"))
        await asyncio.wait_for(three_dead(), 5)
        assert sorted(m.body for m in core.queues.peek(host.named("dead"), 5)) == \
            [b"0", b"1", b"2"]
        assert core.queues.ready(host.named("short")) == 0
        waiting = core.engine.signals._waiters
        assert host.named("capped") in waiting
        named = host.named("capped")
        await client.call(1, Queue.Delete(queue="capped"))
        assert named not in waiting, "a deleted queue keeps nothing waiting"
    run(tmp_path, scenario)


def test_messages_withheld_by_an_access_rule_leave_a_capped_queues_ready_bytes(tmp_path):
    """A message an access rule withholds from a queue's reader is dropped from the queue:
    its bytes no longer count against x-max-length-bytes."""
    from core.model import AclRule, Action
    from tests.unit.amqp.fake_wire import USER

    async def scenario(frontend, core):
        admin = Client(frontend)
        await admin.open()
        await declare(admin, "b", **{"x-max-length-bytes": 10, "x-overflow": "reject-publish"})
        await admin.call(1, Queue.Bind(queue="b", exchange="amq.topic", routing_key="d.#"))
        for subject, body in (("d/secret/1", b"12345"), ("d/open/1", b"ab"), ("d/open/2", b"cd")):
            await send_subject(core, subject, body)
        await admin.call(1, Confirm.Select())
        assert await confirmed(admin, b"xy", "b") is Basic.Nack, "9 bytes ready: full"
        core.broker.users.put_rule(AclRule(USER, "d/secret/#", frozenset({Action.SUBSCRIBE}),
                                           allow=False))
        await core.vhost_admin.permit(USER, "/", "", "", ".*")
        reader = Client(frontend)
        await reader.open(USER)
        assert isinstance(await reader.call(1, Basic.Get(queue="b")), Basic.GetOk)
        await reader.next()
        assert (await reader.next())[1].value == b"ab", "the denied head was passed over"
        assert core.queues.ready(core.vhosts.get("/").named("b")) == 1
        assert await confirmed(admin, b"12345678", "b") is Basic.Ack, "2 bytes ready, 8 fit"
    run(tmp_path, scenario)
