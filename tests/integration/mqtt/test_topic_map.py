"""``mqtt.topic_map``: a fleet publishing ``<device-id>/telemetry`` fills one native topic instead
of one topic per device, native consumers read it there, and subscribing is authorized on every
topic a filter can reach."""
from __future__ import annotations

import asyncio

import pytest

from sluice.client import ClientConfig, PullConsumer
from tests.integration.test_admin_api import BrokerThread, Http
from tests.integration.test_clients import MqttTarget
from tests.interop.scenarios import V5, Client

GRANTED_QOS_1, NOT_AUTHORIZED = 1, 0x87


@pytest.fixture
def fleet_broker(tmp_path):
    thread = BrokerThread(str(tmp_path / "data"), **{"mqtt.topic_map": "+/telemetry=telemetry"})
    yield thread
    thread.stop()


def test_device_topics_share_one_native_topic(fleet_broker):
    admin = Http(fleet_broker.running.admin_url)
    target = MqttTarget("127.0.0.1", fleet_broker.running.mqtt_listeners.ports["tcp"])
    watcher = Client(target, V5, "watcher").connect()
    assert watcher.subscribe(("+/telemetry", 1)) == [GRANTED_QOS_1]
    devices = [Client(target, V5, f"d{n}").connect() for n in range(3)]
    try:
        for n, device in enumerate(devices):
            device.publish(f"d{n}/telemetry", f"reading {n}", qos=1)
        assert sorted(m.topic for m in watcher.collect(3)) == [f"d{n}/telemetry" for n in range(3)]
        names = {t["name"] for t in admin("GET", "/topics")[1]}
        assert "telemetry" in names and not names & {"d0", "d1", "d2"}

        async def read_natively() -> list[str]:
            config = ClientConfig(fleet_broker.running.native_address, "sluice", "sluice")
            async with PullConsumer(config, "dashboards", ["telemetry"],
                                    start_from="earliest") as consumer:
                bodies: list[str] = []
                async with asyncio.timeout(10):
                    while len(bodies) < 3:
                        bodies += [m.body.decode() for m in await consumer.pull(timeout=1)]
                return sorted(bodies)
        assert fleet_broker.call(read_natively()) == [f"reading {n}" for n in range(3)]
    finally:
        for client in (watcher, *devices):
            client.close()


def test_subscribing_needs_the_right_on_every_topic_a_filter_reaches(fleet_broker):
    admin = Http(fleet_broker.running.admin_url)
    assert admin("POST", "/users", {"name": "dash", "password": "pw"})[0] == 201
    grant = {"kind": "topic", "pattern": "telemetry", "actions": ["subscribe"]}
    assert admin("POST", "/users/dash/permissions", grant)[0] == 201
    target = MqttTarget("127.0.0.1", fleet_broker.running.mqtt_listeners.ports["tcp"],
                        username="dash", password="pw")
    dash = Client(target, V5, "dash-1").connect()
    try:
        assert dash.subscribe(("+/telemetry", 1)) == [GRANTED_QOS_1]
        assert dash.subscribe(("d7/telemetry", 1)) == [GRANTED_QOS_1]
        assert dash.subscribe(("d7/#", 1)) == [NOT_AUTHORIZED], "d7/status is stored in d7"
        assert dash.subscribe(("+/status", 1)) == [NOT_AUTHORIZED]
    finally:
        dash.close()
