"""A node that lost its disk rejoins after retention deleted the start of the group's log: the
leader sends it a snapshot (queues at the leader's offsets, compacted copies, the metadata
database), it catches up from the log start, and once it leads it serves what only the
snapshot had: a user made early on, and a retained MQTT message from the deleted segments."""
from __future__ import annotations

import shutil
import subprocess
import sys
import urllib.request

import paho.mqtt.client as mqtt
import pytest

from bench.cluster_load import cluster_view, leader_of, wait_for
from bench.processes import free_ports
from sluice.cli.dev_cluster import DevCluster, NodeProcess, Ports
from sluice.client import ClientConfig, Message, SyncProducer
from tests.cluster.test_group_failover import _amqp_connection

SEGMENT = 1 << 20
BODY = b"x" * (60 << 10)


@pytest.fixture
def group(tmp_path, etcd_installed):
    native, admin, mqtt_port, ws, amqp, replication, etcd_client, etcd_peer = free_ports(8)
    cluster = DevCluster(tmp_path / "group", ports=Ports(native, admin, mqtt_port, ws, amqp, replication),
                         etcd_ports=(etcd_client, etcd_peer),
                         extra_env={"SLUICE_STORE_SEGMENT_SIZE": str(SEGMENT),
                                    "SLUICE_STORE_RETENTION_MAX_BYTES": str(3 * SEGMENT),
                                    "SLUICE_CORE_RETENTION_CHECK_INTERVAL_MS": "300"})
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.kill_all()


def test_a_node_with_a_new_disk_joins_after_retention_and_leads_with_everything(group):
    leader = leader_of(group)
    admin = f"http://{leader.host}:{group.ports.admin}"
    _sluice("user", "create", "dora", "--new-password", "dora-pw-1", "--superuser", "--admin", admin)
    _publish_retained(group, leader.host, "early/config", b"set before the deleted segments")
    replaced = next(node for node in group.nodes if node is not leader)
    replaced.kill()
    shutil.rmtree(replaced.data_dir)  # its disk is gone
    _send(group, 80)  # about 5 segments: retention deletes the first ones
    wait_for("the leader's log to begin past its first segment", lambda: _log_start(leader) > 0)

    replaced.start()
    replaced.wait_ready()
    wait_for(f"{replaced.name} back in sync", lambda: (view := cluster_view(group)) and replaced.name in view["isr"])
    assert _log_start(replaced) > 0, "the new node begins where the leader's log begins, from a snapshot"
    with urllib.request.urlopen(f"http://{replaced.host}:{group.ports.admin}/metrics", timeout=10) as reply:
        assert f'sluice_cluster_snapshots_total{{node="{replaced.name}"}} 1.0' in reply.read().decode()

    while (current := leader_of(group)) is not replaced:  # make the new node lead
        current.kill()
        leader_of(group, skip=(current,))
        current.start()
        current.wait_ready()
    _amqp_connection(group, [replaced.host], "dora", "dora-pw-1").close()  # a user only the snapshot had
    assert _retained(group, replaced.host, "early/config") == b"set before the deleted segments"


def _sluice(*arguments: str) -> str:
    return subprocess.run([sys.executable, "-m", "sluice.cli", *arguments], check=True, capture_output=True,
                          text=True, timeout=60).stdout


def _send(group: DevCluster, count: int) -> None:
    endpoints = ",".join(f"{node.host}:{group.ports.native}" for node in group.nodes)
    with SyncProducer(ClientConfig(endpoints, "sluice", "sluice", request_timeout=20)) as producer:
        for _ in range(count):
            producer.send(Message("bulk", BODY))


def _log_start(node: NodeProcess) -> int:
    """The offset the node's log begins at, from its segment files' names."""
    names = sorted(path.name for path in (node.data_dir / "commitlog").iterdir() if path.name.isdigit())
    return int(names[0]) if names else 0


def _client(group: DevCluster, host: str) -> mqtt.Client:
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv311)
    client.username_pw_set("sluice", "sluice")
    client.connect(host, group.ports.mqtt)
    client.loop_start()
    return client


def _publish_retained(group: DevCluster, host: str, topic: str, payload: bytes) -> None:
    client = _client(group, host)
    try:
        client.publish(topic, payload, qos=1, retain=True).wait_for_publish(30)
    finally:
        client.loop_stop()
        client.disconnect()


def _retained(group: DevCluster, host: str, topic: str) -> bytes:
    got: list[bytes] = []
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv311)
    client.username_pw_set("sluice", "sluice")
    client.on_message = lambda _client, _userdata, message: got.append(message.payload)
    client.on_connect = lambda c, *_: c.subscribe(topic, qos=1)
    def connected() -> bool:
        try:
            client.connect(host, group.ports.mqtt)
        except OSError:
            return False
        return True
    wait_for("the new leader's MQTT listener", connected)
    client.loop_start()
    try:
        wait_for(f"the retained message of {topic}", lambda: got)
    finally:
        client.loop_stop()
        client.disconnect()
    return got[0]
