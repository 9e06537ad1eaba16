"""Three real `sluice serve` nodes on 127.0.0.2-4 and a real etcd, under confirmed load from MQTT
QoS 1, AMQP with publisher confirms and native sends, for each fault a machine can have: the
leader killed, a follower killed and brought back, the leader frozen past its lease, the leader
cut off from etcd and the other nodes, two of three killed. Each ends with every node stopped and
its commit-log files read directly: no confirmed message lost, every node with the same messages
(no two epochs confirmed divergent histories), duplicates counted."""
from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request

import pika
import pytest
from pika.adapters.utils.connection_workflow import AMQPConnectorException

from bench.cluster_load import Load, Partition, cluster_view, finish, in_sync, leader_of, wait_for
from bench.processes import free_ports
from sluice.cli.dev_cluster import DevCluster, Ports
from sluice.client import ClientConfig, Message, SluiceClientError, SyncProducer, SyncSimpleConsumer

BATCH = 30
"""Confirmed messages per producer between one step and the next."""


@pytest.fixture
def group(tmp_path, etcd_installed):
    native, admin, mqtt, ws, amqp, replication, etcd_client, etcd_peer = free_ports(8)
    cluster = DevCluster(tmp_path / "group", ports=Ports(native, admin, mqtt, ws, amqp, replication),
                         etcd_ports=(etcd_client, etcd_peer), etcd_host_per_node=12,
                         extra_env={"SLUICE_STORE_SEGMENT_SIZE": str(8 << 20)})
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.kill_all()


def test_the_leader_killed_under_load_hands_over_without_losing_a_confirmed_message(group):
    load = Load(group)
    load.start()
    load.wait_more(BATCH)
    old = leader_of(group)
    old.kill()
    new = leader_of(group, skip=(old,))
    assert new is not old
    load.wait_more(BATCH)  # every protocol carries on through the surviving nodes
    old.start()  # it comes back as a follower, cut back to the new leader's history
    old.wait_ready()
    load.wait_more(BATCH)
    finish(group, load)


def test_a_follower_killed_and_brought_back_catches_up_and_rejoins(group):
    load = Load(group)
    load.start()
    load.wait_more(BATCH)
    leader = leader_of(group)
    follower = next(node for node in group.nodes if node is not leader)
    follower.kill()
    wait_for("the dead follower out of the in-sync set",
             lambda: (view := cluster_view(group)) and follower.name not in view["isr"])
    load.wait_more(BATCH)  # two of three still make min_insync 2
    follower.start()
    follower.wait_ready()
    in_sync(group, {node.name for node in group.nodes})
    load.wait_more(BATCH)
    assert leader_of(group) is leader, "a follower's death and return moves no leadership"
    finish(group, load)


def test_a_leader_frozen_past_its_lease_confirms_nothing_when_it_wakes(group):
    load = Load(group)
    load.start()
    load.wait_more(BATCH)
    old = leader_of(group)
    old.signal(signal.SIGSTOP)
    try:
        leader_of(group, skip=(old,))
        load.wait_more(BATCH)
    finally:
        old.signal(signal.SIGCONT)
    # it wakes past its lease deadline: it must not confirm what its clients sent meanwhile, and
    # steps down, rejoining as a follower cut back to the new leader's history
    wait_for("the woken leader to follow", lambda: (view := cluster_view(group)) and old.name in view["isr"])
    load.wait_more(BATCH)
    finish(group, load)


def test_a_leader_cut_off_from_etcd_and_its_followers_is_replaced_and_rejoins_when_healed(group):
    if shutil.which("nft") is None or os.geteuid() != 0:
        if os.environ.get("CI"):
            pytest.fail("the partition test needs nftables and root (CI installs nftables: .ci/run)")
        pytest.skip("needs nftables (apt-get install -y nftables) and root")
    load = Load(group)
    load.start()
    load.wait_more(BATCH)
    old = leader_of(group)
    partition = Partition(old)
    partition.cut()
    try:
        new = leader_of(group, skip=(old,))
        assert new is not old
        load.wait_more(BATCH)
    finally:
        partition.heal()
    wait_for("the cut-off leader to rejoin", lambda: (view := cluster_view(group)) and old.name in view["isr"])
    load.wait_more(BATCH)
    finish(group, load)


def test_with_two_of_three_killed_publishes_are_refused_until_one_comes_back(group):
    load = Load(group)
    load.start()
    load.wait_more(BATCH)
    leader = leader_of(group)
    killed = [node for node in group.nodes if node is not leader]
    for node in killed:
        node.kill()
    view = wait_for("the in-sync set down to the leader, refusing publishes",
                    lambda: (v := cluster_view(group)) and v["isr"] == [leader.name] and v["refusal"] and v)
    assert "min_insync" in view["refusal"]
    before = load.counts()
    # nothing more is confirmed while only one replica holds it: each producer keeps trying
    # and is refused (a failed attempt each), not acknowledged
    failures = {p.protocol: p.failures for p in load.producers}
    wait_for("every producer refused", lambda: all(p.failures > failures[p.protocol] for p in load.producers))
    assert load.counts() == before, f"confirmed with one replica in sync: {before} -> {load.counts()}"
    killed[0].start()
    killed[0].wait_ready()
    load.wait_more(BATCH)  # two in sync again: publishes are taken
    killed[1].start()
    killed[1].wait_ready()
    finish(group, load)


def test_every_node_reports_the_group_and_a_follower_relays_the_admin_api(group):
    leader = leader_of(group)
    follower = next(node for node in group.nodes if node is not leader)
    in_sync(group, {node.name for node in group.nodes})
    admin = f"http://{follower.host}:{group.ports.admin}"
    status = json.loads(_sluice("cluster", "status", "--admin", admin, "--json"))
    assert status["leader"] == leader.name and status["epoch"] > 0
    assert sorted(status["isr"]) == sorted(node.name for node in group.nodes)
    roles = {node["id"]: (node["role"], node["address"]) for node in status["nodes"]}
    assert roles == {node.name: ("leader" if node is leader else "follower", node.host) for node in group.nodes}
    health = _get_json(f"{admin}/health")
    assert health["cluster"] == health["cluster"] | {"node": follower.name, "role": "follower", "leader": leader.name}
    leader_health = _get_json(f"http://{leader.host}:{group.ports.admin}/health")
    assert leader_health["cluster"]["role"] == "leader" and leader_health["status"] == "ok"
    follower_metrics = _get_text(f"{admin}/metrics")
    assert f'sluice_cluster_leader{{node="{follower.name}"}} 0.0' in follower_metrics
    leader_metrics = _get_text(f"http://{leader.host}:{group.ports.admin}/metrics")
    assert f'sluice_cluster_in_sync_replicas{{node="{leader.name}"}} 3.0' in leader_metrics
    assert f'sluice_cluster_replica_lag_bytes{{node="{leader.name}",replica="{follower.name}"}}' in leader_metrics
    # any other admin request through the follower reaches the leader, logged in as anywhere
    assert "load-native" not in _sluice("topic", "list", "--admin", admin)
    _sluice("topic", "create", "made-through-a-follower", "--admin", admin)
    assert "made-through-a-follower" in _sluice("topic", "list", "--admin", f"http://{leader.host}:{group.ports.admin}")


def _sluice(*arguments: str) -> str:
    done = subprocess.run([sys.executable, "-m", "sluice.cli", *arguments, "--user", "sluice", "--password", "sluice"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _get_json(url: str) -> dict:
    return json.loads(_get_text(url))


def _get_text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as reply:
        return reply.read().decode()


def test_a_consumer_group_resumes_on_the_new_leader_without_what_it_acked_before(group):
    """Consumer offsets are in the replicated log: after the leader dies, a group gets the rest,
    and nothing it acknowledged before its offsets were stored comes back."""
    endpoints = ",".join(f"{node.host}:{group.ports.native}" for node in group.nodes)
    config = ClientConfig(endpoints, "sluice", "sluice", request_timeout=10, reconnect_timeout=60)
    with SyncProducer(config) as producer:
        for number in range(60):
            producer.send(Message("resume", f"m-{number:03d}".encode()))
    early = _consume(config, 30)
    stored = _stored_offsets(group, "resume-group")
    wait_for("the group's 30 acks stored in the log", lambda: stored() >= 30)
    leader = leader_of(group)
    leader.kill()
    leader_of(group, skip=(leader,))
    rest = _consume(config, 30, deadline_s=120)
    assert not early & rest, f"acked before the failover and delivered again: {sorted(early & rest)}"
    assert early | rest == {f"m-{number:03d}" for number in range(60)}


def _consume(config: ClientConfig, count: int, deadline_s: float = 60) -> set[str]:
    """Receive and ack until ``count`` distinct messages came; their bodies."""
    got: set[str] = set()
    deadline = time.monotonic() + deadline_s
    while len(got) < count:
        assert time.monotonic() < deadline, f"only {len(got)} of {count} messages in time"
        try:
            with SyncSimpleConsumer(config, "resume-group", {"resume": "*"}, await_duration=2) as consumer:
                while len(got) < count and time.monotonic() < deadline:
                    for message in consumer.receive(max_messages=min(8, count - len(got))):
                        consumer.ack(message)
                        got.add(message.body.decode())
        except SluiceClientError:
            continue  # the node went away: another one
    return got


def _internal_records(group: DevCluster, topic: str, query: str) -> list[dict]:
    """The records of an internal topic a confirmed read through a live node's admin API finds
    (none while no node answers)."""
    node = next(n for n in group.nodes if n.alive)
    request = urllib.request.Request(
        f"http://{node.host}:{group.ports.admin}/topics/%25SYS%25{topic}/messages?{query}",
        headers={"Authorization": "Basic " + base64.b64encode(b"sluice:sluice").decode()})
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return json.load(reply)
    except OSError:
        return []


def _stored_offsets(group: DevCluster, consumer: str):
    """A probe: how many messages the consumer's newest offsets record in the log accounts for."""
    def count() -> int:
        found = _internal_records(group, "offsets", f"key={consumer}&limit=1")
        if not found or not found[0]["body_text"]:
            return 0
        queues = json.loads(found[0]["body_text"]).get("resume", {})
        return sum(committed + len(acked) for committed, acked, _ in queues.values())
    return count


def test_users_and_definitions_made_on_the_leader_are_on_the_next_one(group):
    """The metadata database is replicated through the log: a user, its permissions and a
    durable AMQP queue made through any node exist on the node that leads after a failover."""
    follower_admin = f"http://{next(n for n in group.nodes if n is not leader_of(group)).host}:{group.ports.admin}"
    _sluice("user", "create", "carol", "--new-password", "carol-pw-1", "--superuser", "--admin", follower_admin)
    _sluice("user", "grant", "carol", "topic", "carol-*", "publish", "subscribe", "--admin", follower_admin)
    hosts = [node.host for node in group.nodes]
    _with_amqp(group, hosts, lambda channel: channel.queue_declare("carol-jobs", durable=True))
    leader = leader_of(group)
    leader.kill()
    leader_of(group, skip=(leader,))
    survivors = [node.host for node in group.nodes if node is not leader]
    # carol logs in on the new leader, her queue is there (passive: no declaring it again)
    _with_amqp(group, survivors, lambda channel: channel.queue_declare("carol-jobs", passive=True))
    permissions = _sluice("user", "permissions", "carol", "--admin", f"http://{survivors[0]}:{group.ports.admin}")
    assert "carol-*" in permissions


def _amqp_connection(group: DevCluster, hosts: list[str], user: str, password: str) -> pika.BlockingConnection:
    """A connection through the first of ``hosts`` that takes it, once a leader serves."""
    credentials = pika.PlainCredentials(user, password)
    deadline = time.monotonic() + 60
    while True:
        try:
            return pika.BlockingConnection([pika.ConnectionParameters(host, group.ports.amqp, credentials=credentials)
                                            for host in hosts])
        except (pika.exceptions.AMQPConnectionError, AMQPConnectorException):  # no leader serving yet
            assert time.monotonic() < deadline, f"{user} could not log in"


def _with_amqp(group: DevCluster, hosts: list[str], use) -> None:
    connection = _amqp_connection(group, hosts, "carol", "carol-pw-1")
    try:
        use(connection.channel())
    finally:
        connection.close()


def test_messages_delivered_and_not_acked_come_back_redelivered_from_the_next_leader(group):
    """AMQP's delivered marks are in the replicated log: what the old leader handed a consumer
    that never acked comes back from the new leader with ``redelivered`` set, the rest without."""
    hosts = [node.host for node in group.nodes]
    connection = _amqp_connection(group, hosts, "sluice", "sluice")
    channel = connection.channel()
    channel.confirm_delivery()
    channel.queue_declare("redo", durable=True)
    for number in range(5):
        channel.basic_publish("", "redo", f"r-{number}".encode(), pika.BasicProperties(delivery_mode=2))
    channel.basic_qos(prefetch_count=3)
    taken = [channel.basic_get("redo")[0] for _ in range(3)]
    assert [frame.redelivered for frame in taken] == [False] * 3
    marked = _delivered_marks(group)
    wait_for("the delivered mark confirmed by the group", lambda: marked() >= 3)
    leader = leader_of(group)
    leader.kill()  # the consumer never acked
    leader_of(group, skip=(leader,))
    survivors = [node.host for node in group.nodes if node is not leader]
    again = _amqp_connection(group, survivors, "sluice", "sluice")
    try:
        channel = again.channel()
        got = []
        while len(got) < 5:
            method, _, body = channel.basic_get("redo", auto_ack=True)
            assert method is not None, f"only {len(got)} of 5 messages came back"
            got.append((body.decode(), method.redelivered))
    finally:
        again.close()
    assert sorted(got) == [("r-0", True), ("r-1", True), ("r-2", True), ("r-3", False), ("r-4", False)]


def _delivered_marks(group: DevCluster):
    """A probe: the highest delivered mark any queue has in the log, as a confirmed read sees it."""
    def highest() -> int:
        found = _internal_records(group, "delivered", f"from=0&to={1 << 50}&limit=50")
        return max((int(m["body_text"]) for m in found if m.get("body_text")), default=0)
    return highest
