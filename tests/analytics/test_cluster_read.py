"""Spark reads a replica group's messages from any node's data directory, followers included,
while the group runs: what the group confirmed, on every node alike (a follower's queues index
only confirmed records, so Spark never sees a message a failover could take back)."""
from __future__ import annotations

import time

import pytest

from bench.cluster_load import leader_of
from bench.processes import free_ports
from sluice.cli.dev_cluster import DevCluster, Ports
from sluice.client import ClientConfig, Message, SyncProducer
from tests.cluster.conftest import etcd_installed  # noqa: F401  (a fixture)

COUNT = 40


@pytest.fixture
def group(tmp_path, etcd_installed):  # noqa: F811
    native, admin, mqtt, ws, amqp, replication, etcd_client, etcd_peer = free_ports(8)
    cluster = DevCluster(tmp_path / "group", ports=Ports(native, admin, mqtt, ws, amqp, replication),
                         etcd_ports=(etcd_client, etcd_peer),
                         extra_env={"SLUICE_STORE_CHECKPOINT_INTERVAL_MS": "200"})
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.kill_all()


def test_spark_reads_what_the_group_confirmed_from_every_node(spark, group):
    leader = leader_of(group)
    endpoints = ",".join(f"{node.host}:{group.ports.native}" for node in group.nodes)
    with SyncProducer(ClientConfig(endpoints, "sluice", "sluice", request_timeout=10)) as producer:
        for number in range(COUNT):
            producer.send(Message("telemetry", f"t-{number:02d}".encode()))
    sent = {f"t-{number:02d}" for number in range(COUNT)}
    for node in sorted(group.nodes, key=lambda n: n is leader):  # the followers first
        deadline = time.monotonic() + 60
        while True:  # a node writes its queue entries out every checkpoint interval
            rows = (spark.read.format("sluice").option("subscribe", "telemetry")
                    .load(str(node.data_dir)).select("body").collect())
            seen = {bytes(row.body).decode() for row in rows}
            assert seen <= sent, f"{node.name} shows what was never sent: {sorted(seen - sent)}"
            if seen == sent or time.monotonic() > deadline:
                break
        assert seen == sent, f"{node.name} ({'leader' if node is leader else 'follower'}) " \
                             f"shows {len(seen)} of {COUNT} confirmed messages"
        assert len(rows) == COUNT, f"{node.name}: a message read twice"
