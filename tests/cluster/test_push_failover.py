"""Push subscriptions and API tokens on a replica group of three real `sluice serve` nodes and a
real etcd: made through a follower, they are in every node's metadata (the signing secret
encrypted under the group's master key); only the leader pushes; after the leader is killed
(SIGKILL) mid-stream the new leader pushes on from the subscription's acknowledged position,
signing with the original secret, and a bearer token made before the failover still publishes
through a follower's HTTP ingress.

The receiver answers the first ``ANSWERED`` requests, then holds every further one unanswered
until the old leader is dead, so at the kill exactly ``CONCURRENCY`` requests are in flight and
the group's stored position covers every answered one: the repeats are at most those.
"""
from __future__ import annotations

import asyncio
import base64
import json
import os
import socket
import sqlite3
import threading
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

import pytest
from aiohttp import web
from cryptography.fernet import Fernet
from standardwebhooks import Webhook

from bench.cluster_load import MqttProducer, in_sync, leader_of, wait_for
from bench.processes import free_ports
from sluice.cli.dev_cluster import DEV_SECRET, DevCluster, NodeProcess, Ports
from sluice.cluster.metadata_sync import group_master_key
from tests.integration.push_receiver import Receiver, Seen

ANSWERED = 30
CONCURRENCY = 4
MORE_AFTER_FAILOVER = 30
"""MQTT events confirmed after the new leader serves, before the publisher stops."""
HTTP_EVENTS = 5
"""Events sent through a follower's HTTP ingress before the failover, and again after it."""
PACE_S = 0.02
"""The publisher's pause between events, so the test pushes hundreds of events, not thousands."""
BASIC = "Basic " + base64.b64encode(b"sluice:sluice").decode()
ENV = {"SLUICE_PUSH_ALLOWED_SINKS": "127.0.0.0/8", "SLUICE_CORE_OFFSET_COMMIT_INTERVAL_MS": "100",
       "SLUICE_STORE_SEGMENT_SIZE": str(8 << 20)}


@pytest.fixture
def group(tmp_path, etcd_installed):
    native, admin, mqtt, ws, amqp, replication, etcd_client, etcd_peer = free_ports(8)
    cluster = DevCluster(tmp_path / "group", ports=Ports(native, admin, mqtt, ws, amqp, replication),
                         etcd_ports=(etcd_client, etcd_peer), extra_env=ENV)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.kill_all()


class Gate:
    """Answers the first ``ANSWERED`` requests, holds the rest until opened, then answers all;
    records which node process sent each request."""

    def __init__(self, group: DevCluster) -> None:
        self.group = group
        self.port = 0
        """The receiver's port (set once it listens)."""
        self.answered = self.held = 0
        self.opened = threading.Event()
        self.senders: Counter[str] = Counter()
        self._lock = threading.Lock()

    async def __call__(self, seen: Seen, _: int) -> web.StreamResponse:
        sender = self._sender(seen)
        with self._lock:
            self.senders[sender] += 1
            take = self.opened.is_set() or self.answered < ANSWERED
            if take:
                self.answered += 1
            else:
                self.held += 1
        if not take:
            await asyncio.to_thread(self.opened.wait)
            return web.Response(status=503)  # its sender is dead by now: nobody reads this
        return web.Response(status=204)

    def _sender(self, seen: Seen) -> str:
        """The node whose process holds the sending end of ``seen``'s connection."""
        inode = _socket_inode(seen.peer, self.port) if seen.peer else None
        for node in self.group.nodes:
            if inode and node.alive and _holds_socket(node.process.pid, inode):
                return node.name
        return f"not a node ({seen.peer})"


def test_push_resumes_on_the_new_leader_signed_with_the_original_secret(group):
    gate = Gate(group)
    receiver = Receiver(gate)
    gate.port = receiver.port
    publisher = PacedMqttProducer(group)
    try:
        old = leader_of(group)
        in_sync(group, {node.name for node in group.nodes})
        follower = next(node for node in group.nodes if node is not old)
        # made through a follower: it relays the admin API to the leader
        token = _admin(group, follower, "POST", "/users/sluice/tokens", {})["token"]
        created = _admin(group, follower, "POST", "/push-subscriptions", {
            "name": "hook", "topic": "load", "sink": receiver.url, "concurrency": CONCURRENCY,
            "timeout_ms": 60_000})
        secret = created["secret"]
        for node in group.nodes:  # every node's database has them, the secret readable by any
            wait_for(f"the subscription and the token in {node.name}'s metadata",
                     lambda node=node: _replicated(node, secret, token))

        publisher.start()
        http_ids = _ingress(group, follower, token, "before", HTTP_EVENTS)
        wait_for("every worker holding a request", lambda: gate.held >= CONCURRENCY)
        assert gate.answered == ANSWERED
        wait_for("the answered events' acknowledgements stored in the log",
                 lambda: _acked(group, old) >= ANSWERED)
        assert set(gate.senders) == {old.name}, f"requests from others than the leader: {gate.senders}"

        old.kill()  # SIGKILL with CONCURRENCY requests unanswered; the publisher carries on
        gate.opened.set()
        new = leader_of(group, skip=(old,))
        assert new is not old
        survivor = next(node for node in group.nodes if node not in (old, new))
        http_ids += _ingress(group, survivor, token, "after", HTTP_EVENTS)
        publisher.wait_confirmed(publisher.count() + MORE_AFTER_FAILOVER)
        confirmed = publisher.stop_and_join()

        expected = {f"mqtt-{n:07d}".encode() for n in confirmed} | set(http_ids)
        seen = lambda: Counter(s.body for s in receiver.seen)  # noqa: E731
        try:
            wait_for("every confirmed event at the receiver", lambda: expected <= set(seen()))
        except AssertionError:
            raise AssertionError(f"missing at the receiver: {sorted(expected - set(seen()))[:20]} "
                                 f"({len(expected - set(seen()))} of {len(expected)}); senders "
                                 f"{gate.senders}; the new leader's view: "
                                 f"{_admin(group, new, 'GET', '/push-subscriptions/hook')['stats']}, "
                                 f"{_admin(group, new, 'GET', '/groups/%25PUSH%25hook')['lag']}") from None
        for request in receiver.seen:  # the new leader signs with the secret it read from the journal
            Webhook(secret).verify(request.body, request.headers, json_parse=False)
        # a stored message pushed again carries its webhook-id again (a second copy a publisher
        # sent when its PUBACK was lost in the failover is another message, with its own id)
        pushes = Counter(request.headers["webhook-id"] for request in receiver.seen)
        repeated = {webhook_id: n for webhook_id, n in pushes.items() if n > 1}
        assert len(repeated) <= CONCURRENCY and max(repeated.values(), default=1) <= 2, f"repeated: {repeated}"
        assert set(gate.senders) == {old.name, new.name}, f"requests from others than a leader: {gate.senders}"
        shown = _admin(group, survivor, "GET", "/push-subscriptions/hook", bearer=token)
        assert shown["stats"]["state"] == "running" and shown["stats"]["delivered"] > 0, shown
    finally:
        publisher.stop_and_join()
        gate.opened.set()
        receiver.stop()


class PacedMqttProducer(MqttProducer):
    """The failover tests' MQTT producer (QoS 1 through every node in turn, a message counted
    once PUBACKed), publishing to topic ``load`` at a bounded pace."""

    def sending(self) -> None:
        self.stopping.wait(PACE_S)
        super().sending()

    def stop_and_join(self) -> set[int]:
        self.stopping.set()
        if self.is_alive():
            self.join(120)
        return set(self.confirmed)


def _request(group: DevCluster, node: NodeProcess, method: str, path: str, body: bytes | None,
             headers: dict[str, str]) -> tuple[int, bytes]:
    """One admin request to ``node``, repeated while the node cannot relay it (no leader yet:
    it closes the connection) or the leader is not ready (503)."""
    url = f"http://{node.host}:{group.ports.admin}{path}"

    def attempt() -> tuple[int, bytes] | None:
        request = urllib.request.Request(url, data=body, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=30) as reply:
                return reply.status, reply.read()
        except urllib.error.HTTPError as error:
            return None if error.code in (502, 503) else (error.code, error.read())
        except OSError:
            return None
    return wait_for(f"{method} {path} answered through {node.name}", attempt)


def _admin(group: DevCluster, node: NodeProcess, method: str, path: str, body: dict | None = None,
           bearer: str = "") -> dict:
    status, data = _request(group, node, method, path, json.dumps(body).encode() if body is not None else None,
                            {"Content-Type": "application/json",
                             "Authorization": f"Bearer {bearer}" if bearer else BASIC})
    assert status in (200, 201), (status, data)
    return json.loads(data)


def _ingress(group: DevCluster, node: NodeProcess, token: str, tag: str, count: int) -> list[bytes]:
    """POST ``count`` binary-mode CloudEvents to ``/events/load/http`` on ``node`` with the bearer
    token, each acknowledged (202); their data."""
    sent = []
    for n in range(count):
        data = f"http-{tag}-{n}".encode()
        status, answer = _request(group, node, "POST", "/events/load/http", data, {
            "Authorization": f"Bearer {token}", "Content-Type": "text/plain", "ce-specversion": "1.0",
            "ce-id": f"{tag}-{n}", "ce-source": "/tests/push-failover", "ce-type": "test.event"})
        assert status == 202, (status, answer)
        sent.append(data)
    return sent


def _replicated(node: NodeProcess, secret: str, token: str) -> bool:
    """Whether ``node``'s own metadata database has push subscription ``hook`` with ``secret``
    encrypted under the group's master key, and the API token's id."""
    path = Path(node.data_dir) / "metadata.db"
    if not path.exists():
        return False
    connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
    try:
        row = connection.execute("SELECT secret FROM push_subscriptions WHERE name = 'hook'").fetchone()
        has_token = connection.execute("SELECT 1 FROM user_tokens WHERE id = ? AND user_name = 'sluice'",
                                       (token.split("_")[1],)).fetchone()
    except sqlite3.OperationalError:  # locked by a write this moment
        return False
    finally:
        connection.close()
    if row is None or has_token is None:
        return False
    assert Fernet(group_master_key(DEV_SECRET)).decrypt(row[0].encode()).decode() == secret
    return True


def _acked(group: DevCluster, node: NodeProcess) -> int:
    """How many of topic ``load``'s messages the newest confirmed offsets record of the
    subscription's group counts as acknowledged, read through ``node``."""
    request = urllib.request.Request(
        f"http://{node.host}:{group.ports.admin}/topics/%25SYS%25offsets/messages?key=%25PUSH%25hook&limit=1",
        headers={"Authorization": BASIC})
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            found = json.load(reply)
    except OSError:
        return 0
    if not found or not found[0]["body_text"]:
        return 0
    queues = json.loads(found[0]["body_text"]).get("load", {})
    return sum(committed + len(acked) for committed, acked, _ in queues.values())


def _socket_inode(peer: tuple[str, int], port: int) -> str | None:
    """The inode of the TCP socket whose local end is ``peer`` and remote end ``port`` on
    127.0.0.1 (the sender's end of a connection to the receiver)."""
    local = f"{socket.inet_aton(peer[0])[::-1].hex().upper()}:{peer[1]:04X}"
    remote = f"0100007F:{port:04X}"
    with open("/proc/net/tcp") as table:
        for line in table.readlines()[1:]:
            fields = line.split()
            if fields[1] == local and fields[2] == remote:
                return fields[9]
    return None


def _holds_socket(pid: int, inode: str) -> bool:
    wanted = f"socket:[{inode}]"
    try:
        descriptors = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in descriptors:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") == wanted:
                return True
        except OSError:
            continue
    return False


def test_a_follower_with_no_leader_answers_ingress_with_503_saying_so(tmp_path, etcd_installed):
    """A node of a group that has no leader (here: its etcd is not running) refuses an event
    with a clear 503 instead of dropping the connection."""
    native, admin, mqtt, ws, amqp, replication, etcd_client, etcd_peer = free_ports(8)
    cluster = DevCluster(tmp_path / "group", count=1, ports=Ports(native, admin, mqtt, ws, amqp, replication),
                         etcd_ports=(etcd_client, etcd_peer), extra_env=ENV)
    node = cluster.nodes[0]
    cluster.directory.mkdir(parents=True)
    node.start()  # and no etcd
    try:
        node.wait_ready()
        request = urllib.request.Request(
            f"http://{node.host}:{admin}/events/load/http", data=b"x", method="POST",
            headers={"Authorization": BASIC, "Content-Type": "text/plain", "ce-specversion": "1.0",
                     "ce-id": "1", "ce-source": "/tests", "ce-type": "test.event"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=30)
        assert refused.value.code == 503 and refused.value.headers["Retry-After"]
        answer = json.load(refused.value)
        assert answer["error"] == "no_leader" and answer["leader"] is None
        assert "no leader" in answer["message"] and "send it again" in answer["message"]
    finally:
        node.kill()
