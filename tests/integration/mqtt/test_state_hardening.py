"""MQTT state that no message or peer can break or bloat, on a real `sluice serve`.

- A bad record in the sessions state topic is skipped at start (one log line naming the client
  id) and every other persistent session is restored.
- Refused publishes and subscribes with 60 KB topic names leave no memory behind and write a
  few log lines, not one 60 KB line each.
- MQTT first levels of dots only (``./x``, ``../x``) work; core refuses ``.`` as a topic name;
  a ``.`` topic stored by an older version does not break ``/metrics`` or the topic page.
- Retained limits: a retained PUBLISH for a new topic beyond ``max_retained_messages`` or
  ``max_retained_bytes`` gets 0x97 (MQTT 5) and is not stored; 3.1.1 stores and delivers it
  without retaining it; replacing and clearing always work; limits hold across a restart.
- A filter or topic deeper than core allows gets SUBACK 0x8F / PUBACK 0x90, not a crash.

Raw-socket clients where packet details matter (see test_robustness.py), the native SDK for
native sends, urllib for the admin API; waits are on socket reads and process output.
"""
from __future__ import annotations

import asyncio
import base64
import json
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from core.metadata import MetadataRepository
from core.model import TopicConfig
from protocols.mqtt.codec import MQTT_5, MQTT_311, encode
from protocols.mqtt.packets import PubAck, Publish, PubRec, SubAck, Subscribe, Subscription
from protocols.mqtt.properties import Properties
from sluice.client import ClientConfig, Message, Producer
from tests.conftest import CONFIG, Server
from tests.integration.mqtt.test_robustness import PASSWORD, USER, RawClient, sluice_cli

WAIT_S = 20


class StderrReader:
    """Drains a broker's stderr on a thread (a full pipe would block its logging) and keeps it."""

    def __init__(self, server: Server) -> None:
        self.lines: list[str] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._pump, args=(server,), daemon=True)
        self._thread.start()

    def _pump(self, server: Server) -> None:
        for line in server.follow_log():
            with self._lock:
                self.lines.append(line)

    def text(self) -> str:
        with self._lock:
            return "".join(self.lines)

    def join(self) -> None:
        """After the process ended: everything it wrote has been read."""
        self._thread.join(WAIT_S)


def start(sluice_server, data_dir: Path, config: str = CONFIG) -> tuple[Server, StderrReader]:
    server = sluice_server(data_dir, config=config)
    server.wait_ready()
    return server, StderrReader(server)


def stop(server: Server, stderr: StderrReader) -> str:
    assert server.stop() == 0
    stderr.join()
    return stderr.text()


def rss_bytes(server: Server) -> int:
    for line in Path(f"/proc/{server.process.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/<pid>/status")


def admin_request(server: Server, method: str, path: str, body: dict | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(f"{server.admin}{path}", method=method,
                                     data=None if body is None else json.dumps(body).encode())
    request.add_header("Authorization", "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode())
    if body is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=WAIT_S) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def publish_all(client: RawClient, publishes: list[Publish], window_size: int = 256) -> list[int]:
    """Send QoS 1/2 PUBLISHes in windows below the Receive Maximum; the reason code of each
    PUBACK (PUBREC for QoS 2), in the order of ``publishes``."""
    codes: dict[int, int] = {}
    for start_at in range(0, len(publishes), window_size):
        window = publishes[start_at:start_at + window_size]
        client.send(b"".join(encode(p, client.version) for p in window))
        for _ in window:
            answer = client.read(WAIT_S)
            assert isinstance(answer, (PubAck, PubRec)), f"expected PUBACK/PUBREC, got {answer}"
            codes[answer.packet_id] = answer.reason_code
    return [codes[p.packet_id] for p in publishes]


# ----------------------------------------------------------------------------- sessions state


def test_a_bad_sessions_record_is_skipped_at_start(sluice_server, tmp_path):
    """Records with bad JSON, wrong shapes, an invalid filter, a key of another kind or none at
    all are written into %SYS%mqtt.sessions; after a restart the broker serves, logs one line
    per bad record naming its client id, and the good persistent session gets its queue."""
    server, stderr = start(sluice_server, tmp_path / "data")
    good = RawClient(server.mqtt, MQTT_5)
    assert good.connect(client_id="good", clean_start=False,
                        properties=Properties(session_expiry_interval=3600)).reason_code == 0
    good.send(Subscribe(1, (Subscription("jobs/#", 1),)))
    assert good.expect(SubAck).reason_codes == (1,)
    good.close()

    bad_records = [("s/evil-json", b"{not json"), ("s/evil-shape", b'{"expiry": "soon", "subs": 5}'),
                   ("s/evil-filter", b'{"expiry": 60, "subs": [["a/#/b", 1]]}'),
                   ("s/evil-deep", json.dumps({"expiry": 60, "subs": [["/".join("+" * 2000), 1]]}).encode()),
                   ("q/evil-qos2", b"[1, 2]"), ("x/evil-kind", b"{}")]

    async def write_state() -> None:
        config = ClientConfig(server.native, USER, PASSWORD, request_timeout=10)
        async with Producer(config, ["%SYS%mqtt.sessions", "jobs"]) as producer:
            for key, body in bad_records:
                await producer.send(Message("%SYS%mqtt.sessions", body, keys=[key]))
            await producer.send(Message("jobs", b"queued while offline",
                                        properties={"sluice.subject": "jobs/1"}))
    publisher = RawClient(server.mqtt, MQTT_311)
    assert publisher.connect(client_id="seed").reason_code == 0
    assert publish_all(publisher, [Publish("jobs/0", b"seed", 1, packet_id=1)]) == [0]
    publisher.close()
    asyncio.run(write_state())
    stop(server, stderr)

    server, stderr = start(sluice_server, tmp_path / "data")
    good = RawClient(server.mqtt, MQTT_5)
    connack = good.connect(client_id="good", clean_start=False,
                           properties=Properties(session_expiry_interval=3600))
    assert (connack.reason_code, connack.session_present) == (0, True)
    bodies = {good.expect(Publish).payload for _ in range(2)}
    assert bodies == {b"seed", b"queued while offline"}
    good.close()
    lines = stop(server, stderr).splitlines()
    for key, _ in bad_records:
        client_id = key.partition("/")[2]
        assert sum(client_id in line for line in lines) == 1, f"not one line for {key}: {lines}"


# ----------------------------------------------------------------------------- denials


LONG = 60_000
BIG_TOPICS = CONFIG + """
[mqtt]
max_topic_length = 65535
"""


def test_refused_60kb_topics_hold_no_memory_and_log_a_few_lines(sluice_server, tmp_path):
    """dave may publish only to ``devices``: 1,500 PUBLISHes and 300 SUBSCRIBEs on distinct
    60 KB topics outside it are refused (0x87), the broker's memory stays flat (no cache of
    refused names) and the log gets a line or two, each clipped, instead of 100 MB."""
    server, stderr = start(sluice_server, tmp_path / "data", BIG_TOPICS)
    admin = ["--admin", server.admin, "--user", USER, "--password", PASSWORD]
    sluice_cli("user", "create", "dave", "--new-password", "pw", *admin)
    sluice_cli("user", "grant", "dave", "topic", "devices", "publish", "subscribe", *admin)
    client = RawClient(server.mqtt, MQTT_5)
    assert client.connect(username="dave", password="pw", client_id="dave").reason_code == 0
    assert publish_all(client, [Publish(f"warmup{i}-" + "w" * LONG, b"x", 1, packet_id=i + 1)
                                for i in range(256)]) == [0x87] * 256
    before = rss_bytes(server)
    codes = publish_all(client, [Publish(f"t{i}-" + "x" * LONG, b"x", 1, packet_id=i % 60_000 + 1)
                                 for i in range(1_500)])
    assert codes == [0x87] * 1_500
    for i in range(300):
        client.send(Subscribe(i + 1, (Subscription(f"s{i}-" + "y" * LONG, 1),)))
        assert client.expect(SubAck, WAIT_S).reason_codes == (0x87,)
    assert publish_all(client, [Publish("devices/d1", b"ok", 1, packet_id=1)]) == [0]
    grown = rss_bytes(server) - before
    client.close()
    log = stop(server, stderr)
    assert grown < 40 << 20, f"the broker grew by {grown >> 20} MB for refused topics"
    denials = [line for line in log.splitlines() if "may not" in line]
    assert 1 <= len(denials) <= 4, denials
    assert len(log) < 20_000, f"{len(log)} bytes of log"


# ----------------------------------------------------------------------------- dots


def test_dot_levels_work_over_mqtt_and_legacy_dot_topics_do_not_break_the_admin_api(sluice_server, tmp_path):
    server, stderr = start(sluice_server, tmp_path / "data")
    subscriber = RawClient(server.mqtt, MQTT_5)
    assert subscriber.connect(client_id="dots-sub").reason_code == 0
    subscriber.send(Subscribe(1, (Subscription("./#", 1), Subscription("../#", 1))))
    assert subscriber.expect(SubAck).reason_codes == (1, 1)
    publisher = RawClient(server.mqtt, MQTT_5)
    assert publisher.connect(client_id="dots-pub").reason_code == 0
    assert publish_all(publisher, [Publish("./x", b"one dot", 1, packet_id=1),
                                   Publish("../x", b"two dots", 1, packet_id=2)]) == [0, 0]
    got = {}
    for _ in range(2):
        message = subscriber.expect(Publish)
        got[message.topic] = message.payload
        subscriber.send(PubAck(message.packet_id))
    assert got == {"./x": b"one dot", "../x": b"two dots"}
    status, body = admin_request(server, "GET", "/topics")
    assert status == 200 and {"%2E", "%2E%2E"} <= {t["name"] for t in json.loads(body)}
    for name in (".", "..", "..."):
        status, body = admin_request(server, "POST", "/topics", {"name": name})
        assert status == 400 and b"not dots only" in body, (name, status, body)
    subscriber.close()
    publisher.close()
    stop(server, stderr)

    metadata = MetadataRepository.for_data_dir(str(tmp_path / "data"))
    for name in (".", "..", "..."):  # as an older version accepted them
        metadata.create_topic(TopicConfig(name, queue_count=2, stored=True))
    metadata.close()
    server, stderr = start(sluice_server, tmp_path / "data")
    status, body = admin_request(server, "GET", "/metrics")
    assert status == 200 and b'sluice_topic_messages{topic="."} 0.0' in body, body[:300]
    for name in (".", "..", "..."):
        status, body = admin_request(server, "GET", "/topics/" + name.replace(".", "%2E"))
        assert status == 200, (name, status, body)
        assert json.loads(body)["name"] == name
    status, _ = admin_request(server, "DELETE", "/topics/%2E")
    assert status == 204
    stop(server, stderr)


# ----------------------------------------------------------------------------- retained limits


SMALL_RETAINED = CONFIG + """
[mqtt]
max_retained_messages = 3
max_retained_bytes = 1000
"""


def retained_topics(server: Server, version: int, topic_filter: str = "r/#") -> dict[str, bytes]:
    """What a new subscriber of ``topic_filter`` gets as retained messages: they come right
    after the SUBACK, before a live message on ``r-sync`` that ends the wait."""
    client = RawClient(server.mqtt, version)
    assert client.connect(client_id=f"probe-{version}").reason_code == 0
    client.send(Subscribe(1, (Subscription(topic_filter, 0), Subscription("r-sync", 0))))
    assert client.expect(SubAck).reason_codes == (0, 0)
    client.send(Publish("r-sync", b"end", 0))
    got = {}
    while (packet := client.expect(Publish, WAIT_S)).topic != "r-sync":
        assert packet.retain
        got[packet.topic] = packet.payload
    client.close()
    return got


def test_retained_limits_refuse_new_topics_but_never_replacements(sluice_server, tmp_path):
    server, stderr = start(sluice_server, tmp_path / "data", SMALL_RETAINED)
    v5 = RawClient(server.mqtt, MQTT_5)
    assert v5.connect(client_id="retainer").reason_code == 0
    codes = publish_all(v5, [Publish("r/1", b"a" * 100, 1, True, packet_id=1),
                             Publish("r/2", b"b" * 100, 1, True, packet_id=2),
                             Publish("r/3", b"c" * 100, 2, True, packet_id=3),
                             Publish("r/4", b"d", 1, True, packet_id=4),      # a 4th topic
                             Publish("r/5", b"e", 2, True, packet_id=5),      # QoS 2: PUBREC
                             Publish("r/1", b"A" * 900, 1, True, packet_id=6),  # replacement
                             Publish("r/2", b"", 1, True, packet_id=7),       # clear
                             Publish("r/6", b"f" * 10, 1, True, packet_id=8),   # over 1000 bytes
                             Publish("r/1", b"", 1, True, packet_id=9),       # clear
                             Publish("r/7", b"g" * 10, 1, True, packet_id=10)],
                        window_size=1)  # each answered once stored: room is freed by then
    assert codes == [0, 0, 0, 0x97, 0x97, 0, 0, 0x97, 0, 0]
    assert retained_topics(server, MQTT_5) == {"r/3": b"c" * 100, "r/7": b"g" * 10}

    listener = RawClient(server.mqtt, MQTT_311)
    assert listener.connect(client_id="listener").reason_code == 0
    listener.send(Subscribe(1, (Subscription("r/#", 1),)))
    assert listener.expect(SubAck).reason_codes == (1,)
    old = RawClient(server.mqtt, MQTT_311)  # 3.1.1 cannot be told: stored, delivered, not retained
    assert old.connect(client_id="old").reason_code == 0
    assert publish_all(old, [Publish("r/8", b"h", 1, True, packet_id=1),
                             Publish("r/9", b"i", 1, True, packet_id=2)], window_size=1) == [0, 0]
    live = set()
    while len(live) < 2:  # the retained r/3 and r/7 came first, on subscribing
        packet = listener.expect(Publish)
        if not packet.retain:
            live.add(packet.payload)
    assert live == {b"h", b"i"}
    v5.close()
    old.close()
    listener.close()
    log = stop(server, stderr)
    assert log.count("retained message on") == 2, "one line per client, then a summary"

    server, stderr = start(sluice_server, tmp_path / "data", SMALL_RETAINED)
    assert retained_topics(server, MQTT_311) == {"r/3": b"c" * 100, "r/7": b"g" * 10, "r/8": b"h"}
    again = RawClient(server.mqtt, MQTT_5)
    assert again.connect(client_id="retainer").reason_code == 0
    assert publish_all(again, [Publish("r/10", b"j", 1, True, packet_id=1)]) == [0x97]
    again.close()
    stop(server, stderr)


# ----------------------------------------------------------------------------- depth


@pytest.mark.parametrize("version, refused_filter", [(MQTT_5, 0x8F), (MQTT_311, 0x80)])
def test_filters_and_topics_deeper_than_core_allows_are_refused(sluice_server, tmp_path, version,
                                                                refused_filter):
    config = CONFIG + "\n[mqtt]\nmax_topic_levels = 65535\nmax_topic_length = 65535\n"
    server, stderr = start(sluice_server, tmp_path / "data", config)
    client = RawClient(server.mqtt, version)
    assert client.connect(client_id="deep").reason_code == 0
    client.send(Subscribe(1, (Subscription("/".join(["+"] * 5_000), 1), Subscription("deep/#", 1))))
    assert client.expect(SubAck).reason_codes == (refused_filter, 1)
    if version == MQTT_5:
        assert publish_all(client, [Publish("deep/" + "/".join(["x"] * 5_000), b"x", 1,
                                            packet_id=2)]) == [0x90]
    client.send(Publish("deep/ok", b"fine", 1, packet_id=3))
    answers = {type(packet): packet for packet in (client.read(WAIT_S), client.read(WAIT_S))}
    assert answers[PubAck].reason_code == 0  # the PUBACK and the message back, in any order
    assert (answers[Publish].topic, answers[Publish].payload) == ("deep/ok", b"fine")
    client.close()
    log = stop(server, stderr)
    assert "RecursionError" not in log and "Traceback" not in log
