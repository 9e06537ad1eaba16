"""docs/metrics.md against a real broker's /metrics: a `sluice serve` process that MQTT (paho),
AMQP (pika) and native (SDK) clients publish to and consume from. Every exported family must be
documented with its type and labels, every documented one (outside the replica group's section,
which tests/cluster/test_compose_file.py checks on a group) exported, and the per-protocol
counters must have counted what the clients did."""
from __future__ import annotations

import re
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pika
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sluice.client import ClientConfig, Message, SyncProducer, SyncSimpleConsumer
from tests.integration.test_clients import MqttTarget
from tests.interop.scenarios import V5, Client

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "metrics.md"
CLUSTER_SECTION = "Replica group"
"""The heading of the section whose series only a node of a replica group exports."""
TIER_SECTION = "Tiered storage"
"""The heading of the section whose series only a broker with tier.url set exports
(tests/integration/test_tiering.py checks them)."""
_ROW = re.compile(r"^\|\s*`([a-z_:]+)`\s*\|\s*(counter|gauge|histogram|summary)\s*\|([^|]*)\|([^|]*)\|\s*$")


@dataclass(frozen=True)
class Entry:
    """One documented series: its exposed name, type, labels and section."""

    name: str
    kind: str
    labels: frozenset[str]
    section: str


def documented(path: Path = REFERENCE) -> dict[str, Entry]:
    """The reference's table rows by exposed name (a counter's with its ``_total``)."""
    entries: dict[str, Entry] = {}
    section = ""
    for line in path.read_text().splitlines():
        if line.startswith("## "):
            section = line[3:].strip()
        match = _ROW.match(line)
        if match:
            name, kind, labels, meaning = match.groups()
            assert name not in entries, f"{name} is documented twice"
            assert meaning.strip(), f"{name} has no meaning written"
            entries[name] = Entry(name, kind, frozenset(re.findall(r"`([a-z_]+)`", labels)), section)
    return entries


def exported(text: str) -> dict[str, tuple[str, frozenset[str]]]:
    """The exposition's series by exposed name (a counter's ``_total``; its ``_created``
    belongs to it): (type, label names)."""
    series: dict[str, tuple[str, frozenset[str]]] = {}
    for family in text_string_to_metric_families(text):
        name = family.name + "_total" if family.type == "counter" else family.name
        labels = frozenset(label for sample in family.samples for label in sample.labels)
        if family.type == "gauge" and family.name.endswith("_created") \
                and family.name.removesuffix("_created") + "_total" in series:
            continue
        series[name] = (family.type, labels)
    return series


def check_against_reference(text: str, section_only: str | None = None) -> None:
    """Every series of ``text`` is documented with its type and labels; with
    ``section_only``, every series documented in that section is exported too."""
    reference, live = documented(), exported(text)
    missing = sorted(set(live) - set(reference))
    assert not missing, f"exported but not in docs/metrics.md: {missing}"
    for name, (kind, labels) in live.items():
        entry = reference[name]
        assert entry.kind == kind, f"{name}: documented as a {entry.kind}, exported as a {kind}"
        assert labels <= entry.labels, f"{name}: exported with labels {sorted(labels)}, documented {sorted(entry.labels)}"
    if section_only is not None:
        expected = {name for name, entry in reference.items() if entry.section == section_only}
    else:
        expected = {name for name, entry in reference.items() if entry.section not in (CLUSTER_SECTION, TIER_SECTION)}
    absent = sorted(expected - set(live))
    assert not absent, f"documented in docs/metrics.md but not exported: {absent}"


def scrape(admin: str) -> str:
    """The exposition of the admin API at ``admin`` (a URL, or host:port)."""
    base = admin if admin.startswith("http") else f"http://{admin}"
    with urllib.request.urlopen(f"{base.rstrip('/')}/metrics", timeout=10) as reply:
        assert reply.status == 200
        return reply.read().decode()


def _mqtt_traffic(address: str) -> None:
    host, port = address.rsplit(":", 1)
    target = MqttTarget(host, int(port))
    subscriber = Client(target, V5).connect()
    publisher = Client(target, V5).connect()
    try:
        assert subscriber.subscribe(("metrics/mqtt", 1)) == [1]
        publisher.publish("metrics/mqtt", b"over mqtt", qos=1)
        [received] = subscriber.collect(1)
        assert received.payload == b"over mqtt"
    finally:
        publisher.close()
        subscriber.close()


def _amqp_traffic(address: str) -> None:
    host, port = address.rsplit(":", 1)
    credentials = pika.PlainCredentials("sluice", "sluice")
    with pika.BlockingConnection(pika.ConnectionParameters(host, int(port), credentials=credentials)) as connection:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare("metrics-amqp", durable=True)
        channel.basic_publish("", "metrics-amqp", b"over amqp")
        method, _, body = next(channel.consume("metrics-amqp", inactivity_timeout=30))
        assert body == b"over amqp"
        channel.basic_ack(method.delivery_tag)
        channel.cancel()


def _native_traffic(address: str) -> None:
    config = ClientConfig(address, "sluice", "sluice", request_timeout=10)
    with SyncProducer(config) as producer:
        producer.send(Message("metrics-native", b"over native"))
    with SyncSimpleConsumer(config, "metrics-readers", {"metrics-native": "*"}, await_duration=2) as consumer:
        for _ in range(15):
            got = [m for m in consumer.receive(max_messages=4)]
            for message in got:
                consumer.ack(message)
            if any(m.body == b"over native" for m in got):
                break
        else:
            raise AssertionError("the native message was not received")


def _by_protocol(text: str, family_name: str) -> dict[str, float]:
    for family in text_string_to_metric_families(text):
        if family.name == family_name:
            return {s.labels["protocol"]: s.value for s in family.samples if s.name.endswith(("_total", family_name))
                    and "protocol" in s.labels}
    raise AssertionError(f"{family_name} is not exported")


@pytest.fixture
def busy_broker(tmp_path, sluice_server):
    server = sluice_server(tmp_path / "data")
    server.wait_ready()
    _mqtt_traffic(server.mqtt)
    _amqp_traffic(server.amqp)
    _native_traffic(server.native)
    return server


def test_every_exported_series_is_documented_and_every_documented_one_exported(busy_broker):
    check_against_reference(scrape(busy_broker.admin))


def test_the_per_protocol_series_count_what_each_protocol_s_clients_did(busy_broker):
    text = scrape(busy_broker.admin)
    for family in ("sluice_protocol_messages_published", "sluice_protocol_messages_delivered",
                   "sluice_protocol_messages_acked", "sluice_protocol_connections_opened"):
        counts = _by_protocol(text, family)
        assert set(counts) == {"mqtt", "amqp", "native"}, (family, counts)
        assert all(value >= 1 for value in counts.values()), (family, counts)
    assert _by_protocol(text, "sluice_protocol_connections_opened")["mqtt"] >= 2  # two paho clients
    for family in ("sluice_protocol_received_bytes", "sluice_protocol_sent_bytes"):
        counts = _by_protocol(text, family)
        assert set(counts) == {"mqtt", "amqp"}, (family, counts)  # gRPC frames its own bytes
        assert all(value > len(b"over amqp") for value in counts.values()), (family, counts)
    assert set(_by_protocol(text, "sluice_protocol_connections")) == {"mqtt", "amqp", "native"}
