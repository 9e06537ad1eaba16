"""Poison messages: stored ``mqtt.*`` properties MQTT cannot take never stop MQTT delivery, on
a real `sluice serve` with real paho clients and the native SDK.

A native sender may not set ``mqtt.*`` properties (the MQTT front end writes them): such a send
is refused with BAD_REQUEST naming the property, and what follows reaches live subscribers
(3.1.1 and 5), persistent sessions and a shared group. A subject MQTT cannot take (wildcards)
is the sender's to set and is delivered on the topic name. Messages an older version stored with
bad ``mqtt.*`` values (``mqtt.qos=x``, a bad ``mqtt.expiry_at``, ``mqtt.user_properties`` that
is not a JSON list of string pairs, bad base64 in ``mqtt.correlation_data``, a bad payload
format) reach persistent sessions after a restart, with every message after them; MQTT 5
subscribers get the bad values as user properties. A send without a subject reaches every
kind of subscriber on the topic name.
"""
from __future__ import annotations

import asyncio
import re
import socket
import threading

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProperties

from core.model import SUBJECT_PROPERTY
from protocols.mqtt.mapping import (CORRELATION_PROPERTY, EXPIRY_PROPERTY,
                                    PAYLOAD_FORMAT_PROPERTY, QOS_PROPERTY, RETAIN_PROPERTY,
                                    USER_PROPERTIES_PROPERTY)
from protocols.mqtt.topics import session_queue
from sluice.client import BadRequestError, ClientConfig, Message, Producer
from store.api import Message as StoredMessage
from tests.integration import older_version
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
    """Each poison send (refused, but for the subject MQTT cannot take) followed by a good one,
    then one without a subject; every send must be answered. Returns what was stored."""
    async def send() -> set[bytes]:
        config = ClientConfig(native, USER, PASSWORD, request_timeout=10)
        sent: set[bytes] = set()
        async with Producer(config, ["poison"]) as producer:
            for i, bad in enumerate(POISON):
                for kind, extra in (("bad", bad), ("good", {})):
                    body = f"{label}-{kind}-{i}".encode()
                    message = Message("poison", body,
                                      properties={SUBJECT_PROPERTY: f"poison/{i}/{kind}", **extra})
                    if extra and SUBJECT_PROPERTY not in extra:
                        named = "|".join(map(re.escape, bad))  # any: a map has no order
                        with pytest.raises(BadRequestError, match=f"property '({named})'"):
                            await asyncio.wait_for(producer.send(message), WAIT_S)
                        continue
                    receipt = await asyncio.wait_for(producer.send(message), WAIT_S)
                    assert receipt.message_id
                    sent.add(body)
            plain = f"{label}-no-subject".encode()  # delivered on the topic name, "poison"
            assert (await producer.send(Message("poison", plain))).message_id
            sent.add(plain)
        return sent
    return asyncio.run(send())


def store_as_older_version(data_dir, label: str, client_ids: list[str]) -> set[bytes]:
    """Each poison message followed by a good one, written into the persistent sessions of
    ``client_ids`` while the broker is stopped, as a version that let native senders set
    ``mqtt.*`` properties could have stored them."""
    queues = [(session_queue(client_id), 0) for client_id in client_ids]
    messages = []
    for i, bad in enumerate(POISON):
        for kind, extra in (("bad", bad), ("good", {})):
            properties = {SUBJECT_PROPERTY: f"poison/{i}/{kind}", **extra}
            messages.append(StoredMessage("poison", f"{label}-{kind}-{i}".encode(),
                                          properties=properties, extra_queues=queues))
    older_version.append(data_dir, messages)
    return {m.body for m in messages}


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
    assert ("sluice.subject", "poison/+/wildcard") in live5.user_properties[b"r1-bad-8"]

    # offline persistent sessions keep their queue: stored5 reconnects at once
    stored5.stop()
    stored3.stop()
    second = send_round(server.native, "r2")
    live5.wait_for_all(second, "live5")
    stored5 = Subscriber(server.mqtt, "stored5", "poison/#", version=mqtt.MQTTv5, persistent=True)
    stored5.wait_for_all(second, "stored5 after reconnecting")
    for subscriber in (live5, live3, shared, stored5):
        subscriber.stop()

    # poison an older version stored reaches the sessions after a restart, read from disk
    assert server.stop() == 0
    old = store_as_older_version(tmp_path / "data", "old", ["stored5", "stored3"])
    server = sluice_server(tmp_path / "data", "--mqtt-port", str(port))
    server.wait_ready()
    stored3 = Subscriber(server.mqtt, "stored3", "poison/#", version=mqtt.MQTTv311, persistent=True)
    stored3.wait_for_all(second | old, "stored3 after a restart")
    stored5 = Subscriber(server.mqtt, "stored5", "poison/#", version=mqtt.MQTTv5, persistent=True)
    stored5.wait_for_all(old, "stored5 after a restart")
    assert stored5.user_properties[b"old-bad-0"] == [("mqtt.qos", "x")]
    assert ("mqtt.correlation_data", "!!! not base64 !!!") in stored5.user_properties[b"old-bad-4"]
    third = send_round(server.native, "r3")
    stored5.wait_for_all(third, "stored5 after a restart")
    stored3.wait_for_all(third, "stored3 after a restart")
    assert stored5.connacks == [True] and stored3.connacks == [True], "a session was dropped"
    stored5.stop()
    stored3.stop()
