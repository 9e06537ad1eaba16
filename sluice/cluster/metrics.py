"""Prometheus series of a replica group node: role, epoch, offsets, in-sync set and each
follower's lag (on the leader), and the counts of ``events``."""
from __future__ import annotations

import time
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from . import events
from .node import ReplicaNode


def cluster_metrics(node: ReplicaNode) -> Iterator[Metric]:
    me = node.coordinator.me.node
    leading = node.leading
    yield _gauge("sluice_cluster_leader", "1 while this node leads its replica group", me, 1 if leading else 0)
    yield _gauge("sluice_cluster_epoch", "The epoch this node leads in (0 while it follows)", me,
                 node.coordinator.epoch)
    yield _gauge("sluice_cluster_durable_offset", "End of this node's commit log on disk", me,
                 node.store.durable_offset)
    confirmed = leading.shipper.confirmed if leading else node.confirmed
    yield _gauge("sluice_cluster_confirmed_offset", "The group's confirm offset as this node knows it", me, confirmed)
    if leading is not None:
        shipper = leading.shipper
        yield _gauge("sluice_cluster_in_sync_replicas", "Replicas in the in-sync set, the leader included", me,
                     len(shipper.in_sync_members()))
        yield _gauge("sluice_cluster_publishes_refused", "1 while publishes are refused (too few replicas in "
                     "sync, or the lease lapsed)", me, 1 if shipper.refusal else 0)
        lag = GaugeMetricFamily("sluice_cluster_replica_lag_bytes", "How far each follower's durable end is "
                                "behind the leader's", labels=["node", "replica"])
        seconds = GaugeMetricFamily("sluice_cluster_replica_lag_seconds", "How long each follower has not held "
                                    "everything the leader had", labels=["node", "replica"])
        for name, (_, behind, lag_s, _) in sorted(shipper.follower_positions(time.monotonic()).items()):
            lag.add_metric([me, name], behind)
            seconds.add_metric([me, name], lag_s)
        yield lag
        yield seconds
    for key, text in (("elections", "Elections this node won"), ("fenced", "Times this node stepped down as "
                      "leader because its lease lapsed"), ("truncations", "Times this node cut its log back "
                      "to rejoin"), ("snapshots", "Times this node began its store from the leader's snapshot, its log "
                      "lacking what retention deleted"),
                      ("in_sync_changes", "In-sync set changes this node recorded as leader")):
        family = CounterMetricFamily(f"sluice_cluster_{key}", text, labels=["node"])
        family.add_metric([me], events.counts[key])
        yield family


def _gauge(name: str, text: str, node: str, value: float) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, text, labels=["node"])
    family.add_metric([node], value)
    return family
