"""Poison messages: native sends whose ``mqtt.*`` properties MQTT cannot take never stop MQTT
delivery, on a real `sluice serve` with real paho clients and the native SDK.

A native sender may set any property, including the ``mqtt.*`` ones the MQTT front end writes
(``mqtt.qos=x``, a bad ``mqtt.expiry_at``, ``mqtt.user_properties`` that is not a JSON list of
string pairs, bad base64 in ``mqtt.correlation_data``, a bad payload format). Each such message,
and every message after it, reaches live subscribers (3.1.1 and 5), persistent sessions (also
after they reconnect and after a broker restart) and a shared group; MQTT 5 subscribers get
the bad values as user properties; the sender's sends are all answered. A send without a
subject reaches them all on the topic name (persistent sessions and shared groups too).
"""
from __future__ import annotations

import asyncio
import socket
import threading

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProperties

from core.model import SUBJECT_PROPERTY
from protocols.mqtt.mapping import (CORRELATION_PROPERTY, EXPIRY_PROPERTY,
                                    PAYLOAD_FORMAT_PROPERTY, QOS_PROPERTY, RETAIN_PROPERTY,
                                    USER_PROPERTIES_PROPERTY)
from sluice.client import ClientConfig, Message, Producer
from tests.integration.mqtt.test_robustness import PASSWORD, USER, host_port

WAIT_S = 20

POISON = [
    {QOS_PROPERTY: "x"},
    {EXPIRY_PROPERTY: "not-a-time"},
    {USER_PROPERTIES_PROPERTY: "not json"},
    {USER_PROPERTIES_PROPERTY: '[[1, 2], {"a": "b"}]'},
    {CORRELATION_PROPERTY: "!!! not base64 !!!"},
    {PAYLOAD_FORMAT_PROPERTY: "300"},
    {RETAIN_PROPERTY: "maybe"},
    {QOS_PROPERTY: "7", EXPIRY_PROPERTY: "-1", CORRELATION_PROPERTY: "QQ"},
    {SUBJECT_PROPERTY: "poison/+/wildcard"},  # not a topic name: delivered on the topic name
]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]




class Subscriber:
    """A paho subscriber recording every body it receives (and MQTT 5 user properties)."""

    def __init__(self, address: str, client_id: str, topic_filter: str, *, version: int,
                 persistent: bool) -> None:
        self.lock = threading.Condition()
        """Guards what the callbacks record, and is notified whenever they record something."""
        self.bodies: set[bytes] = set()
        self.user_properties: dict[bytes, list[tuple[str, str]]] = {}
        self.connacks: list[bool] = []
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=version,
                                  clean_session=None if version == mqtt.MQTTv5 else not persistent)
        self.client.username_pw_set(USER, PASSWORD)
        self.client.on_connect = self._on_connect
        self.client.on_message = self._on_message
        subscribed = threading.Event()
        self.client.on_subscribe = lambda *args: subscribed.set()
        properties = None
        if version == mqtt.MQTTv5:
            properties = PahoProperties(PacketTypes.CONNECT)
            properties.SessionExpiryInterval = 3600 if persistent else 0
        self.client.connect(*host_port(address), keepalive=30, properties=properties,
                            clean_start=not persistent if version == mqtt.MQTTv5
                            else mqtt.MQTT_CLEAN_START_FIRST_ONLY)
        self.client.loop_start()
        self._wait(lambda: self.connacks, f"{client_id} to connect")
        self.client.subscribe(topic_filter, 1)
        assert subscribed.wait(WAIT_S), f"no SUBACK for {client_id}"

    def _on_connect(self, client, userdata, flags, reason, properties) -> None:
        with self.lock:
            self.connacks.append(not reason.is_failure)
            self.lock.notify_all()

    def _on_message(self, client, userdata, message: mqtt.MQTTMessage) -> None:
        with self.lock:
            self.bodies.add(message.payload)
            users = getattr(message.properties, "UserProperty", None)
            if users:
                self.user_properties[message.payload] = list(users)
            self.lock.notify_all()

    def _wait(self, condition, what: str) -> None:
        with self.lock:
            if not self.lock.wait_for(condition, WAIT_S):
                raise AssertionError(f"timed out after {WAIT_S} s waiting for {what}")

    def wait_for_all(self, bodies: set[bytes], who: str) -> None:
        try:
            self._wait(lambda: bodies <= self.bodies, f"{who} to receive every message")
        except AssertionError:
            with self.lock:
                missing = sorted(bodies - self.bodies)
            raise AssertionError(f"{who} never received {missing[:6]} ({len(missing)} missing)") from None

    def stop(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def send_round(native: str, label: str) -> set[bytes]:
    """Each poison message followed by a good one, then one without a subject; every send
    must be answered."""
    async def send() -> set[bytes]:
        config = ClientConfig(native, USER, PASSWORD, request_timeout=10)
        sent: set[bytes] = set()
        async with Producer(config, ["poison"]) as producer:
            for i, bad in enumerate(POISON):
                for kind, extra in (("bad", bad), ("good", {})):
                    body = f"{label}-{kind}-{i}".encode()
                    properties = {SUBJECT_PROPERTY: f"poison/{i}/{kind}", **extra}
                    receipt = await asyncio.wait_for(
                        producer.send(Message("poison", body, properties=properties)), WAIT_S)
                    assert receipt.message_id
                    sent.add(body)
            plain = f"{label}-no-subject".encode()  # delivered on the topic name, "poison"
            assert (await producer.send(Message("poison", plain))).message_id
            sent.add(plain)
        return sent
    return asyncio.run(send())


def test_poison_messages_reach_every_kind_of_subscriber(sluice_server, tmp_path):
    port = free_port()
    server = sluice_server(tmp_path / "data", "--mqtt-port", str(port))
    server.wait_ready()
    seed = Subscriber(server.mqtt, "seed", "seed/#", version=mqtt.MQTTv311, persistent=False)
    seed.client.publish("poison/seed", b"creates the topic", 1).wait_for_publish(WAIT_S)
    seed.stop()

    live5 = Subscriber(server.mqtt, "live5", "poison/#", version=mqtt.MQTTv5, persistent=False)
    live3 = Subscriber(server.mqtt, "live3", "poison/#", version=mqtt.MQTTv311, persistent=False)
    shared = Subscriber(server.mqtt, "shared", "$share/g/poison/#", version=mqtt.MQTTv5,
                        persistent=False)
    stored5 = Subscriber(server.mqtt, "stored5", "poison/#", version=mqtt.MQTTv5, persistent=True)
    stored3 = Subscriber(server.mqtt, "stored3", "poison/#", version=mqtt.MQTTv311, persistent=True)

    first = send_round(server.native, "r1")
    for who, subscriber in [("live5", live5), ("live3", live3), ("shared", shared),
                            ("stored5", stored5), ("stored3", stored3)]:
        subscriber.wait_for_all(first, who)
    assert live5.user_properties[b"r1-bad-0"] == [("mqtt.qos", "x")]
    assert ("mqtt.correlation_data", "!!! not base64 !!!") in stored5.user_properties[b"r1-bad-4"]
    assert ("sluice.subject", "poison/+/wildcard") in live5.user_properties[b"r1-bad-8"]

    # offline persistent sessions keep their queue: stored5 reconnects at once, stored3 only
    # after a restart, when the poison is read back from its queue on disk
    stored5.stop()
    stored3.stop()
    second = send_round(server.native, "r2")
    live5.wait_for_all(second, "live5")
    stored5 = Subscriber(server.mqtt, "stored5", "poison/#", version=mqtt.MQTTv5, persistent=True)
    stored5.wait_for_all(second, "stored5 after reconnecting")
    for subscriber in (live5, live3, shared, stored5):
        subscriber.stop()

    assert server.stop() == 0
    server = sluice_server(tmp_path / "data", "--mqtt-port", str(port))
    server.wait_ready()
    stored3 = Subscriber(server.mqtt, "stored3", "poison/#", version=mqtt.MQTTv311, persistent=True)
    stored3.wait_for_all(second, "stored3 after a restart")
    stored5 = Subscriber(server.mqtt, "stored5", "poison/#", version=mqtt.MQTTv5, persistent=True)
    third = send_round(server.native, "r3")
    stored5.wait_for_all(third, "stored5 after a restart")
    stored3.wait_for_all(third, "stored3 after a restart")
    assert stored5.connacks == [True] and stored3.connacks == [True], "a session was dropped"
    stored5.stop()
    stored3.stop()
