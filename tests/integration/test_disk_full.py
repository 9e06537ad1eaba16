"""A full disk under `sluice serve`: publishes are refused with each protocol's code, nothing
unstored is acknowledged, /health says degraded, other clients stay connected, and once space is
freed the broker accepts messages again without a restart; a SIGKILL then loses nothing that was
acknowledged.

The data directory is a small real tmpfs, filled by a filler file (the test is skipped where
mounting is not permitted; tests/unit/store/test_disk_faults.py and
tests/crash/test_disk_fault_sigkill.py inject the same failures everywhere). Clients are real:
paho (MQTT 5 and 3.1.1) and the native SDK over gRPC, all on 127.0.0.1.
"""
from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from sluice.client import ClientConfig, Message, SyncProducer, TooManyRequestsError
from store.reader import StoreReader
from tests.conftest import ROOT, Server

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
    """A paho client that reports each PUBACK's reason code and whether it was disconnected."""

    def __init__(self, address: str, client_id: str, version: int) -> None:
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=version,
                                  reconnect_on_failure=False)
        self.client.username_pw_set(USER, PASSWORD)
        self.acks: dict[int, int] = {}
        self.messages: list[bytes] = []
        self.changed = threading.Condition()
        self.connected = self.disconnected = False
        self.client.on_connect = self._on_connect
        self.client.on_disconnect = self._on_disconnect
        self.client.on_publish = self._on_publish
        self.client.on_message = self._on_message
        host, port = address.rsplit(":", 1)
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


def fill(path: Path) -> None:
    """Write ``path`` until the file system has no room left."""
    with open(path, "wb", buffering=0) as filler:
        for chunk in (1 << 20, 4096):
            try:
                while True:
                    filler.write(bytes(chunk))
            except OSError as error:
                assert error.errno == errno.ENOSPC, error


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

        fill(small_tmpfs / "filler")
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
