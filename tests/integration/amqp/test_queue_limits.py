"""Messages leaving AMQP queues against a real `sluice serve` with pika: dead-lettering with
RabbitMQ's x-death header, queue and message TTL, length limits with each overflow, x-expires,
quorum queues' delivery limit, argument validation, and a queue declared again starting
empty."""
from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from datetime import datetime

import pika
import pika.exceptions as errors
import pytest
from pika.adapters.blocking_connection import BlockingChannel

from tests.integration.amqp.conftest import connect

WAIT_S = 10


def name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def channel(amqp_server) -> Iterator[BlockingChannel]:
    connection = connect(amqp_server)
    channel = connection.channel()
    channel.confirm_delivery()
    yield channel
    if connection.is_open:
        connection.close()


def dead_letter_queue(channel: BlockingChannel) -> tuple[str, str]:
    """A fanout dead-letter exchange and the queue bound to it: (exchange, queue)."""
    exchange, queue = name("dlx"), name("dead")
    channel.exchange_declare(exchange, "fanout")
    channel.queue_declare(queue)
    channel.queue_bind(queue, exchange)
    return exchange, queue


def next_message(channel: BlockingChannel, queue: str):
    """The next message consumed from ``queue`` (acked), waiting up to WAIT_S."""
    for method, properties, body in channel.consume(queue, inactivity_timeout=WAIT_S):
        assert method is not None, f"nothing reached {queue} within {WAIT_S} s"
        channel.basic_ack(method.delivery_tag)
        channel.cancel()
        return method, properties, body
    raise AssertionError("unreachable")


def test_a_rejected_message_is_dead_lettered_with_rabbitmq_s_x_death(channel):
    dlx, dead = dead_letter_queue(channel)
    source = name("work")
    channel.queue_declare(source, arguments={"x-dead-letter-exchange": dlx})
    channel.basic_publish("", source, b"bad order",
                          pika.BasicProperties(headers={"tenant": "acme"}, message_id="m-1"))
    method, _, _ = channel.basic_get(source)
    channel.basic_reject(method.delivery_tag, requeue=False)
    method, properties, body = next_message(channel, dead)
    assert body == b"bad order" and properties.message_id == "m-1"
    assert method.exchange == dlx and method.routing_key == source
    headers = properties.headers
    assert headers["tenant"] == "acme"
    [death] = headers["x-death"]
    assert set(death) == {"count", "reason", "queue", "time", "exchange", "routing-keys"}
    assert (death["count"], death["reason"], death["queue"], death["exchange"],
            death["routing-keys"]) == (1, "rejected", source, "", [source])
    assert isinstance(death["time"], datetime)
    assert (headers["x-first-death-reason"], headers["x-first-death-queue"],
            headers["x-first-death-exchange"]) == ("rejected", source, "")
    assert (headers["x-last-death-reason"], headers["x-last-death-queue"]) == \
        ("rejected", source)
    assert channel.basic_get(source) == (None, None, None)


def test_nack_without_requeue_dead_letters_with_the_dead_letter_routing_key(channel):
    source, target = name("jobs"), name("parked")
    channel.queue_declare(target)
    channel.queue_declare(source, arguments={"x-dead-letter-exchange": "",
                                             "x-dead-letter-routing-key": target})
    channel.basic_publish("", source, b"job")
    method, _, _ = channel.basic_get(source)
    channel.basic_nack(method.delivery_tag, requeue=False)
    method, properties, body = next_message(channel, target)
    assert body == b"job" and method.routing_key == target
    assert properties.headers["x-death"][0]["routing-keys"] == [source]


def test_x_death_counts_merge_per_queue_and_reason(channel):
    """A message rejected twice from the same queue has one x-death entry counting 2."""
    source = name("retry")
    channel.queue_declare(source, arguments={"x-dead-letter-exchange": "",
                                             "x-dead-letter-routing-key": source})
    channel.basic_publish("", source, b"again")
    for count in (1, 2):
        method, properties, _ = channel.basic_get(source)
        if count == 2:
            [death] = properties.headers["x-death"]
            assert (death["count"], death["reason"]) == (1, "rejected")
        channel.basic_reject(method.delivery_tag, requeue=False)
        if count == 1:
            method, properties, _ = next_message(channel, source)
            channel.basic_publish("", source, b"again", properties)  # back, with its history
    method, properties, _ = next_message(channel, source)
    deaths = properties.headers["x-death"]
    assert [(d["queue"], d["reason"], d["count"]) for d in deaths] == [(source, "rejected", 2)]


def test_a_message_past_the_queue_ttl_is_dead_lettered_as_expired(channel):
    dlx, dead = dead_letter_queue(channel)
    source = name("ttl")
    channel.queue_declare(source, arguments={"x-message-ttl": 50,
                                             "x-dead-letter-exchange": dlx})
    channel.basic_publish("", source, b"stale")
    _, properties, body = next_message(channel, dead)
    assert body == b"stale"
    death = properties.headers["x-death"][0]
    assert (death["reason"], death["queue"]) == ("expired", source)
    assert channel.basic_get(source) == (None, None, None)
    assert channel.queue_declare(source, passive=True).method.message_count == 0


def test_a_message_expiration_moves_into_x_death_and_expired_messages_are_never_delivered(
        channel):
    dlx, dead = dead_letter_queue(channel)
    source = name("expiring")
    channel.queue_declare(source, arguments={"x-dead-letter-exchange": dlx})
    channel.basic_publish("", source, b"gone", pika.BasicProperties(expiration="0"))
    channel.basic_publish("", source, b"kept", pika.BasicProperties(expiration="60000"))
    _, _, body = channel.basic_get(source, auto_ack=True)
    assert body == b"kept", "the expired message is skipped, never delivered"
    _, properties, body = next_message(channel, dead)
    assert body == b"gone" and properties.expiration is None
    death = properties.headers["x-death"][0]
    assert (death["reason"], death["original-expiration"]) == ("expired", "0")


def test_a_requeued_message_past_its_ttl_is_dead_lettered_not_redelivered(channel):
    dlx, dead = dead_letter_queue(channel)
    source = name("slow")
    channel.queue_declare(source, arguments={"x-message-ttl": 200,
                                             "x-dead-letter-exchange": dlx})
    channel.basic_publish("", source, b"held")
    channel.basic_publish("", source, b"waiting")
    held, _, _ = channel.basic_get(source)
    assert next_message(channel, dead)[2] == b"waiting"  # so "held", older, is past its TTL
    channel.basic_nack(held.delivery_tag, requeue=True)
    _, properties, body = next_message(channel, dead)
    assert body == b"held" and properties.headers["x-death"][0]["reason"] == "expired"
    assert channel.queue_declare(source, passive=True).method.message_count == 0
    assert channel.basic_get(source) == (None, None, None)


def test_an_expired_message_without_a_dead_letter_exchange_is_dropped(channel):
    queue = name("plain")
    channel.queue_declare(queue, arguments={"x-message-ttl": 0})
    channel.basic_publish("", queue, b"x")
    assert channel.basic_get(queue) == (None, None, None)


@pytest.mark.parametrize("expiration, error", [
    ("abc", "invalid expiration 'abc': no_integer"),
    ("-5", "invalid expiration '-5': {value_negative,-5}"),
    ("10s", "invalid expiration '10s': {leftover_string,\"s\"}")])
def test_a_malformed_expiration_closes_the_channel_with_406(amqp_server, expiration, error):
    connection = connect(amqp_server)
    channel = connection.channel()
    channel.basic_publish("", "anything", b"x", pika.BasicProperties(expiration=expiration))
    with pytest.raises(errors.ChannelClosedByBroker) as closed:
        channel.queue_declare("", exclusive=True)
    assert closed.value.reply_code == 406
    assert closed.value.reply_text == f"PRECONDITION_FAILED - {error}"
    connection.close()


def test_max_length_drops_the_oldest_and_dead_letters_it_as_maxlen(channel):
    dlx, dead = dead_letter_queue(channel)
    source = name("capped")
    channel.queue_declare(source, arguments={"x-max-length": 2,
                                             "x-dead-letter-exchange": dlx})
    for n in range(3):
        channel.basic_publish("", source, b"m%d" % n)
    _, properties, body = next_message(channel, dead)
    assert body == b"m0" and properties.headers["x-death"][0]["reason"] == "maxlen"
    assert channel.queue_declare(source, passive=True).method.message_count == 2
    assert [channel.basic_get(source, auto_ack=True)[2] for _ in range(2)] == [b"m1", b"m2"]


def test_max_length_bytes_drops_heads_until_the_bodies_fit(channel):
    source = name("bytes")
    channel.queue_declare(source, arguments={"x-max-length-bytes": 10})
    for body in (b"aaaaa", b"bbbbb", b"ccccc"):
        channel.basic_publish("", source, body)
    assert [channel.basic_get(source, auto_ack=True)[2] for _ in range(3)] == \
        [b"bbbbb", b"ccccc", None]


def test_reject_publish_nacks_what_does_not_fit(channel):
    source = name("full")
    channel.queue_declare(source, arguments={"x-max-length": 1,
                                             "x-overflow": "reject-publish"})
    channel.basic_publish("", source, b"first")
    with pytest.raises(errors.NackError):
        channel.basic_publish("", source, b"second")
    assert channel.queue_declare(source, passive=True).method.message_count == 1
    channel.basic_get(source, auto_ack=True)
    channel.basic_publish("", source, b"third")  # room again: confirmed
    assert channel.basic_get(source, auto_ack=True)[2] == b"third"


def test_reject_publish_dlx_nacks_and_dead_letters_what_does_not_fit(channel):
    dlx, dead = dead_letter_queue(channel)
    source = name("full-dlx")
    channel.queue_declare(source, arguments={"x-max-length": 1,
                                             "x-overflow": "reject-publish-dlx",
                                             "x-dead-letter-exchange": dlx})
    channel.basic_publish("", source, b"first")
    with pytest.raises(errors.NackError):
        channel.basic_publish("", source, b"second")
    _, properties, body = next_message(channel, dead)
    assert body == b"second" and properties.headers["x-death"][0]["reason"] == "maxlen"
    assert channel.basic_get(source, auto_ack=True)[2] == b"first"


def test_an_unused_queue_is_deleted_after_x_expires(amqp_server, channel):
    queue = name("idle")
    channel.queue_declare(queue, arguments={"x-expires": 300})
    channel.basic_publish("", queue, b"left behind")
    deadline = time.monotonic() + WAIT_S
    while True:  # nothing announces the deletion: look until it is gone
        probe = connect(amqp_server)
        try:
            probe.channel().queue_declare(queue, passive=True)
        except errors.ChannelClosedByBroker as closed:
            assert closed.reply_code == 404
            break
        finally:
            if probe.is_open:
                probe.close()
        assert time.monotonic() < deadline, "x-expires did not delete the queue"
        channel.connection.process_data_events(time_limit=0.05)


def test_a_consumer_keeps_an_x_expires_queue(amqp_server, channel):
    queue = name("busy")
    channel.queue_declare(queue, arguments={"x-expires": 100})
    channel.basic_consume(queue, lambda *_: None)
    channel.connection.process_data_events(time_limit=0.5)
    assert channel.queue_declare(queue, passive=True).method.consumer_count == 1


def test_a_quorum_queue_counts_deliveries_and_dead_letters_past_its_limit(channel):
    dlx, dead = dead_letter_queue(channel)
    source = name("qq")
    channel.queue_declare(source, durable=True, arguments={
        "x-queue-type": "quorum", "x-delivery-limit": 1, "x-dead-letter-exchange": dlx})
    channel.basic_publish("", source, b"flaky")
    method, properties, _ = channel.basic_get(source)
    assert not method.redelivered and "x-delivery-count" not in (properties.headers or {})
    channel.basic_nack(method.delivery_tag, requeue=True)
    method, properties, _ = channel.basic_get(source)
    assert method.redelivered and properties.headers["x-delivery-count"] == 1
    channel.basic_nack(method.delivery_tag, requeue=True)
    _, properties, body = next_message(channel, dead)
    assert body == b"flaky"
    assert properties.headers["x-death"][0]["reason"] == "delivery_limit"
    assert channel.queue_declare(source, passive=True).method.message_count == 0
    assert channel.basic_get(source) == (None, None, None)
    channel.queue_delete(source)


@pytest.mark.parametrize("arguments, options, error", [
    ({"x-message-ttl": "soon"}, {}, "invalid arg 'x-message-ttl' for queue '{q}' in vhost '/': "
                                    "{unacceptable_type,longstr}"),
    ({"x-message-ttl": -1}, {}, "invalid arg 'x-message-ttl' for queue '{q}' in vhost '/': "
                                "{value_negative,-1}"),
    ({"x-expires": 0}, {}, "invalid arg 'x-expires' for queue '{q}' in vhost '/': "
                           "{value_zero,0}"),
    ({"x-max-length": -2}, {}, "invalid arg 'x-max-length' for queue '{q}' in vhost '/': "
                               "{value_negative,-2}"),
    ({"x-overflow": "drop-tail"}, {}, "invalid arg 'x-overflow' for queue '{q}' in vhost "
                                      "'/': invalid_overflow"),
    ({"x-dead-letter-routing-key": "k"}, {}, "invalid arg 'x-dead-letter-routing-key' for "
                                             "queue '{q}' in vhost '/': "
                                             "routing_key_but_no_dlx_defined"),
    ({"x-queue-type": "quorum"}, {"exclusive": True},
     "invalid property 'exclusive-owner' for queue '{q}' in vhost '/'"),
    ({"x-queue-type": "quorum"}, {"durable": False},
     "invalid property 'non-durable' for queue '{q}' in vhost '/'"),
])
def test_bad_arguments_are_refused_with_rabbitmq_s_406(amqp_server, arguments, options, error):
    connection = connect(amqp_server)
    channel = connection.channel()
    queue = name("bad")
    with pytest.raises(errors.ChannelClosedByBroker) as closed:
        channel.queue_declare(queue, arguments=arguments, **options)
    assert closed.value.reply_code == 406
    assert closed.value.reply_text == "PRECONDITION_FAILED - " + error.replace("{q}", queue)
    connection.close()


def test_a_queue_declared_again_after_a_delete_starts_empty(channel):
    queue = name("reborn")
    channel.queue_declare(queue, durable=True)
    channel.basic_publish("", queue, b"old")
    channel.queue_delete(queue)
    assert channel.queue_declare(queue, durable=True).method.message_count == 0
    assert channel.basic_get(queue) == (None, None, None)
    channel.basic_publish("", queue, b"new")
    assert channel.basic_get(queue, auto_ack=True)[2] == b"new"
    channel.queue_delete(queue)


def test_dead_letters_to_amq_topic_reach_bound_queues_once(channel):
    bound, source = name("cmds"), name("orders")
    channel.queue_declare(bound)
    channel.queue_bind(bound, "amq.topic", "devices.*.cmd")
    channel.queue_declare(source, arguments={"x-dead-letter-exchange": "amq.topic",
                                             "x-dead-letter-routing-key": "devices.d1.cmd"})
    channel.basic_publish("", source, b"reboot")
    method, _, _ = channel.basic_get(source)
    channel.basic_reject(method.delivery_tag, requeue=False)
    method, properties, body = next_message(channel, bound)
    assert (body, method.exchange, method.routing_key) == (b"reboot", "amq.topic",
                                                           "devices.d1.cmd")
    assert channel.basic_get(bound) == (None, None, None), "delivered once"


@pytest.mark.parametrize("first, again, error", [
    ({"x-message-ttl": 1000}, {"x-message-ttl": 2000},
     "inequivalent arg 'x-message-ttl' for queue '{q}' in vhost '/': received '2000' but "
     "current is '1000'"),
    ({}, {"x-max-length": 5},
     "inequivalent arg 'x-max-length' for queue '{q}' in vhost '/': received the value '5' of "
     "type 'signedint' but current is none"),
    ({"x-dead-letter-exchange": "dlx"}, {},
     "inequivalent arg 'x-dead-letter-exchange' for queue '{q}' in vhost '/': received none "
     "but current is the value 'dlx' of type 'longstr'"),
])
def test_a_redeclaration_with_other_limits_is_inequivalent(amqp_server, first, again, error):
    connection = connect(amqp_server)
    channel = connection.channel()
    queue = name("limits")
    channel.queue_declare(queue, arguments=first)
    channel.queue_declare(queue, arguments=first)  # the same: accepted
    with pytest.raises(errors.ChannelClosedByBroker) as closed:
        channel.queue_declare(queue, arguments=again)
    assert closed.value.reply_code == 406
    assert closed.value.reply_text == "PRECONDITION_FAILED - " + error.replace("{q}", queue)
    connection.close()


def test_a_message_returned_by_a_closed_channel_still_expires_without_consumers(amqp_server,
                                                                                channel):
    dlx, dead = dead_letter_queue(channel)
    source = name("orphan")
    channel.queue_declare(source, arguments={"x-message-ttl": 1500,
                                             "x-dead-letter-exchange": dlx})
    channel.basic_publish("", source, b"held then dropped")
    consumer = connect(amqp_server)
    method, _, _ = consumer.channel().basic_get(source)
    assert method is not None
    consumer.close()  # the unacked message goes back to the queue, its TTL still running
    _, properties, body = next_message(channel, dead)
    assert body == b"held then dropped"
    assert properties.headers["x-death"][0]["reason"] == "expired"
    assert channel.queue_declare(source, passive=True).method.message_count == 0
