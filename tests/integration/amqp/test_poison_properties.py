"""Poison properties for AMQP consumers, on a real `sluice serve` with real clients.

A native producer may not set properties in the namespaces the adapters write: an
``amqp.headers`` holding a decimal with a huge exponent (which froze the event loop in pamqp's
encoder), a decimal NaN or 600 levels of nesting (which closed every consumer of the queue
with 541, the message staying at its head), or a forged ``amqp.user_id``, exchange or routing
key, is refused with BAD_REQUEST naming the property, and an aio-pika consumer of a queue bound
to the topic goes on receiving what follows. An MQTT 5 user property of such a name is a user
property: a plain header. Messages an older version stored with such properties are delivered
to a pika consumer with the bad header dropped, and the consumer stays connected.
"""
from __future__ import annotations

import asyncio
import json
import time
import uuid

import aio_pika
import paho.mqtt.client as mqtt
import pika
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProperties

from sluice.client import BadRequestError, ClientConfig, Message, Producer
from store.api import Message as StoredMessage
from tests.integration import older_version
from tests.integration.amqp.conftest import SLUICE_PASSWORD, SLUICE_USER, connect
from tests.integration.mqtt.test_robustness import PahoClient

WAIT_S = 20
BOMB = '{"x": {"$decimal": "1e400000"}, "ok": "kept"}'
NAN = '{"x": {"$decimal": "NaN"}, "ok": "kept"}'
DEEP = '{"x": ' + "[" * 600 + "]" * 600 + ', "ok": "kept"}'
SURROGATE = '{"x": "\\ud800", "ok": "kept"}'
POISON = {
    "decimal bomb": ("amqp.headers", BOMB),
    "decimal NaN": ("amqp.headers", NAN),
    "600 levels": ("amqp.headers", DEEP),
    "forged user_id": ("amqp.user_id", "admin"),
    "forged exchange": ("amqp.exchange", "billing"),
    "forged routing key": ("amqp.routing_key", "billing.paid"),
    "forged MQTT QoS": ("mqtt.qos", "x"),
    "forged timer destination": ("sluice.timer.into", "%SYS%mqtt.retained"),
}


def url(server) -> str:
    return f"amqp://guest:guest@{server.amqp}/"


def test_native_sends_in_amqp_namespaces_are_refused_and_the_consumer_goes_on(amqp_server):
    topic = f"poison{uuid.uuid4().hex[:8]}"

    async def main() -> None:
        connection = await aio_pika.connect(url(amqp_server))
        channel = await connection.channel()
        queue = await channel.declare_queue("", exclusive=True)
        await queue.bind("amq.topic", f"{topic}.#")
        received: asyncio.Queue[aio_pika.abc.AbstractIncomingMessage] = asyncio.Queue()
        await queue.consume(received.put, no_ack=True)

        # MQTT 5 user properties with these names are the publisher's own: plain headers
        publisher = PahoClient(amqp_server.mqtt, f"mqtt-{topic}", version=mqtt.MQTTv5,
                               username=SLUICE_USER, password=SLUICE_PASSWORD)
        props = PahoProperties(PacketTypes.PUBLISH)
        props.UserProperty = [("amqp.headers", BOMB), ("amqp.user_id", "admin")]
        publisher.client.publish(f"{topic}/mqtt", b"from mqtt", 1, properties=props) \
            .wait_for_publish(WAIT_S)
        publisher.stop()
        message = await asyncio.wait_for(received.get(), WAIT_S)
        assert (message.body, message.user_id) == (b"from mqtt", None)
        assert (message.headers["amqp.headers"], message.headers["amqp.user_id"]) == \
            (BOMB, "admin")
        assert (message.exchange, message.routing_key) == ("amq.topic", f"{topic}.mqtt")

        config = ClientConfig(amqp_server.native, SLUICE_USER, SLUICE_PASSWORD, request_timeout=10)
        async with Producer(config, [topic]) as producer:
            for i, (name, value) in enumerate(POISON.values()):
                subject = f"{topic}/{i}"
                with pytest.raises(BadRequestError, match=f"property '{name}'"):
                    await producer.send(Message(topic, b"poison", properties={
                        "sluice.subject": subject, name: value}))
                await producer.send(Message(topic, f"good {i}".encode(), properties={
                    "sluice.subject": subject, "site": "oslo"}))
                message = await asyncio.wait_for(received.get(), WAIT_S)
                assert (message.body, message.headers) == (f"good {i}".encode(), {"site": "oslo"})
                assert (message.exchange, message.routing_key) == ("amq.topic", f"{topic}.{i}")
                assert message.user_id is None
        assert not channel.is_closed and not connection.is_closed
        await connection.close()
    asyncio.run(main())


def stored(body: bytes, store_queue: str, **properties: str) -> StoredMessage:
    return StoredMessage("poison", body, properties=properties, extra_queues=[(store_queue, 0)],
                         born_ts=int(time.time() * 1000))


def test_poison_stored_by_an_older_version_is_delivered_without_the_bad_header(
        sluice_server, tmp_path):
    data = tmp_path / "data"
    server = sluice_server(data)
    server.wait_ready()
    connection = connect(server)
    channel = connection.channel()
    channel.confirm_delivery()
    channel.queue_declare("held", durable=True)
    channel.queue_bind("held", "amq.topic", "poison.#")
    channel.basic_publish("amq.topic", "poison.seed", b"seed")
    assert channel.basic_get("held", auto_ack=True)[2] == b"seed"
    connection.close()
    assert server.stop() == 0

    queue = older_version.amqp_queue_store_name(data, "/", "held")
    amqp = {"sluice.subject": "poison/amqp", "amqp.exchange": "amq.topic",
            "amqp.routing_key": "poison.amqp", "amqp.delivery_mode": "2"}
    poison = [
        stored(b"bomb", queue, **amqp, **{"amqp.headers": BOMB}),
        stored(b"nan", queue, **amqp, **{"amqp.headers": NAN}),
        stored(b"deep", queue, **amqp, **{"amqp.headers": DEEP}),
        stored(b"surrogate", queue, **amqp, **{"amqp.headers": SURROGATE}),
        stored(b"fields", queue, **{**amqp, "amqp.delivery_mode": "7",
                                    "amqp.content_type": "é" * 200}),
        stored(b"native", queue, **{"sluice.subject": "poison/native", "amqp.headers": BOMB,
                                    "mqtt.user_properties": '[["ok", "kept"], ["x", "\\ud800"]]'}),
    ]
    older_version.append(data, [m for p in poison for m in (p, stored(b"good " + p.body, queue))])

    server = sluice_server(data)
    server.wait_ready()
    connection = connect(server)
    channel = connection.channel()
    received: list[tuple[bytes, pika.BasicProperties]] = []

    def on_message(ch, method, properties, body) -> None:
        received.append((body, properties))
        ch.basic_ack(method.delivery_tag)

    channel.basic_consume("held", on_message)
    deadline = time.monotonic() + WAIT_S
    while len(received) < 2 * len(poison) and time.monotonic() < deadline:
        connection.process_data_events(0.1)
    bodies = [body for body, _ in received]
    assert bodies == [b for p in poison for b in (p.body, b"good " + p.body)]
    delivered = dict(received)
    for body in (b"bomb", b"nan", b"deep", b"surrogate", b"native"):
        assert delivered[body].headers == {"ok": "kept"}, body
    fields = delivered[b"fields"]
    assert fields.delivery_mode is None and len(fields.content_type.encode()) <= 255

    channel.basic_publish("amq.topic", "poison.after", b"after")  # the consumer is still there
    deadline = time.monotonic() + WAIT_S
    while len(received) < 2 * len(poison) + 1 and time.monotonic() < deadline:
        connection.process_data_events(0.1)
    assert received[-1][0] == b"after" and connection.is_open and channel.is_open
    connection.close()
