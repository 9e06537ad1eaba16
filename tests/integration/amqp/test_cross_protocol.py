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
import pika.exceptions
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProperties

from sluice.client import ClientConfig, Message, Producer, PullConsumer, ReceivedMessage
from tests.integration.amqp.conftest import SLUICE_PASSWORD, SLUICE_USER, connect
from tests.integration.test_admin_api import Http
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


# ------------------------------------------------------------------------------ properties


def mqtt5_properties(**values) -> PahoProperties:
    properties = PahoProperties(PacketTypes.PUBLISH)
    for key, value in values.items():
        setattr(properties, key, value)
    return properties


def test_an_mqtt5_publish_reaches_amqp_with_its_properties(amqp_server):
    connection = connect(amqp_server)
    channel = connection.channel()
    queue = bound_queue(channel, "devices.*.telemetry")
    client_id = name("d7")
    publisher = PahoClient(amqp_server.mqtt, client_id, username=SLUICE_USER,
                           password=SLUICE_PASSWORD, version=mqtt.MQTTv5)
    try:
        info = publisher.client.publish("devices/d7/telemetry", b'{"t": 21.5}', 1,
                                        properties=mqtt5_properties(
            ContentType="application/json", ResponseTopic="devices/d7/replies",
            CorrelationData=b"req-1", MessageExpiryInterval=600,
            UserProperty=[("site", "berlin"), ("unit", "C"), ("site", "paris")]))
        info.wait_for_publish(WAIT_S)
    finally:
        publisher.stop()
    method, properties, body = get(channel, queue)
    assert (body, method.routing_key) == (b'{"t": 21.5}', "devices.d7.telemetry")
    assert properties.delivery_mode == 2
    assert properties.content_type == "application/json"
    assert properties.correlation_id == "req-1"
    assert properties.reply_to == "devices.d7.replies"
    assert 590_000 <= int(properties.expiration) <= 600_000
    assert abs(properties.timestamp - time.time()) < 60
    assert properties.headers == {"site": ["berlin", "paris"], "unit": "C",
                                  "x-mqtt-publish-qos": 1, "mqtt.client_id": client_id}
    connection.close()


def test_an_mqtt311_qos0_publish_is_transient_for_amqp(amqp_server):
    connection = connect(amqp_server)
    channel = connection.channel()
    queue = bound_queue(channel, "devices.*.status")
    publisher = PahoClient(amqp_server.mqtt, name("d8"), username=SLUICE_USER,
                           password=SLUICE_PASSWORD)
    try:
        publisher.publish("devices/d8/status", b"online", qos=0)
    finally:
        publisher.stop()
    _, properties, body = get(channel, queue)
    assert (body, properties.delivery_mode, properties.headers["x-mqtt-publish-qos"]) == \
        (b"online", 1, 0)
    connection.close()


AMQP_PROPERTIES = pika.BasicProperties(
    content_type="text/plain", correlation_id="c-42", reply_to="devices.a9.replies",
    delivery_mode=2, expiration="600000", message_id="m-42", app_id="billing",
    headers={"tenant": "acme", "attempt": 3})


def test_an_amqp_publish_reaches_mqtt311_and_mqtt5_subscribers(amqp_server):
    old = PahoClient(amqp_server.mqtt, name("v311"), username=SLUICE_USER,
                     password=SLUICE_PASSWORD)
    new = PahoClient(amqp_server.mqtt, name("v5"), username=SLUICE_USER,
                     password=SLUICE_PASSWORD, version=mqtt.MQTTv5)
    try:
        old.subscribe("devices/a9/#", qos=1)
        new.subscribe("devices/+/commands", qos=2)
        connection = connect(amqp_server)
        channel = connection.channel()
        channel.confirm_delivery()
        channel.basic_publish("amq.topic", "devices.a9.commands", b"reboot", AMQP_PROPERTIES)
        channel.basic_publish("amq.topic", "devices.a9.commands", b"transient",
                              pika.BasicProperties(delivery_mode=1))
        connection.close()
        first, second = old.next_message(WAIT_S), old.next_message(WAIT_S)
        assert [(m.topic, m.payload, m.qos) for m in (first, second)] == [
            ("devices/a9/commands", b"reboot", 1), ("devices/a9/commands", b"transient", 0)]
        got = new.next_message(WAIT_S)
        assert (got.topic, got.payload, got.qos) == ("devices/a9/commands", b"reboot", 1)
        props = got.properties
        assert props.ContentType == "text/plain"
        assert props.CorrelationData == b"c-42"
        assert props.ResponseTopic == "devices/a9/replies"
        assert 590 <= props.MessageExpiryInterval <= 600
        assert props.UserProperty == [("tenant", "acme"), ("attempt", "3"),
                                      ("amqp.message_id", "m-42"), ("amqp.app_id", "billing")]
        assert new.next_message(WAIT_S).qos == 0
    finally:
        old.stop()
        new.stop()


def test_an_amqp_publish_is_read_natively_with_its_properties(amqp_server):
    connection = connect(amqp_server)
    channel = connection.channel()
    channel.confirm_delivery()
    body = name("native-reads").encode()
    channel.basic_publish("amq.topic", "devices.a10.telemetry", body, AMQP_PROPERTIES)
    connection.close()

    async def read() -> ReceivedMessage:
        config = ClientConfig(amqp_server.native, SLUICE_USER, SLUICE_PASSWORD)
        async with PullConsumer(config, name("reader"), ["devices"],
                                start_from="earliest") as consumer:
            async with asyncio.timeout(WAIT_S):
                while True:
                    for message in await consumer.pull(64, timeout=1):
                        if message.body == body:
                            return message
    message = asyncio.run(read())
    props = message.properties
    assert props["sluice.subject"] == "devices/a10/telemetry"
    assert (props["amqp.exchange"], props["amqp.routing_key"]) == \
        ("amq.topic", "devices.a10.telemetry")
    assert (props["amqp.content_type"], props["amqp.correlation_id"],
            props["amqp.delivery_mode"]) == ("text/plain", "c-42", "2")


def test_a_native_publish_reaches_amqp_with_its_properties_as_headers(amqp_server):
    connection = connect(amqp_server)
    channel = connection.channel()
    queue = bound_queue(channel, "devices.*.config")
    native_send(amqp_server, Message("devices", b"v2", properties={
        "sluice.subject": "devices/n2/config", "site": "oslo"}))
    method, properties, body = get(channel, queue)
    assert (body, method.routing_key, properties.delivery_mode, properties.headers) == \
        (b"v2", "devices.n2.config", 2, {"site": "oslo"})
    connection.close()


# --------------------------------------------------------------------------- authorization


def test_binding_to_amq_topic_needs_the_right_to_read_the_subjects(amqp_server):
    admin = Http(amqp_server.admin if "://" in amqp_server.admin
                 else f"http://{amqp_server.admin}")
    user = name("reader")
    assert admin("POST", "/users", {"name": user, "password": "pw"})[0] == 201
    assert admin("PUT", f"/vhosts/%2F/permissions/{user}",
                 {"configure": ".*", "write": ".*", "read": ".*"})[0] == 200
    connection = connect(amqp_server, user=user, password="pw")
    channel = connection.channel()
    queue = name("spy")
    channel.queue_declare(queue)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
        channel.queue_bind(queue, "amq.topic", "devices.*.telemetry")
    assert refused.value.reply_code == 403
    assert refused.value.reply_text == (
        f"ACCESS_REFUSED - access to topic 'devices.*.telemetry' in exchange 'amq.topic' in "
        f"vhost '/' refused for user '{user}' (it reads 'devices/+/telemetry')")
    connection.close()

    grant = {"kind": "topic", "pattern": "devices", "actions": ["subscribe"]}
    assert admin("POST", f"/users/{user}/permissions", grant)[0] == 201
    connection = connect(amqp_server, user=user, password="pw")
    channel = connection.channel()
    channel.queue_bind(queue, "amq.topic", "devices.*.telemetry")
    publisher = PahoClient(amqp_server.mqtt, name("d3"), username=SLUICE_USER,
                           password=SLUICE_PASSWORD)
    try:
        publisher.publish("devices/d3/telemetry", b"now readable", qos=1)
    finally:
        publisher.stop()
    assert get(channel, queue)[2] == b"now readable"
    connection.close()
