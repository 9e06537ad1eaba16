"""Messages over AMQP against a real `sluice serve`: pika (BlockingConnection) publishes with
properties and gets them back, mandatory returns, publisher confirms, requeue, prefetch, and a
publish to amq.topic reaching an MQTT subscriber and a native consumer."""
from __future__ import annotations

import asyncio
import threading
import uuid
from decimal import Decimal

import paho.mqtt.client as mqtt
import pika
import pika.exceptions as errors
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from sluice.client import ClientConfig, PullConsumer
from tests.integration.amqp.conftest import SLUICE_PASSWORD, SLUICE_USER, connect

WAIT_S = 10


def name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def test_publish_and_get_round_trip_with_identical_properties(amqp_server):
    connection = connect(amqp_server)
    channel = connection.channel()
    channel.confirm_delivery()
    queue = name("orders")
    channel.queue_declare(queue)
    properties = pika.BasicProperties(
        content_type="application/json", content_encoding="utf-8",
        headers={"tenant": "acme", "n": 3, "ok": True, "price": Decimal("9.99"),
                 "nested": {"a": [1, "b"]}, "raw": b"\xff"},
        delivery_mode=2, priority=5, correlation_id="corr", reply_to="replies",
        expiration="60000", message_id="id-1", timestamp=1_700_000_000, type="order.created",
        user_id="guest", app_id="shop")
    channel.basic_publish("", queue, b'{"id": 1}', properties)  # confirmed, or it raises
    method, got, body = channel.basic_get(queue)
    assert body == b'{"id": 1}' and not method.redelivered and method.routing_key == queue
    assert vars(got) == vars(properties)
    assert channel.basic_get(queue) == (None, None, None)
    connection.close()


def test_an_unroutable_mandatory_publish_is_returned(amqp_server):
    connection = connect(amqp_server)
    channel = connection.channel()
    channel.confirm_delivery()
    with pytest.raises(errors.UnroutableError) as unroutable:
        channel.basic_publish("amq.direct", "nobody-home", b"lost", mandatory=True)
    [returned] = unroutable.value.messages
    assert returned.method.reply_code == 312 and returned.body == b"lost"
    channel.basic_publish("amq.direct", "nobody-home", b"dropped")  # confirmed, not stored
    connection.close()


def test_cc_and_bcc_headers_route_one_publish_with_more_keys_and_bcc_is_hidden(amqp_server):
    connection = connect(amqp_server)
    channel = connection.channel()
    channel.confirm_delivery()
    queues = {key: name(f"sender-selected-{key}") for key in ("to", "cc", "bcc", "other")}
    for key, queue in queues.items():
        channel.queue_declare(queue, exclusive=True)
        channel.queue_bind(queue, "amq.direct", f"{queue}-key")
    keys = {key: f"{queue}-key" for key, queue in queues.items()}
    channel.basic_publish("amq.direct", keys["to"], b"memo", pika.BasicProperties(
        headers={"CC": [keys["cc"], keys["to"]], "BCC": [keys["bcc"]], "n": 1}))
    for key in ("to", "cc", "bcc"):
        method, properties, body = channel.basic_get(queues[key], auto_ack=True)
        assert body == b"memo" and method.routing_key == keys["to"], key
        assert properties.headers == {"CC": [keys["cc"], keys["to"]], "n": 1}, key
        assert channel.basic_get(queues[key]) == (None, None, None), key  # reached once
    assert channel.basic_get(queues["other"]) == (None, None, None)
    connection.close()


def test_a_spoofed_user_id_is_refused_with_406(amqp_server):
    connection = connect(amqp_server)
    channel = connection.channel()
    channel.basic_publish("", "q", b"x", pika.BasicProperties(user_id="someone-else"))
    with pytest.raises(errors.ChannelClosedByBroker) as closed:
        channel.queue_declare("", exclusive=True)
    assert closed.value.reply_code == 406
    connection.close()


def test_nack_with_requeue_redelivers_and_prefetch_is_honoured(amqp_server):
    connection = connect(amqp_server)
    channel = connection.channel()
    channel.confirm_delivery()
    queue = name("work")
    channel.queue_declare(queue)
    for n in range(6):
        channel.basic_publish("", queue, b"%d" % n)
    channel.basic_qos(prefetch_count=2)
    held: list[tuple[int, bytes, bool]] = []
    most = 0

    def on_message(ch, method, properties, body):
        nonlocal most
        held.append((method.delivery_tag, body, method.redelivered))
        most = max(most, len(held))
        connection.call_later(0.1, settle)  # time for more to come, were the window open

    def settle():
        tag, body, redelivered = held.pop(0)
        if body == b"0" and not redelivered:
            channel.basic_nack(tag, requeue=True)
        else:
            channel.basic_ack(tag)
        seen.append((body, redelivered))
        if len(seen) == 7:
            channel.stop_consuming()

    seen: list[tuple[bytes, bool]] = []
    channel.basic_consume(queue, on_message)
    connection.call_later(WAIT_S, channel.stop_consuming)
    channel.start_consuming()
    assert most == 2, "never more than prefetch_count unacked"
    assert (b"0", True) in seen and len(seen) == 7
    connection.close()


def test_amq_topic_reaches_mqtt_subscribers_and_native_consumers(amqp_server):
    host, port = amqp_server.mqtt.rsplit(":", 1)
    received: list[mqtt.MQTTMessage] = []
    subscribed, got = threading.Event(), threading.Event()
    subscriber = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=name("watcher"))
    subscriber.username_pw_set(SLUICE_USER, SLUICE_PASSWORD)
    subscriber.on_connect = lambda c, *_: c.subscribe("devices/+/telemetry", qos=1)
    subscriber.on_subscribe = lambda *_: subscribed.set()
    subscriber.on_message = lambda c, u, message: (received.append(message), got.set())
    subscriber.connect(host, int(port))
    subscriber.loop_start()
    try:
        assert subscribed.wait(WAIT_S)
        connection = connect(amqp_server)
        channel = connection.channel()
        channel.confirm_delivery()
        channel.basic_publish("amq.topic", "devices.d1.telemetry", b"21.5")
        connection.close()
        assert got.wait(WAIT_S)
        assert (received[0].topic, received[0].payload) == ("devices/d1/telemetry", b"21.5")
    finally:
        subscriber.loop_stop()
        subscriber.disconnect()

    async def read_natively() -> list[bytes]:
        config = ClientConfig(amqp_server.native, SLUICE_USER, SLUICE_PASSWORD)
        async with PullConsumer(config, name("dash"), ["devices"],
                                start_from="earliest") as consumer:
            async with asyncio.timeout(WAIT_S):
                while True:
                    bodies = [m.body for m in await consumer.pull(timeout=1)]
                    if bodies:
                        return bodies
    assert b"21.5" in asyncio.run(read_natively())


def test_requeued_messages_count_as_ready_again(amqp_server):
    """message_count (queue.declare-ok, basic.get-ok) counts what a nack with requeue or a
    closed channel or connection put back, not only what was never delivered."""
    connection = connect(amqp_server)
    channel = connection.channel()
    queue = name("recount")
    channel.queue_declare(queue)
    for n in range(5):
        channel.basic_publish("", queue, f"m{n}".encode())

    def ready() -> int:
        return channel.queue_declare(queue, passive=True).method.message_count

    assert ready() == 5
    method, _, _ = channel.basic_get(queue)
    assert method.message_count == 4 and ready() == 4
    channel.basic_nack(method.delivery_tag, requeue=True)
    assert ready() == 5
    consumer = connection.channel()
    consumer.basic_qos(prefetch_count=2)
    got = []
    consumer.basic_consume(queue, lambda ch, m, p, b: got.append(m.delivery_tag))
    while len(got) < 2:
        connection.process_data_events(time_limit=WAIT_S)
    assert ready() == 3
    consumer.close()  # its two unacked deliveries go back
    assert ready() == 5
    connection.close()
    connection = connect(amqp_server)
    assert connection.channel().queue_declare(queue, passive=True).method.message_count == 5
    connection.close()
