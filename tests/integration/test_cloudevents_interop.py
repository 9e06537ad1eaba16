"""CloudEvents across protocols, against one real `sluice serve`: an event published in one
protocol's binding reaches a consumer of every other protocol in that consumer's binding,
every attribute intact, as the official CloudEvents SDK reads it.

- MQTT 5 (paho): binary mode, the attributes as user properties, datacontenttype as the
  Content Type;
- MQTT 3.1.1 (paho): structured mode (the JSON event format), the only mode it has;
- AMQP 0-9-1 (pika): the RabbitMQ binding, ``ce-`` headers (read with the SDK's
  ``from_rabbitmq``);
- native (the Sluice SDK): the RocketMQ binding, ``CE_`` properties and ``CE_contenttype``.
"""
from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import paho.mqtt.client as mqtt
import pika
import pytest
from cloudevents.core.bindings.rabbitmq import RabbitMQMessage, from_rabbitmq
from cloudevents.core.bindings.rabbitmq import to_binary as rabbitmq_binary
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent
from dateutil.parser import isoparse
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProperties

from sluice.client import ClientConfig, Message, PullConsumer
from tests.conftest import Server
from tests.integration.amqp.conftest import amqp_server, connect  # noqa: F401 - the fixture
from tests.integration.amqp.test_cross_protocol import get, name, native_send
from tests.integration.mqtt.test_robustness import PahoClient

USER = PASSWORD = "sluice"
WAIT_S = 20
TOPIC = "ce"
PROTOCOLS = ("mqtt5", "mqtt311", "amqp", "native")
PAIRS = [(publisher, consumer) for publisher in PROTOCOLS for consumer in PROTOCOLS
         if publisher != consumer]
CE_NAMES = ("id", "source", "type", "specversion", "subject", "time", "dataschema", "tenant")


@pytest.fixture(scope="module")
def server(amqp_server: Server) -> Server:
    """One broker for the module."""
    return amqp_server


def an_event(label: str, content_type: str = "application/json") -> CloudEvent:
    """An event using every attribute: the optional ones, an extension, JSON data."""
    return CloudEvent(attributes={
        "id": f"evt-{uuid.uuid4().hex}", "source": "/sensors/plant-7", "type": "com.example.reading",
        "specversion": "1.0", "subject": f"{label}/reading", "datacontenttype": content_type,
        "dataschema": "https://example.com/schemas/reading.json", "tenant": "acme",
        "time": datetime(2024, 5, 1, 12, 30, 15, tzinfo=UTC)},
        data={"t": 21.5, "label": label})


def text_attributes(event: CloudEvent) -> dict[str, str]:
    """The event's attributes as text, as a binding carries them (time in RFC 3339)."""
    out = {}
    for name, value in event.get_attributes().items():
        if isinstance(value, datetime):
            value = value.isoformat().replace("+00:00", "Z")
        out[name] = str(value)
    return out


def rebuilt(attributes: dict[str, str], body: bytes) -> CloudEvent:
    """An SDK event from binary-mode attributes as text and JSON data."""
    values: dict[str, Any] = dict(attributes)
    if "time" in values:
        values["time"] = isoparse(values["time"])
    return CloudEvent(attributes=values, data=json.loads(body))


def assert_same(got: CloudEvent, sent: CloudEvent) -> None:
    assert got.get_attributes() == sent.get_attributes()
    assert got.get_data() == sent.get_data()


# ------------------------------------------------------------------------------ publishers


def publish(server: Server, protocol: str, subject: str, event: CloudEvent) -> None:
    """Publish ``event`` on ``subject`` in ``protocol``'s binding."""
    if protocol == "mqtt5":
        properties = PahoProperties(PacketTypes.PUBLISH)
        attributes = text_attributes(event)
        properties.ContentType = attributes.pop("datacontenttype")
        properties.UserProperty = list(attributes.items())
        client = PahoClient(server.mqtt, name("pub5"), username=USER, password=PASSWORD,
                            version=mqtt.MQTTv5)
        try:
            info = client.client.publish(subject, json.dumps(event.get_data()), 1,
                                         properties=properties)
            info.wait_for_publish(WAIT_S)
            assert info.is_published()
        finally:
            client.stop()
    elif protocol == "mqtt311":
        client = PahoClient(server.mqtt, name("pub311"), username=USER, password=PASSWORD)
        try:
            client.publish(subject, JSONFormat().write(event), qos=1)
        finally:
            client.stop()
    elif protocol == "amqp":
        message = rabbitmq_binary(event, JSONFormat())
        amqp_publish(server, subject, message.body, pika.BasicProperties(
            content_type=message.content_type, headers=message.headers, delivery_mode=2))
    else:
        attributes = text_attributes(event)
        properties = {"CE_contenttype": attributes.pop("datacontenttype"),
                      **{f"CE_{name}": value for name, value in attributes.items()},
                      "sluice.subject": subject}
        native_send(server, Message(TOPIC, json.dumps(event.get_data()).encode(),
                                    properties=properties))


def amqp_publish(server: Server, subject: str, body: bytes,
                 properties: pika.BasicProperties) -> None:
    connection = connect(server)
    channel = connection.channel()
    channel.confirm_delivery()
    channel.basic_publish("amq.topic", subject.replace("/", "."), body, properties)
    connection.close()


# ------------------------------------------------------------------------------- consumers


class Consumer:
    """A consumer of ``protocol`` of the subjects under ``prefix``, subscribed before the
    publish; ``receive`` reads the event back as the SDK does in that binding."""

    def __init__(self, server: Server, protocol: str, prefix: str) -> None:
        self.server, self.protocol, self.prefix = server, protocol, prefix
        self.paho: PahoClient | None = None
        self.connection: pika.BlockingConnection | None = None
        if protocol in ("mqtt5", "mqtt311"):
            version = mqtt.MQTTv5 if protocol == "mqtt5" else mqtt.MQTTv311
            self.paho = PahoClient(server.mqtt, name("sub"), username=USER, password=PASSWORD,
                                   version=version)
            self.paho.subscribe(f"{prefix}/#", qos=1)
        elif protocol == "amqp":
            self.connection = connect(server)
            self.channel = self.connection.channel()
            self.queue = name("ce-events")
            self.channel.queue_declare(self.queue, exclusive=True)
            self.channel.queue_bind(self.queue, "amq.topic", prefix.replace("/", ".") + ".#")

    def receive(self) -> tuple[CloudEvent, dict[str, Any]]:
        """The event received and the protocol's own view of what came with it."""
        if self.paho is not None:
            message = self.paho.next_message(WAIT_S)
            if self.protocol == "mqtt311":
                return JSONFormat().read(None, message.payload), {"payload": message.payload}
            props = message.properties
            users = getattr(props, "UserProperty", [])
            content_type = getattr(props, "ContentType", None)
            seen = {"user_properties": users, "content_type": content_type,
                    "payload": message.payload}
            if not users:  # structured: by its content type, or as an MQTT 3.1.1 client sent it
                assert content_type in (None, "application/cloudevents+json")
                return JSONFormat().read(None, message.payload), seen
            return rebuilt({**dict(users), "datacontenttype": content_type},
                           message.payload), seen
        if self.connection is not None:
            _, properties, body = get(self.channel, self.queue)
            headers = properties.headers or {}
            message = RabbitMQMessage(headers=headers, content_type=properties.content_type,
                                      body=body)
            return from_rabbitmq(message, JSONFormat()), {"headers": headers,
                                                          "content_type": properties.content_type}
        received = native_read(self.server, self.prefix)
        props = dict(received.properties)
        attributes = {name[3:]: value for name, value in props.items()
                      if name.startswith("CE_") and name != "CE_contenttype"}
        if props.get("CE_contenttype", "").startswith("application/cloudevents+json"):
            return JSONFormat().read(None, received.body), {"properties": props}
        attributes["datacontenttype"] = props["CE_contenttype"]
        return rebuilt(attributes, received.body), {"properties": props}

    def close(self) -> None:
        if self.paho is not None:
            self.paho.stop()
        if self.connection is not None:
            self.connection.close()


def native_read(server: Server, prefix: str):
    async def read():
        async with PullConsumer(ClientConfig(server.native, USER, PASSWORD), name("reader"),
                                [TOPIC], start_from="earliest") as consumer:
            async with asyncio.timeout(WAIT_S):
                while True:
                    for message in await consumer.pull(64, timeout=1):
                        if message.properties.get("sluice.subject", "").startswith(prefix + "/"):
                            return message
    return asyncio.run(read())


@pytest.fixture
def consumer(server: Server) -> Iterator[Callable[[str, str], Consumer]]:
    opened: list[Consumer] = []

    def open_consumer(protocol: str, prefix: str) -> Consumer:
        opened.append(Consumer(server, protocol, prefix))
        return opened[-1]
    yield open_consumer
    for each in opened:
        each.close()


# ----------------------------------------------------------------------------------- tests


def assert_rendered_once(protocol: str, seen: dict[str, Any]) -> None:
    """The attributes travel in the consumer's binding only, not also in the form another
    protocol stored them."""
    if protocol == "mqtt5":
        names = [name for name, _ in seen["user_properties"]]
        assert sorted(names) == sorted(CE_NAMES), names
        assert seen["content_type"] == "application/json"
    elif protocol == "amqp":
        ce = {name for name in seen["headers"] if name.startswith("ce-")}
        assert ce == {f"ce-{name}" for name in CE_NAMES}
        assert not set(seen["headers"]) & (set(CE_NAMES) | {f"CE_{n}" for n in CE_NAMES})
    elif protocol == "native":
        props = seen["properties"]
        for stored in ("mqtt.user_properties", "amqp.headers"):
            assert "specversion" not in props.get(stored, ""), props


@pytest.mark.parametrize(("publisher", "receiver"), PAIRS)
def test_an_event_crosses_from_each_protocol_to_each_other(server, consumer, publisher,
                                                           receiver):
    prefix = f"{TOPIC}/{name(publisher + '-' + receiver)}"
    reader = consumer(receiver, prefix)
    sent = an_event(prefix)
    publish(server, publisher, f"{prefix}/readings", sent)
    got, seen = reader.receive()
    assert_same(got, sent)
    if publisher == "mqtt311":  # structured, and stays so: MQTT 5 gets it as published
        if receiver == "mqtt5":
            assert seen["payload"] == JSONFormat().write(sent) and not seen["content_type"]
    else:
        assert_rendered_once(receiver, seen)


@pytest.mark.parametrize(("publisher", "receiver"), [
    ("native", "mqtt5"), ("native", "amqp"), ("mqtt311", "amqp"), ("mqtt311", "native"),
    ("amqp", "mqtt5"), ("amqp", "native")])
def test_a_structured_event_stays_structured_with_its_content_type(server, consumer, publisher,
                                                                   receiver):
    prefix = f"{TOPIC}/{name('structured-' + receiver)}"
    reader = consumer(receiver, prefix)
    sent = an_event(prefix)
    body = JSONFormat().write(sent)
    if publisher == "native":
        native_send(server, Message(TOPIC, body, properties={"sluice.subject": f"{prefix}/x"}))
    elif publisher == "amqp":
        amqp_publish(server, f"{prefix}/x", body,
                     pika.BasicProperties(content_type="application/cloudevents+json"))
    else:
        publish(server, "mqtt311", f"{prefix}/x", sent)
    got, seen = reader.receive()
    assert_same(got, sent)
    if receiver == "mqtt5":
        assert (seen["content_type"], seen["payload"]) == ("application/cloudevents+json", body)
        assert not seen["user_properties"]
    elif receiver == "amqp":
        assert seen["content_type"] == "application/cloudevents+json"
        assert not any(name.startswith("ce-") for name in seen["headers"])
    else:
        assert seen["properties"]["CE_contenttype"] == "application/cloudevents+json"


def test_an_amqp_structured_event_reaches_mqtt311_unchanged(server, consumer):
    prefix = f"{TOPIC}/{name('amqp-structured')}"
    reader = consumer("mqtt311", prefix)
    sent = an_event(prefix)
    body = JSONFormat().write(sent)
    amqp_publish(server, f"{prefix}/x", body,
                 pika.BasicProperties(content_type="application/cloudevents+json"))
    got, seen = reader.receive()
    assert seen["payload"] == body
    assert_same(got, sent)


def test_an_incomplete_event_stays_ordinary_properties(server, consumer):
    """A header named like an attribute, on a message that is no event (no id), is passed on
    as an ordinary user property, and the payload is untouched."""
    prefix = f"{TOPIC}/{name('not-an-event')}"
    mqtt5 = consumer("mqtt5", prefix)
    old = consumer("mqtt311", prefix)
    amqp_publish(server, f"{prefix}/x", b"21.5", pika.BasicProperties(
        content_type="text/plain", headers={"ce-specversion": "1.0", "ce-type": "t"}))
    message = mqtt5.paho.next_message(WAIT_S)
    assert message.payload == b"21.5"
    assert message.properties.ContentType == "text/plain"
    assert sorted(message.properties.UserProperty) == [("ce-specversion", "1.0"), ("ce-type", "t")]
    assert old.paho.next_message(WAIT_S).payload == b"21.5"


def test_mqtt5_subscribers_get_an_mqtt5_event_as_published(server, consumer):
    """Same protocol, same form: MQTT 5 to MQTT 5 is not rewritten."""
    prefix = f"{TOPIC}/{name('same')}"
    reader = consumer("mqtt5", prefix)
    sent = an_event(prefix)
    publish(server, "mqtt5", f"{prefix}/x", sent)
    got, seen = reader.receive()
    assert_same(got, sent)
    assert seen["user_properties"] == list(
        (n, v) for n, v in text_attributes(sent).items() if n != "datacontenttype")
