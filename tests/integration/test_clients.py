"""Connected clients of every protocol through the admin API and `sluice client`: a real broker,
real paho-mqtt and SDK clients, the lists and counts an operator reads, and a kick that ends a
connection the way the protocol says an administrator does."""
from __future__ import annotations

import logging
import re
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest

from sluice.client import ClientConfig, Producer
from tests.integration.test_admin_api import BrokerThread, Http
from tests.interop.scenarios import V5, Client

REPO = Path(__file__).resolve().parents[2]
ADMINISTRATIVE_ACTION = 0x98


@dataclass(frozen=True)
class MqttTarget:
    """Where the paho clients of tests/interop connect."""

    host: str
    port: int
    username: str = "sluice"
    password: str = "sluice"
    kind: str = "Sluice"


@pytest.fixture
def broker(tmp_path):
    thread = BrokerThread(str(tmp_path / "data"))
    yield thread
    thread.stop()


def clients(admin: Http, **query: str) -> list[dict]:
    path = "/clients" + ("?" + "&".join(f"{k}={v}" for k, v in query.items()) if query else "")
    status, body, _ = admin("GET", path)
    assert status == 200, body
    return body


def connected_gauge(admin: Http) -> float:
    status, text, _ = admin("GET", "/metrics")
    assert status == 200
    return float(re.search(r"^sluice_connected_clients (\S+)$", text, re.M).group(1))


class LineSeen(logging.Handler):
    """Sets ``seen`` when a log record's message contains ``text`` (records of any thread)."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text
        self.seen = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.seen.set()


def test_mqtt_and_native_clients_are_listed_shown_counted_and_kicked(broker, caplog):
    caplog.set_level(logging.INFO, logger="sluice.clients")
    admin = Http(broker.running.admin_url)
    target = MqttTarget("127.0.0.1", broker.running.mqtt_listeners.ports["tcp"])
    device = Client(target, V5, "device-7", clean=False, session_expiry=3600).connect()
    device.subscribe(("devices/7/#", 1))
    producer = Producer(ClientConfig(broker.running.native_address, "sluice", "sluice"))
    broker.call(producer.start())
    try:
        # the broker answers the SDK's settings on its Telemetry stream, so the stream is open
        assert broker.call(producer.server_settings(10)) is not None
        native = clients(admin, protocol="native")
        assert len(native) == 1 and native[0]["user"] == "sluice" and native[0]["connected"]
        assert re.fullmatch(r"127\.0\.0\.1:\d+", native[0]["address"])

        status, shown, _ = admin("GET", "/clients/mqtt/device-7")
        assert status == 200, shown
        assert shown["user"] == "sluice" and shown["connected"]
        assert shown["subscriptions"] == ["devices/7/#"]
        assert shown["details"]["mqtt_version"] == "5.0" and shown["details"]["persistent"]
        assert connected_gauge(admin) == 2
        assert re.search(r"mqtt client 'device-7' connected: user 'sluice' from 127\.0\.0\.1:\d+",
                         caplog.text)

        assert admin("DELETE", "/clients/mqtt/device-7")[0] == 204
        assert device.disconnected.wait(10)
        assert device.disconnect_reason == ADMINISTRATIVE_ACTION
        away = clients(admin, protocol="mqtt")
        assert [(c["client_id"], c["connected"], c["address"]) for c in away] == [
            ("device-7", False, "")], "the persistent session is kept while its client is away"
        assert clients(admin, protocol="mqtt", connected="true") == []
        assert re.search(r"mqtt client 'device-7' disconnected: .*\(closed by the broker: "
                         r"AdministrativeAction\)", caplog.text)
        assert admin("DELETE", "/clients/mqtt/device-7")[0] == 404, "not connected any more"
        status, body, _ = admin("GET", "/clients/stomp/x")
        assert status == 404 and "known: amqp, mqtt, native" in body["message"]
        status, body, _ = admin("GET", "/clients/amqp/x")
        assert status == 404 and "no amqp client 'x'" in body["message"]

        kicked = LineSeen("(kicked by an administrator)")
        logging.getLogger("sluice.clients").addHandler(kicked)
        try:
            assert admin("DELETE", f"/clients/native/{native[0]['client_id']}")[0] == 204
            assert kicked.seen.wait(10), "the kicked client's Telemetry stream did not end"
        finally:
            logging.getLogger("sluice.clients").removeHandler(kicked)
    finally:
        device.close()
        broker.call(producer.close())


def test_a_user_without_admin_rights_cannot_list_or_kick_others(broker):
    admin = Http(broker.running.admin_url)
    assert admin("POST", "/users", {"name": "mallory", "password": "pw"})[0] == 201
    target = MqttTarget("127.0.0.1", broker.running.mqtt_listeners.ports["tcp"])
    victim = Client(target, V5, "victim").connect()
    try:
        mallory = Http(broker.running.admin_url, "mallory", "pw")
        assert mallory("GET", "/clients")[0] == 403
        assert mallory("GET", "/clients/mqtt/victim")[0] == 403
        assert mallory("DELETE", "/clients/mqtt/victim")[0] == 403
        assert [c["connected"] for c in clients(admin)] == [True]
        assert not victim.disconnected.is_set()
    finally:
        victim.close()


def test_sluice_client_commands_list_show_and_kick(broker):
    target = MqttTarget("127.0.0.1", broker.running.mqtt_listeners.ports["tcp"])
    away = Client(target, V5, "sensor-away", clean=False, session_expiry=3600).connect()
    away.disconnect()
    sensor = Client(target, V5, "sensor-1").connect()
    sensor.subscribe(("alerts/#", 0))
    try:
        def sluice(*args: str) -> subprocess.CompletedProcess:
            return subprocess.run([sys.executable, "-m", "sluice.cli", "client", *args,
                                   "--admin", broker.running.admin_url], capture_output=True,
                                  text=True, cwd=REPO, timeout=60)

        for body in (b"one", b"two", b"three"):
            sensor.publish("alerts/fire", body, qos=1)
        assert len(sensor.collect(3)) == 3
        listed = sluice("list")
        assert listed.returncode == 0, listed.stderr
        header, *rows = listed.stdout.splitlines()
        assert header.split("  ")[-4:] == ["SUBSCRIPTIONS", "PUBLISHED", "DELIVERED", "INFLIGHT"]
        assert re.search(r"^mqtt\s+sensor-1\s+sluice\s+127\.0\.0\.1:\d+\s+[\d-]+ [\d:]+\s+1"
                         r"\s+3 \(\d+\.\d/s\)\s+3 \(\d+\.\d/s\)\s+0$", listed.stdout, re.M), \
            listed.stdout
        assert re.search(r"^mqtt\s+sensor-away\s+sluice\s+\(away\)\s+0\s+-\s+-\s+0$",
                         listed.stdout, re.M), "a kept session has no traffic of its own"
        shown = sluice("show", "mqtt", "sensor-1")
        assert shown.returncode == 0 and "alerts/#" in shown.stdout, shown.stdout
        assert re.search(r"^  published: 3 \(\d+\.\d/s\)\n  delivered: 3 \(\d+\.\d/s\)$",
                         shown.stdout, re.M), shown.stdout
        assert "\n  inflight: 0\n" in shown.stdout
        kept = sluice("show", "mqtt", "sensor-away")
        assert "session kept" in kept.stdout and "published:" not in kept.stdout, kept.stdout
        kicked = sluice("kick", "mqtt", "sensor-1")
        assert kicked.returncode == 0 and "disconnected mqtt client sensor-1" in kicked.stdout
        assert sensor.disconnected.wait(10)
        missing = sluice("kick", "mqtt", "sensor-1")
        assert missing.returncode != 0 and "client list" in missing.stderr
    finally:
        sensor.close()
        away.close()
