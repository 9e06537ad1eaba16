"""RabbitMQ's delayed-message exchange API on Sluice's durable timer, with pika unchanged: an
``x-delayed-message`` exchange routes as its ``x-delayed-type``, and a publish carrying an
``x-delay`` header (milliseconds) reaches its queues that much later."""
from __future__ import annotations

import time
import uuid

import pika
import pika.exceptions as errors
import pytest

from tests.integration.amqp.conftest import connect

DELAYED = {"x-delayed-type": "direct"}


def name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def test_a_delayed_publish_reaches_its_queue_when_due(amqp_server):
    connection = connect(amqp_server)
    channel = connection.channel()
    channel.confirm_delivery()
    exchange, queue = name("delayed"), name("q")
    channel.exchange_declare(exchange, "x-delayed-message", durable=True, arguments=DELAYED)
    channel.queue_declare(queue, durable=True)
    channel.queue_bind(queue, exchange, "jobs")
    published = time.monotonic()
    channel.basic_publish(exchange, "jobs", b"later", pika.BasicProperties(
        delivery_mode=2, headers={"x-delay": 1500, "job": "7"}))
    channel.basic_publish(exchange, "jobs", b"now", pika.BasicProperties(delivery_mode=2))
    channel.basic_publish(exchange, "other-key", b"unrouted", pika.BasicProperties(
        headers={"x-delay": 100}))
    got = []
    for method, properties, body in channel.consume(queue, inactivity_timeout=10):
        assert method is not None, f"only {got} arrived"
        got.append((body, time.monotonic() - published, properties.headers))
        channel.basic_ack(method.delivery_tag)
        if len(got) == 2:
            break
    channel.cancel()
    assert [body for body, _, _ in got] == [b"now", b"later"]
    assert got[0][1] < 1.0 <= 1.5 <= got[1][1] < 3.0
    assert got[1][2]["job"] == "7"
    assert channel.queue_declare(queue, passive=True).method.message_count == 0
    connection.close()


def test_a_delayed_exchange_needs_a_known_delayed_type(amqp_server):
    connection = connect(amqp_server)
    for arguments in ({}, {"x-delayed-type": "x-delayed-message"}, {"x-delayed-type": 5}):
        channel = connection.channel()
        with pytest.raises(errors.ChannelClosedByBroker) as closed:
            channel.exchange_declare(name("bad"), "x-delayed-message", arguments=arguments)
        assert closed.value.reply_code == 406
        assert "x-delayed-type" in closed.value.reply_text
    channel = connection.channel()
    exchange = name("delayed")
    channel.exchange_declare(exchange, "x-delayed-message", arguments={"x-delayed-type": "topic"})
    channel.exchange_declare(exchange, "x-delayed-message", arguments={"x-delayed-type": "topic"})
    with pytest.raises(errors.ChannelClosedByBroker) as closed:
        channel.exchange_declare(exchange, "topic")
    assert closed.value.reply_code == 406
    connection.close()


def test_x_delay_on_an_ordinary_exchange_is_an_ordinary_header(amqp_server):
    connection = connect(amqp_server)
    channel = connection.channel()
    channel.confirm_delivery()
    queue = name("q")
    channel.queue_declare(queue)
    channel.basic_publish("", queue, b"x", pika.BasicProperties(headers={"x-delay": 60_000}))
    method, properties, body = channel.basic_get(queue, auto_ack=True)
    assert body == b"x" and properties.headers == {"x-delay": 60_000}
    connection.close()
