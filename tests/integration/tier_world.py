"""A `sluice serve` that tiers sealed segments of 1 MiB to an object store and deletes them
locally a second later, and what the tiered-storage tests do with it: publish over MQTT and
the native SDK, wait until history has left the local disk, and read it back through every
reader (native pull, AMQP stream, `sluice consume`, the admin API's lookups).

A read is a list of ``Record``: everything a reader sees of one message, so two reads of the
same history (before and after tiering) compare equal only if nothing changed.
"""
from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import sys
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import paho.mqtt.client as mqtt
import pika
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProperties

from sluice.client import ClientConfig, Message, Producer, PullConsumer
from tests.conftest import ROOT, clean_env
from tests.integration.test_admin_api import Http
from tests.waiting import wait_for

SEGMENT = 1 << 20
USER = PASSWORD = "sluice"
TOPIC = "tiered"
STREAM = "tiered-history"
END = b"END"
"""The body of the last message published (MQTT ``tiered/end``): a reader of the stream has
read everything once it sees it."""
WAIT_S = 180


@dataclass(frozen=True)
class TierTarget:
    """Where the broker tiers to: a local directory or a bucket of the SeaweedFS fixture."""

    url: str
    s3_endpoint: str = ""
    access_key: str = ""
    secret_key: str = ""


def tier_config(target: TierTarget, *, check_interval_ms: int = 300,
                retention_max_age_ms: int = 1000, extra: str = "") -> str:
    """The broker's TOML: 1 MiB segments, local retention of ``retention_max_age_ms`` checked
    every 250 ms, tiering to ``target`` every ``check_interval_ms``, retried within a second."""
    s3 = "" if not target.s3_endpoint else (
        f's3_endpoint = "{target.s3_endpoint}"\n'
        f's3_access_key = "{target.access_key}"\ns3_secret_key = "{target.secret_key}"\n')
    return f"""
[store]
segment_size = {SEGMENT}
retention_max_age_ms = {retention_max_age_ms}
[core]
retention_check_interval_ms = 250
[auth]
default_password = "{PASSWORD}"
[tier]
url = "{target.url}"
{s3}check_interval_ms = {check_interval_ms}
retry_max_ms = 1000
{extra}
"""


def admin(server, user: str = USER, password: str = PASSWORD) -> Http:
    return Http(server.admin, user, password)


def tier_status(server) -> dict[str, Any]:
    """``GET /tier`` as the admin (``tiered_end`` and the counts appear once the tierer
    has opened the tier)."""
    status, body, _ = admin(server)("GET", "/tier")
    assert status == 200, (status, body)
    return body


def local_segments(data_dir: Path) -> list[int]:
    """Base offsets of the commit-log segments on the local disk, oldest first."""
    folder = data_dir / "commitlog"
    return sorted(int(name) for name in os.listdir(folder) if name.isdigit())


def wait_history_tiered(server, data_dir: Path, at_least: int) -> int:
    """Wait until at least ``at_least`` bytes of the log are tiered and every tiered segment
    has been deleted locally; return the tiered end (a log offset)."""
    def done() -> int | None:
        tiered_end = tier_status(server).get("tiered_end", 0)
        oldest = local_segments(data_dir)[0]
        return tiered_end if tiered_end >= at_least and oldest >= tiered_end else None
    return wait_for(done, f"{at_least} bytes tiered and deleted locally", WAIT_S,
                    seen=lambda: (tier_status(server), local_segments(data_dir)))


def create_topic(server, name: str = TOPIC, queues: int = 2) -> None:
    status, body, _ = admin(server)("POST", "/topics", {"name": name, "queue_count": queues})
    assert status == 201, body


# ------------------------------------------------------------------------------ publishing

class Published(NamedTuple):
    """What the publishers sent: every body once, and the native sends' ids and keys."""

    mqtt: dict[bytes, str]
    """body -> the ``seq`` user property it was published with"""
    native: dict[bytes, tuple[str, str]]
    """body -> (msg_id, key)"""
    packed: dict[str, list[bytes]]
    """msg_id -> the bodies packed in that one record"""

    def bodies(self) -> list[bytes]:
        return [*self.mqtt, *self.native, *(b for bodies in self.packed.values() for b in bodies)]


def body(kind: str, n: int, size: int = 1000) -> bytes:
    """A unique body of ``size`` bytes, binary after its readable head."""
    head = f"{kind}-{n}-".encode()
    return head + bytes((n * 7 + i) % 256 for i in range(size - len(head)))


def publish_mqtt(server, count: int, *, client_id: str = "tier-writer",
                 first: int = 0) -> dict[bytes, str]:
    """``count`` MQTT 5 QoS 1 publishes to ``tiered/dev<N>/reading`` with a user property,
    all acknowledged; numbered from ``first`` (bodies are unique per number)."""
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5)
    client.username_pw_set(USER, PASSWORD)
    client.max_inflight_messages_set(64)
    host, port = server.mqtt.rsplit(":", 1)
    client.connect(host, int(port))
    client.loop_start()
    sent, infos = {}, []
    try:
        for n in range(first, first + count):
            properties = PahoProperties(PacketTypes.PUBLISH)
            properties.UserProperty = [("seq", str(n))]
            payload = body("mqtt", n)
            infos.append(client.publish(f"{TOPIC}/dev{n % 4}/reading", payload, 1,
                                        properties=properties))
            sent[payload] = str(n)
        for info in infos:
            info.wait_for_publish(WAIT_S)
            assert info.is_published(), "an MQTT publish was not acknowledged"
    finally:
        client.disconnect()
        client.loop_stop()
    return sent


def publish_end(server) -> None:
    """The end marker, last: MQTT ``tiered/end``, QoS 1."""
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="tier-end", protocol=mqtt.MQTTv5)
    client.username_pw_set(USER, PASSWORD)
    host, port = server.mqtt.rsplit(":", 1)
    client.connect(host, int(port))
    client.loop_start()
    try:
        info = client.publish(f"{TOPIC}/end", END, 1)
        info.wait_for_publish(WAIT_S)
        assert info.is_published()
    finally:
        client.disconnect()
        client.loop_stop()


def publish_native(server, count: int, packs: int = 0) -> tuple[dict[bytes, tuple[str, str]],
                                                                 dict[str, list[bytes]]]:
    """``count`` native sends with a unique key, the shared key ``all``, a tag and properties,
    and ``packs`` packed records of 25 bodies each."""
    async def send() -> tuple[dict, dict]:
        config = ClientConfig(server.native, USER, PASSWORD, request_timeout=30)
        async with Producer(config, [TOPIC]) as producer:
            async def one(n: int) -> tuple[bytes, str, str]:
                payload = body("native", n)
                receipt = await producer.send(Message(
                    TOPIC, payload, tag="native", keys=[f"key-{n}", "all"],
                    properties={"seq": str(n), "sluice.subject": f"{TOPIC}/native/{n % 3}"}))
                return payload, receipt.message_id, f"key-{n}"
            sent = {}
            for start in range(0, count, 64):
                for payload, msg_id, key in await asyncio.gather(
                        *(one(n) for n in range(start, min(count, start + 64)))):
                    sent[payload] = (msg_id, key)
            packed = {}
            for p in range(packs):
                bodies = [body(f"packed{p}", i, 200) for i in range(25)]
                receipt = await producer.send_packed(TOPIC, bodies, tag="packed",
                                                     properties={"pack": str(p)})
                packed[receipt.message_id] = bodies
            return sent, packed
    return asyncio.run(send())


# ------------------------------------------------------------------------------ reading

class Record(NamedTuple):
    """Everything a native reader sees of one message (one body of a packed record)."""

    queue_id: int
    offset: int
    batch_index: int
    msg_id: str
    body: bytes
    tag: str
    keys: tuple[str, ...]
    properties: tuple[tuple[str, str], ...]
    born_ts: int
    store_ts: int


def read_native(server, expected: int, start_from: str | int = "earliest",
                group: str = "tier-readers") -> list[Record]:
    """Pull ``TOPIC`` from ``start_from`` until ``expected`` bodies came, then once more to see
    that nothing follows; every record in (queue, offset, batch index) order."""
    async def pull() -> list[Record]:
        config = ClientConfig(server.native, USER, PASSWORD, request_timeout=30)
        got: list[Record] = []
        async with PullConsumer(config, group, [TOPIC], start_from=start_from,
                                auto_commit_interval=None, batch_size=256) as consumer:
            async with asyncio.timeout(WAIT_S):
                while len(got) < expected:
                    got += [record(m) for m in await consumer.pull(256, timeout=2)]
            got += [record(m) for m in await consumer.pull(256, timeout=1)]
        return sorted(got)
    return asyncio.run(pull())


def record(m: Any) -> Record:
    return Record(m.queue_id, m.offset, m.batch_index, m.message_id, m.body, m.tag,
                  tuple(m.keys), tuple(sorted(m.properties.items())), m.born_timestamp,
                  m.store_timestamp)


def read_cli(server, expected: int) -> list[dict[str, Any]]:
    """`sluice consume TOPIC --earliest --json --count N`: one JSON object per message."""
    done = subprocess.run(
        [sys.executable, "-m", "sluice.cli", "consume", TOPIC, "--earliest", "--json",
         "--count", str(expected), "--wait", "60", "--server", server.native,
         "--user", USER, "--password", PASSWORD],
        cwd=ROOT, capture_output=True, text=True, timeout=WAIT_S, env=clean_env())
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def declare_stream(server, user: str = USER, password: str = PASSWORD, vhost: str = "/",
                   name: str = STREAM, binding: str = f"{TOPIC}.#") -> None:
    """A durable stream queue bound to ``amq.topic`` with ``binding``."""
    with amqp_connection(server, user, password, vhost) as connection:
        channel = connection.channel()
        channel.queue_declare(name, durable=True, arguments={"x-queue-type": "stream"})
        channel.queue_bind(name, "amq.topic", binding)


def amqp_connection(server, user: str = USER, password: str = PASSWORD,
                    vhost: str = "/") -> pika.BlockingConnection:
    host, port = server.amqp.rsplit(":", 1)
    return pika.BlockingConnection(pika.ConnectionParameters(
        host, int(port), vhost, pika.PlainCredentials(user, password), connection_attempts=1,
        socket_timeout=30, blocked_connection_timeout=60))


class StreamRecord(NamedTuple):
    """What an AMQP stream consumer sees of one delivery."""

    offset: int
    routing_key: str
    body: bytes
    headers: tuple[tuple[str, str], ...]
    message_id: str | None
    timestamp: int | None


def read_stream(server, start: object = "first", name: str = STREAM,
                user: str = USER, password: str = PASSWORD, vhost: str = "/") -> list[StreamRecord]:
    """Consume stream ``name`` from ``x-stream-offset`` ``start`` up to the end marker."""
    got: list[StreamRecord] = []
    with amqp_connection(server, user, password, vhost) as connection:
        channel = connection.channel()
        channel.basic_qos(prefetch_count=500)
        for method, properties, payload in channel.consume(
                name, arguments={"x-stream-offset": start}, inactivity_timeout=WAIT_S):
            assert method is not None, f"the stream stopped after {len(got)} deliveries"
            headers = dict(properties.headers or {})
            offset = headers.pop("x-stream-offset")
            got.append(StreamRecord(offset, method.routing_key, payload,
                                    tuple(sorted((k, repr(v)) for k, v in headers.items())),
                                    properties.message_id, properties.timestamp))
            channel.basic_ack(method.delivery_tag)
            if payload == END:
                break
        channel.cancel()
    return got


def lookup_id(server, msg_id: str, http: Http | None = None) -> tuple[int, Any]:
    status, found, _ = (http or admin(server))("GET", f"/messages/{msg_id}?topic={TOPIC}")
    return status, found


def lookup_key(server, key: str, http: Http | None = None) -> list[dict[str, Any]]:
    """Every page of ``GET /topics/TOPIC/messages?key=``, following the Link headers."""
    http = http or admin(server)
    path = f"/topics/{TOPIC}/messages?key={urllib.parse.quote(key)}&limit=1000"
    found: list[dict[str, Any]] = []
    while path:
        status, page, headers = http("GET", path)
        assert status == 200, page
        found += page
        link = headers.get("Link", "")  # <URL>; rel="next", URL under the admin API's root
        url = link[1:link.index(">")] if link else ""
        path = url[url.index("/topics/"):] if url else ""
    return found


def api_body(message: dict[str, Any]) -> bytes:
    return base64.b64decode(message["body_base64"])
