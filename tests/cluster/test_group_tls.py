"""A three-node group with a certificate: the replication port speaks TLS (the group takes
writes only when followers replicate over it), and clients reach the leader over TLS through
any node's relay, verifying the same certificate. The admin port stays plain HTTP
(``admin.tls = false``) so the group's own state is read as in the other cluster tests."""
from __future__ import annotations

import queue
import ssl

import paho.mqtt.client as mqtt
import pytest

from bench.cluster_load import in_sync, leader_of
from bench.processes import free_ports
from sluice.cli.dev_cert import write_dev_certs
from sluice.cli.dev_cluster import DevCluster, Ports
from sluice.client import ClientConfig, Message, SyncProducer

WAIT = 60


@pytest.fixture
def group(tmp_path, etcd_installed):
    certs = write_dev_certs(tmp_path / "certs", hosts=("127.0.0.2", "127.0.0.3", "127.0.0.4"))
    native, admin, mqtt_port, ws, amqp, replication, tls, etcd_client, etcd_peer = free_ports(9)
    cluster = DevCluster(tmp_path / "group", ports=Ports(native, admin, mqtt_port, ws, amqp, replication),
                         etcd_ports=(etcd_client, etcd_peer),
                         extra_env={"SLUICE_TLS_CERT": certs.cert, "SLUICE_TLS_KEY": certs.key,
                                    "SLUICE_TLS_CLIENT_CA": certs.ca, "SLUICE_ADMIN_TLS": "false",
                                    "SLUICE_MQTT_TLS_PORT": str(tls), "SLUICE_MQTT_WSS_PORT": "-1",
                                    "SLUICE_AMQP_TLS_PORT": "-1"})
    cluster.certs, cluster.mqtt_tls = certs, tls
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.kill_all()


def test_the_group_replicates_over_tls_and_serves_tls_clients_through_every_node(group):
    leader = leader_of(group)
    in_sync(group, {node.name for node in group.nodes})  # followers replicate over TLS
    follower = next(node for node in group.nodes if node is not leader)
    received: queue.Queue = queue.Queue()
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2)
    client.username_pw_set("sluice", "sluice")
    client.tls_set(ca_certs=group.certs.ca, cert_reqs=ssl.CERT_REQUIRED)
    client.on_message = lambda _c, _u, message: received.put(message.payload)
    subscribed = queue.Queue()
    client.on_subscribe = lambda *_: subscribed.put(True)
    client.connect(follower.host, group.mqtt_tls)  # relayed to the leader, TLS end to end
    client.loop_start()
    client.subscribe("secure/#", 1)
    assert subscribed.get(timeout=WAIT)
    endpoints = ",".join(f"{node.host}:{group.ports.native}" for node in group.nodes)
    config = ClientConfig(endpoints, "sluice", "sluice", ca_file=group.certs.ca, request_timeout=20)
    with SyncProducer(config) as producer:
        producer.send(Message("secure", b"confirmed by the group"))
    assert received.get(timeout=WAIT) == b"confirmed by the group"
    client.loop_stop()
    client.disconnect()
