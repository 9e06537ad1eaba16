"""A full disk under `sluice serve`: publishes are refused with each protocol's code, nothing
unstored is acknowledged, /health says degraded, other clients stay connected, and once space is
freed the broker accepts messages again without a restart; a SIGKILL then loses nothing that was
acknowledged. A broker stopped or killed on a full disk starts again on it, degraded: consumers
of every protocol read what is stored, publishes are refused, and it writes again once space is
freed, without another restart.

The data directory is a small real tmpfs, filled by a filler file (the test is skipped where
mounting is not permitted; tests/unit/store/test_disk_faults.py and
tests/crash/test_disk_fault_sigkill.py inject the same failures everywhere). Clients are real:
paho (MQTT 5 and 3.1.1), pika and the native SDK over gRPC, all on 127.0.0.1.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import paho.mqtt.client as mqtt
import pika
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from sluice.client import (ClientConfig, Message, SyncProducer, SyncSimpleConsumer,
                           TooManyRequestsError)
from store.reader import StoreReader
from tests.conftest import ROOT, Server, fill_disk
from tests.integration.amqp.conftest import connect

USER, PASSWORD = "sluice", "sluice"
CONFIG = """
[store]
segment_size = 1_048_576
index_slot_count = 1009
index_max_entries = 4096
[auth]
default_password = "sluice"
"""
PAYLOAD = 32 << 10
QUOTA_EXCEEDED = 0x97
WAIT = 30


@pytest.fixture
def small_tmpfs(mount_tmpfs) -> Path:
    """A 24 MiB tmpfs; the test is skipped where mounting is not permitted."""
    return mount_tmpfs("24m")


class Publisher:
    """A paho client that reports each PUBACK's reason code and whether it was disconnected;
    with ``persistent``, an MQTT 5 session kept for an hour (resumed if it exists)."""

    def __init__(self, address: str, client_id: str, version: int,
                 persistent: bool = False) -> None:
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=version,
                                  reconnect_on_failure=False)
        self.client.username_pw_set(USER, PASSWORD)
        self.acks: dict[int, int] = {}
        self.messages: list[bytes] = []
        self.subscribed: list[int] = []
        self.changed = threading.Condition()
        self.connected = self.disconnected = False
        self.client.on_connect = self._on_connect
        self.client.on_disconnect = self._on_disconnect
        self.client.on_publish = self._on_publish
        self.client.on_message = self._on_message
        self.client.on_subscribe = self._on_subscribe
        host, port = address.rsplit(":", 1)
        if persistent:
            session = Properties(PacketTypes.CONNECT)
            session.SessionExpiryInterval = 3600
            self.client.connect(host, int(port), keepalive=60, clean_start=False,
                                properties=session)
        else:
            self.client.connect(host, int(port), keepalive=60)
        self.client.loop_start()
        self.wait(lambda: self.connected, f"{client_id} did not connect")

    def _notify(self, change) -> None:
        with self.changed:
            change()
            self.changed.notify_all()

    def _on_connect(self, client, userdata, flags, reason, properties) -> None:
        self._notify(lambda: setattr(self, "connected", not reason.is_failure))

    def _on_disconnect(self, client, userdata, flags, reason, properties) -> None:
        self._notify(lambda: setattr(self, "disconnected", True))

    def _on_publish(self, client, userdata, mid, reason, properties) -> None:
        self._notify(lambda: self.acks.__setitem__(mid, reason.value))

    def _on_message(self, client, userdata, message) -> None:
        self._notify(lambda: self.messages.append(message.payload))

    def _on_subscribe(self, client, userdata, mid, reasons, properties) -> None:
        self._notify(lambda: self.subscribed.append(mid))

    def subscribe(self, topic_filter: str) -> None:
        """Subscribe at QoS 1 and wait for the SUBACK."""
        mid = self.client.subscribe(topic_filter, qos=1)[1]
        self.wait(lambda: mid in self.subscribed, f"no SUBACK for {topic_filter}")

    def wait(self, predicate, failure: str, timeout: float = WAIT) -> None:
        with self.changed:
            assert self.changed.wait_for(predicate, timeout), failure

    def publish(self, topic: str, payload: bytes) -> int | None:
        """Publish at QoS 1; the PUBACK's reason code, or None if disconnected first."""
        mid = self.client.publish(topic, payload, qos=1).mid
        self.wait(lambda: mid in self.acks or self.disconnected, f"no PUBACK for {mid}")
        return self.acks.get(mid)

    def stop(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def health(server: Server) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(f"{server.admin}/health", timeout=WAIT) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def disk_alarm(server: Server) -> float:
    """``sluice_disk_alarm`` on the broker's /metrics."""
    with urllib.request.urlopen(f"{server.admin}/metrics", timeout=WAIT) as response:
        text = response.read().decode()
    return float(re.search(r"^sluice_disk_alarm (\S+)$", text, re.M).group(1))


def payload(label: str) -> bytes:
    head = f"{label} ".encode()
    return head + b"x" * (PAYLOAD - len(head))


def stored_bodies(data_dir: Path, topic: str) -> set[bytes]:
    reader = StoreReader(str(data_dir))
    try:
        bodies = set()
        for name, queue_id in reader.queues():
            if name == topic:
                low, high = reader.queue_range(name, queue_id)
                bodies.update(m.body for m in reader.read(name, queue_id, low, high - low + 1, 1 << 30))
        assert reader.verify() == []
        return bodies
    finally:
        reader.close()


def test_a_full_disk_refuses_publishes_cleanly_and_the_broker_resumes_when_space_is_freed(
        sluice_server, small_tmpfs):
    data_dir = small_tmpfs / "data"
    server = sluice_server(data_dir, config=CONFIG)
    server.wait_ready()
    acked: set[bytes] = set()
    mqtt5 = Publisher(server.mqtt, "full-disk-5", mqtt.MQTTv5)
    watcher = Publisher(server.mqtt, "full-disk-watcher", mqtt.MQTTv5)
    watcher.client.subscribe("disk/#", qos=1)
    native = SyncProducer(ClientConfig(server.native, USER, PASSWORD, request_timeout=10))
    native.start()
    try:
        assert mqtt5.publish("disk/a", payload("before")) == 0
        acked.add(payload("before"))
        native.send(Message("disk", payload("native before")))
        acked.add(payload("native before"))
        watcher.wait(lambda: payload("before") in watcher.messages, "the subscriber got nothing")

        fill_disk(small_tmpfs / "filler")
        refused = None
        for number in range(400):  # the segments prepared beforehand fill first
            reason = mqtt5.publish("disk/a", payload(f"while full {number}"))
            if reason == QUOTA_EXCEEDED:
                refused = number
                break
            assert reason == 0, f"PUBACK {reason:#x}: expected success or Quota exceeded"
            acked.add(payload(f"while full {number}"))
        assert refused is not None, "the disk never filled up"
        status, body = health(server)
        assert status == 503 and body["status"] == "degraded", body
        assert "ENOSPC" in body["store"] and "free space" in body["store"], body
        assert disk_alarm(server) == 1

        began = time.monotonic()
        assert mqtt5.publish("disk/a", payload("refused")) == QUOTA_EXCEEDED
        assert time.monotonic() - began < 5, "a refusal must not wait for the disk"
        mqtt311 = Publisher(server.mqtt, "full-disk-311", mqtt.MQTTv311)
        assert mqtt311.publish("disk/b", payload("3.1.1 refused")) is None, "3.1.1 is disconnected"
        mqtt311.stop()
        with pytest.raises(TooManyRequestsError, match="ENOSPC"):
            native.send(Message("disk", payload("native refused")))
        assert mqtt5.client.is_connected() and watcher.client.is_connected() and not mqtt5.disconnected

        os.remove(small_tmpfs / "filler")
        deadline = time.monotonic() + WAIT  # the store retries within half a second
        while (status := health(server)[0]) != 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert status == 200, health(server)
        assert disk_alarm(server) == 0
        assert mqtt5.publish("disk/a", payload("after")) == 0
        acked.add(payload("after"))
        native.send(Message("disk", payload("native after")))
        acked.add(payload("native after"))
        watcher.wait(lambda: payload("after") in watcher.messages, "the subscriber missed a live message")
    finally:
        native.close()
        for client in (mqtt5, watcher):
            client.stop()

    server.kill()  # SIGKILL
    restarted = sluice_server(data_dir, config=CONFIG)
    restarted.wait_ready()
    assert restarted.stop() == 0
    missing = acked - stored_bodies(data_dir, "disk")
    assert not missing, f"{len(missing)} acknowledged messages were lost"
    done = subprocess.run([sys.executable, "-m", "sluice.cli", "store", "verify", str(data_dir)],
                          capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert (done.returncode, done.stdout) == (0, "ok\n"), done.stdout + done.stderr


def test_a_broker_restarted_on_a_full_disk_serves_reads_refuses_publishes_and_resumes(
        sluice_server, small_tmpfs, how):
    from tests.integration.amqp.test_blocked import Watched  # it imports this module
    data_dir = small_tmpfs / "data"
    server = sluice_server(data_dir, config=CONFIG)
    server.wait_ready()
    subscriber = Publisher(server.mqtt, "restart-subscriber", mqtt.MQTTv5, persistent=True)
    subscriber.subscribe("restart/#")
    subscriber.stop()
    declaring = connect(server)
    declaring.channel().queue_declare("restart-queue", durable=True)
    declaring.channel().queue_bind("restart-queue", "amq.topic", "restart.#")
    declaring.close()
    native_config = ClientConfig(server.native, USER, PASSWORD, request_timeout=10)
    with SyncSimpleConsumer(native_config, "restart-group", {"restart": "*"}, await_duration=1):
        pass  # the group and its subscription exist before the disk fills
    mqtt5 = Publisher(server.mqtt, "restart-publisher", mqtt.MQTTv5)
    acked = set()
    for number in range(5):
        assert mqtt5.publish("restart/a", payload(f"stored {number}")) == 0
        acked.add(payload(f"stored {number}"))
    fill_disk(small_tmpfs / "filler")
    for number in range(400):  # until the store itself fails
        reason = mqtt5.publish("restart/a", payload(f"while full {number}"))
        if reason == QUOTA_EXCEEDED:
            break
        assert reason == 0, f"PUBACK {reason:#x}: expected success or Quota exceeded"
        acked.add(payload(f"while full {number}"))
    mqtt5.stop()
    if how == "stopped":
        assert server.stop() == 0, server.log()[-3000:]
    else:
        server.kill()

    restarted = sluice_server(data_dir, config=CONFIG)
    restarted.wait_ready()
    status, body = health(restarted)
    assert status == 503 and body["status"] == "degraded", body
    assert "ENOSPC" in body["store"] and "free space" in body["store"], body

    subscriber = Publisher(restarted.mqtt, "restart-subscriber", mqtt.MQTTv5, persistent=True)
    subscriber.wait(lambda: acked <= set(subscriber.messages), "the MQTT session lost messages")
    reading = connect(restarted)
    queued = set()
    while (got := reading.channel().basic_get("restart-queue", auto_ack=True))[2] is not None:
        queued.add(got[2])
    assert acked <= queued, "the AMQP queue lost messages"
    native_config = ClientConfig(restarted.native, USER, PASSWORD, request_timeout=10)
    with SyncSimpleConsumer(native_config, "restart-group", {"restart": "*"},
                            await_duration=1) as consumer:
        received: set[bytes] = set()
        deadline = time.monotonic() + WAIT
        while not acked <= received and time.monotonic() < deadline:
            for message in consumer.receive(32):
                received.add(message.body)
                consumer.ack(message)
        assert acked <= received, "the native consumer lost messages"

    mqtt5 = Publisher(restarted.mqtt, "restart-publisher", mqtt.MQTTv5)
    assert mqtt5.publish("restart/a", payload("refused")) == QUOTA_EXCEEDED
    native = SyncProducer(native_config)
    native.start()
    with pytest.raises(TooManyRequestsError, match="ENOSPC"):
        native.send(Message("restart", payload("native refused")))
    amqp = Watched(restarted)
    confirming = amqp.connection.channel()
    confirming.confirm_delivery()
    persistent = pika.BasicProperties(delivery_mode=2)
    with pytest.raises(pika.exceptions.NackError):
        confirming.basic_publish("amq.topic", "restart.amqp", payload("amqp refused"), persistent)
    assert amqp.wait_for(1) == ["blocked: low on disk"]

    os.remove(small_tmpfs / "filler")
    deadline = time.monotonic() + WAIT  # the store retries within half a second
    while (status := health(restarted)[0]) != 200 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert status == 200, health(restarted)
    assert amqp.wait_for(2)[1] == "unblocked"
    assert mqtt5.publish("restart/a", payload("after")) == 0
    native.send(Message("restart", payload("native after")))
    confirming.basic_publish("amq.topic", "restart.amqp", payload("amqp after"), persistent)
    subscriber.wait(lambda: {payload("after"), payload("native after"),
                             payload("amqp after")} <= set(subscriber.messages),
                    "the resumed broker did not deliver what was published after the disk had room")
    native.close()
    amqp.connection.close()
    reading.close()
    for client in (mqtt5, subscriber):
        client.stop()
    assert restarted.stop() == 0


@pytest.fixture(params=["stopped", "killed"])
def how(request) -> str:
    """How the broker on the full disk ends before its restart: SIGTERM or SIGKILL."""
    return request.param

