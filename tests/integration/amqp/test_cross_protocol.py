"""DESIGN.md's cross-protocol contract for AMQP, against a real `sluice serve`: paho (MQTT
3.1.1 and 5), pika and the native SDK on one broker. A queue bound to ``amq.topic`` receives
MQTT and native publishes of the subjects its key names, once each; a durable binding does so
after a restart too; an AMQP publish to ``amq.topic`` reaches MQTT subscribers and native
readers; properties cross over both ways."""
from __future__ import annotations

import asyncio
import time
import uuid

import paho.mqtt.client as mqtt
import pika

from sluice.client import ClientConfig, Message, Producer
from tests.integration.amqp.conftest import SLUICE_PASSWORD, SLUICE_USER, connect
from tests.integration.mqtt.test_robustness import PahoClient

WAIT_S = 10


def name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def bound_queue(channel, *keys: str, durable: bool = False) -> str:
    queue = name("readings")
    channel.queue_declare(queue, durable=durable)
    for key in keys:
        channel.queue_bind(queue, "amq.topic", key)
    return queue


def get(channel, queue: str):
    """basic.get until a message comes (a publish of another connection may still be on its
    way to the store); fails after WAIT_S."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        method, properties, body = channel.basic_get(queue, auto_ack=True)
        if method is not None:
            return method, properties, body
        channel.connection.process_data_events(0.05)
    raise AssertionError(f"nothing in queue {queue} within {WAIT_S} s")


def native_send(server, *messages: Message) -> None:
    async def send() -> None:
        async with Producer(ClientConfig(server.native, SLUICE_USER, SLUICE_PASSWORD)) as producer:
            for message in messages:
                await producer.send(message)
    asyncio.run(send())


def test_mqtt_publishes_reach_a_queue_bound_to_amq_topic_once(amqp_server):
    connection = connect(amqp_server)
    channel = connection.channel()
    queue = bound_queue(channel, "devices.*.telemetry", "devices.#")
    publisher = PahoClient(amqp_server.mqtt, name("d1"), username=SLUICE_USER,
                           password=SLUICE_PASSWORD)
    try:
        publisher.publish("devices/d1/telemetry", b"21.5", qos=1)
        publisher.publish("other/d1/telemetry", b"not bound", qos=1)
    finally:
        publisher.stop()
    method, _, body = get(channel, queue)
    assert (body, method.exchange, method.routing_key) == \
        (b"21.5", "amq.topic", "devices.d1.telemetry")
    assert channel.basic_get(queue) == (None, None, None), "stored once, delivered once"
    connection.close()


def test_native_publishes_reach_a_queue_bound_to_amq_topic(amqp_server):
    connection = connect(amqp_server)
    channel = connection.channel()
    queue = bound_queue(channel, "devices.*.telemetry")
    native_send(amqp_server, Message("devices", b"native",
                                     properties={"sluice.subject": "devices/n1/telemetry"}))
    method, _, body = get(channel, queue)
    assert (body, method.routing_key) == (b"native", "devices.n1.telemetry")
    connection.close()


def test_an_amqp_publish_to_amq_topic_is_delivered_once_to_a_bound_queue(amqp_server):
    connection = connect(amqp_server)
    channel = connection.channel()
    channel.confirm_delivery()
    queue = bound_queue(channel, "devices.*.telemetry", "#.telemetry")
    channel.basic_publish("amq.topic", "devices.a1.telemetry", b"once")
    method, _, body = get(channel, queue)
    assert (body, method.exchange, method.routing_key) == \
        (b"once", "amq.topic", "devices.a1.telemetry")
    assert channel.basic_get(queue) == (None, None, None)
    connection.close()


def test_a_durable_binding_reads_mqtt_publishes_after_a_restart(sluice_server, tmp_path):
    server = sluice_server(tmp_path / "data")
    server.wait_ready()
    connection = connect(server)
    queue = bound_queue(connection.channel(), "plant.*.alarm", durable=True)
    connection.close()
    assert server.stop() == 0

    again = sluice_server(tmp_path / "data")
    again.wait_ready()
    publisher = PahoClient(again.mqtt, name("plc"), username=SLUICE_USER,
                           password=SLUICE_PASSWORD, version=mqtt.MQTTv5)
    try:
        publisher.publish("plant/7/alarm", b"overheat", qos=1)
    finally:
        publisher.stop()
    connection = connect(again)
    method, _, body = get(connection.channel(), queue)
    assert (body, method.routing_key) == (b"overheat", "plant.7.alarm")
    connection.close()
