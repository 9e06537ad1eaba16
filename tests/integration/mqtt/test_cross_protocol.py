"""DESIGN.md's cross-protocol contract between MQTT and the native protocol, on a real broker.

- An MQTT publish on ``devices/d1/telemetry`` is stored in native topic ``devices`` (the first
  level): a native consumer reads the same body bytes, the full MQTT topic in ``sluice.subject``
  and the MQTT 5 properties as ``mqtt.*`` properties.
- A native send to ``devices`` is delivered to MQTT subscribers on its ``sluice.subject``, or on
  the topic name when it has none, at QoS 1.
- Authorization is decided on the native topic: a user allowed only ``devices`` publishes MQTT
  ``devices/...`` and reads it natively.

Clients: paho-mqtt (helpers of test_robustness.py) and the native SDK; waits are on events and
long polls, never fixed sleeps.
"""
from __future__ import annotations

import asyncio
import queue
import base64
import json
import time

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProperties

from core.model import SUBJECT_PROPERTY
from protocols.mqtt.mapping import (CONTENT_TYPE_PROPERTY, CORRELATION_PROPERTY, QOS_PROPERTY,
                                    RESPONSE_TOPIC_PROPERTY, USER_PROPERTIES_PROPERTY)
from sluice.client import ClientConfig, Message, Producer, PullConsumer, ReceivedMessage
from tests.integration.mqtt.test_robustness import (PASSWORD, USER, PahoClient, sluice_cli,  # noqa: F401
                                                    started)

TIMEOUT = 20


def native_config(server, user: str = USER, password: str = PASSWORD) -> ClientConfig:
    return ClientConfig(server.native, user, password, request_timeout=5)


async def pull_until(config: ClientConfig, group: str, topic: str, wanted: bytes) -> ReceivedMessage:
    """Read ``topic`` from the earliest offset as ``group`` until a message with body ``wanted``."""
    async with PullConsumer(config, group, [topic], start_from="earliest",
                            auto_commit_interval=None) as consumer:
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            for message in await consumer.pull(32, timeout=1):
                if message.body == wanted:
                    return message
    raise AssertionError(f"no message {wanted!r} in native topic {topic} within {TIMEOUT} s")


def test_an_mqtt5_publish_is_read_natively_with_subject_and_mqtt_properties(started):
    """MQTT 5, QoS 1, with user properties (a repeated name too), content type, response topic
    and correlation data, on ``devices/d1/telemetry``: a native pull consumer of ``devices``
    gets the identical (binary) body, ``sluice.subject`` = the MQTT topic, and mqtt.* properties."""
    server = started()
    publisher = PahoClient(server.mqtt, "xp-telemetry", version=mqtt.MQTTv5)
    body = bytes(range(256)) + "ünïcode ✓".encode()
    properties = PahoProperties(PacketTypes.PUBLISH)
    properties.UserProperty = [("site", "berlin"), ("unit", "°C"), ("site", "paris")]
    properties.ContentType = "application/octet-stream"
    properties.ResponseTopic = "devices/d1/replies"
    properties.CorrelationData = b"\x00corr\xff"
    info = publisher.client.publish("devices/d1/telemetry", body, 1, properties=properties)
    info.wait_for_publish(TIMEOUT)
    assert info.is_published(), "no PUBACK"
    publisher.stop()

    message = asyncio.run(pull_until(native_config(server), "xp-readers", "devices", body))
    assert message.topic == "devices"
    assert message.body == body
    props = message.properties
    assert props[SUBJECT_PROPERTY] == "devices/d1/telemetry"
    assert props[QOS_PROPERTY] == "1"
    assert props[CONTENT_TYPE_PROPERTY] == "application/octet-stream"
    assert props[RESPONSE_TOPIC_PROPERTY] == "devices/d1/replies"
    assert base64.b64decode(props[CORRELATION_PROPERTY]) == b"\x00corr\xff"
    assert json.loads(props[USER_PROPERTIES_PROPERTY]) == [["site", "berlin"], ["unit", "°C"],
                                                           ["site", "paris"]]


def test_native_sends_reach_mqtt_subscribers_on_subject_or_topic_name(started):
    """A native send to ``devices`` with ``sluice.subject`` = ``devices/d9/cmd`` reaches an MQTT
    subscriber of ``devices/+/cmd`` on that topic; one without a subject reaches a subscriber of
    ``devices`` (the topic name); both at QoS 1 (they were stored durably), bodies unchanged."""
    server = started()
    seed = PahoClient(server.mqtt, "xp-seed")  # creates native topic devices the MQTT way
    seed.publish("devices/d0/boot", b"seed", qos=1)
    seed.stop()
    by_subject = PahoClient(server.mqtt, "xp-cmd", version=mqtt.MQTTv5)
    assert [int(getattr(r, "value", r)) for r in by_subject.subscribe("devices/+/cmd", qos=1)] == [1]
    by_name = PahoClient(server.mqtt, "xp-plain")
    assert [int(getattr(r, "value", r)) for r in by_name.subscribe("devices", qos=2)] == [2]

    command, plain = b"\x01reboot\xfe", b"no subject \x00 here"

    async def send() -> None:
        async with Producer(native_config(server), ["devices"]) as producer:
            await producer.send(Message("devices", command, properties={SUBJECT_PROPERTY: "devices/d9/cmd",
                                                                        "origin": "native"}))
            await producer.send(Message("devices", plain))
    asyncio.run(send())

    got = by_subject.next_message(TIMEOUT)
    assert (got.topic, got.payload, got.qos) == ("devices/d9/cmd", command, 1)
    got = by_name.next_message(TIMEOUT)
    assert (got.topic, got.payload, got.qos) == ("devices", plain, 1)
    assert by_subject.messages.empty(), "the subscriber of devices/+/cmd got the subject-less send"
    by_subject.stop()
    by_name.stop()


def test_authorization_is_on_the_native_topic(started):
    """carol may publish and subscribe on topic ``devices`` only (and use group carol-*): her
    MQTT publish on ``devices/d7/telemetry`` is PUBACKed and she reads it natively from
    ``devices``; her MQTT publish on ``secret/x`` is refused (MQTT 5 PUBACK 0x87)."""
    server = started()
    admin = ["--admin", server.admin, "--user", USER, "--password", PASSWORD]
    sluice_cli("user", "create", "carol", "--new-password", "pw", *admin)
    sluice_cli("user", "grant", "carol", "topic", "devices", "publish", "subscribe", *admin)
    sluice_cli("user", "grant", "carol", "group", "carol-*", "subscribe", *admin)

    carol = PahoClient(server.mqtt, "xp-carol", version=mqtt.MQTTv5, username="carol", password="pw")
    acks: queue.Queue[tuple[int, int]] = queue.Queue()
    carol.client.on_publish = lambda client, userdata, mid, reason, props: acks.put((mid, reason.value))
    ok = carol.client.publish("devices/d7/telemetry", b"allowed", 1)
    denied = carol.client.publish("secret/x", b"leak", 1)
    got = dict(acks.get(timeout=TIMEOUT) for _ in range(2))
    assert (got[ok.mid], got[denied.mid]) == (0, 0x87)
    carol.stop()

    message = asyncio.run(pull_until(native_config(server, "carol", "pw"), "carol-readers", "devices",
                                     b"allowed"))
    assert message.properties[SUBJECT_PROPERTY] == "devices/d7/telemetry"


def test_a_delayed_mqtt_publish_arrives_when_due_on_its_topic_for_mqtt_and_native_readers(started):
    """``$delayed/<seconds>/<topic>`` (EMQX's form) publishes to ``<topic>`` that much later,
    held by the same durable timer native delayed messages use; a malformed delay is refused
    with Topic Name Invalid and the connection goes on."""
    server = started()
    subscriber = PahoClient(server.mqtt, "delay-sub", version=mqtt.MQTTv5)
    subscriber.subscribe("alerts/#", qos=1)
    publisher = PahoClient(server.mqtt, "delay-pub", version=mqtt.MQTTv5)
    published = time.time()
    publisher.publish("$delayed/2/alerts/door", b"open", qos=1)
    publisher.publish("alerts/now", b"at once", qos=1)
    first = subscriber.next_message()
    assert (first.topic, first.payload) == ("alerts/now", b"at once")
    later = subscriber.next_message(timeout=TIMEOUT)
    arrived = time.time()
    assert (later.topic, later.payload) == ("alerts/door", b"open")
    assert 2.0 <= arrived - published < 3.5

    acks = queue.Queue()
    publisher.client.on_publish = lambda client, userdata, mid, reason, properties: acks.put(reason)
    for topic in ("$delayed/x/alerts/door", "$delayed/5", "$delayed/99999999999/alerts/door"):
        publisher.client.publish(topic, b"bad", 1)
        assert acks.get(timeout=TIMEOUT).value == 0x90  # Topic Name Invalid
    publisher.publish("alerts/after", b"still connected", qos=1)
    assert subscriber.next_message().payload == b"still connected"

    message = asyncio.run(pull_until(native_config(server), "delay-readers", "alerts", b"open"))
    assert message.properties[SUBJECT_PROPERTY] == "alerts/door"
    publisher.stop()
    subscriber.stop()
