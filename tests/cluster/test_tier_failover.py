"""Tiered storage in a replica group of three real `sluice serve` nodes and a real etcd, all
tiering to one directory (a pass only when asked: ``POST /tier/run``): only the leader tiers, its
manifest carrying its epoch; a follower's local retention deletes what that manifest says is
tiered and keeps the sealed segments past it, and the group still serves the oldest message; after the leader is killed (SIGKILL) the new leader tiers on in its newer epoch,
and reading from the earliest offset through it (its own oldest segments deleted locally: those
reads go to the tier) gives every acknowledged message exactly once."""
from __future__ import annotations

import base64
import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from bench.cluster_load import cluster_view, in_sync, leader_of
from bench.processes import free_ports
from sluice.cli.dev_cluster import DevCluster, NodeProcess, Ports
from sluice.client import ClientConfig, Message, SyncProducer
from store.tier.manifest import Manifest, load_latest
from store.tier.objects import LocalDirectory
from tests import waiting

WAIT_S = 120.0
TOPIC = "tiered"
BEFORE, AFTER = 400, 200
"""Messages acknowledged before the failover and after it: about 1 KiB each, so each batch
seals several 64 KiB segments."""
BASIC = "Basic " + base64.b64encode(b"sluice:sluice").decode()
FIRST_SEGMENT = f"{0:020d}"


@pytest.fixture
def tier(tmp_path) -> Path:
    directory = tmp_path / "tier"
    directory.mkdir()
    return directory


@pytest.fixture
def group(tmp_path, tier, etcd_installed):
    native, admin, mqtt, ws, amqp, replication, etcd_client, etcd_peer = free_ports(8)
    env = {"SLUICE_TIER_URL": tier.as_uri(), "SLUICE_TIER_CHECK_INTERVAL_MS": "3600000",
           "SLUICE_TIER_RETRY_MAX_MS": "1000", "SLUICE_STORE_SEGMENT_SIZE": str(64 << 10),
           "SLUICE_STORE_RETENTION_MAX_AGE_MS": "1", "SLUICE_CORE_RETENTION_CHECK_INTERVAL_MS": "200"}
    cluster = DevCluster(tmp_path / "group", ports=Ports(native, admin, mqtt, ws, amqp, replication),
                         etcd_ports=(etcd_client, etcd_peer), extra_env=env)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.kill_all()


def test_the_new_leader_tiers_on_in_its_epoch_and_serves_all_history_once(group, tier):
    old = leader_of(group)
    in_sync(group, {node.name for node in group.nodes})
    old_epoch = cluster_view(group)["epoch"]
    sent = _publish(group, old, 0, BEFORE // 2)
    before = _tiered(group, old, tier, above=0, epoch=old_epoch)
    sent += _publish(group, old, BEFORE // 2, BEFORE // 2)  # sealed, not tiered (tier.run only)
    followers = [node for node in group.nodes if node is not old]
    for follower in followers:  # their local retention follows the leader's manifest, no further
        waiting.wait_for(lambda f=follower: _local_segments(f)[0] != FIRST_SEGMENT
                         and len([s for s in _local_segments(f) if int(s) > before]) >= 2,
                         f"{follower.name}'s oldest segment deleted locally, segments past {before} sealed",
                         WAIT_S, seen=lambda f=follower: _local_segments(f))
        assert int(_local_segments(follower)[0]) <= before, \
            f"{follower.name} deleted a segment the leader had not tiered: {_local_segments(follower)}"
    assert _consume(group, followers[0], BEFORE) == sorted(sent), "the oldest messages through a follower"

    old.kill()
    new = leader_of(group, skip=(old,))
    new_epoch = cluster_view(group, skip=(old,))["epoch"]
    assert new is not old and new_epoch > old_epoch
    assert _local_segments(new)[0] != FIRST_SEGMENT, "the new leader still has the oldest segment"
    sent += _publish(group, new, BEFORE, AFTER)
    _tiered(group, new, tier, above=before, epoch=new_epoch)

    assert _consume(group, new, BEFORE + AFTER) == sorted(sent), "not every acknowledged message exactly once"


def _publish(group: DevCluster, node: NodeProcess, start: int, count: int) -> list[str]:
    """``count`` native sends through ``node``, each acknowledged; their bodies' ids."""
    config = ClientConfig(f"{node.host}:{group.ports.native}", "sluice", "sluice", request_timeout=30)
    sent = []
    with SyncProducer(config) as producer:
        for number in range(start, start + count):
            ident = f"m-{number:05d}"
            producer.send(Message(TOPIC, f"{ident} {'x' * 1000}".encode()))
            sent.append(ident)
    return sent


def _tiered(group: DevCluster, leader: NodeProcess, tier: Path, above: int, epoch: int) -> int:
    """Run a tiering pass on ``leader`` (``POST /tier/run``; its own pass is an hour away) and
    wait until ``GET /tier`` there reports a tiered end past ``above`` and the tier's newest
    manifest carries ``epoch`` and that end; the tiered end."""
    def status(method: str = "GET", path: str = "/tier") -> dict:
        request = urllib.request.Request(f"http://{leader.host}:{group.ports.admin}{path}", method=method,
                                         headers={"Authorization": BASIC})
        try:
            with urllib.request.urlopen(request, timeout=30) as reply:
                return json.load(reply)
        except OSError as error:  # HTTPError too
            return {"error": str(error)}

    def manifest() -> Manifest | None:
        return load_latest(LocalDirectory(str(tier)))

    waiting.wait_for(lambda: "tiered_end" in status("POST", "/tier/run"), f"a tiering pass on {leader.name}",
                     WAIT_S, seen=lambda: status("POST", "/tier/run"))

    def done() -> int:
        found, latest = status(), manifest()
        if found.get("tiered_end", 0) > above and latest is not None and latest.epoch == epoch \
                and latest.tiered_end == found["tiered_end"]:
            return found["tiered_end"]
        return 0
    return waiting.wait_for(done, f"{leader.name} tiering past offset {above} in epoch {epoch}", WAIT_S,
                            seen=lambda: (status(), manifest() and (manifest().epoch, manifest().tiered_end)))


def _local_segments(node: NodeProcess) -> list[str]:
    """The node's commit-log segment files on its own disk (named by base offset)."""
    return sorted(p.name for p in (node.data_dir / "commitlog").iterdir() if p.name.isdigit())


def _consume(group: DevCluster, node: NodeProcess, count: int) -> list[str]:
    """The ids of the first ``count`` messages `sluice consume --earliest` reads through
    ``node``, sorted (a duplicate would crowd out another message)."""
    done = subprocess.run(
        [sys.executable, "-m", "sluice.cli", "consume", TOPIC, "--earliest", "--count", str(count),
         "--wait", "30", "--json", "--server", f"{node.host}:{group.ports.native}",
         "--user", "sluice", "--password", "sluice"], capture_output=True, text=True, timeout=WAIT_S)
    found = [json.loads(line)["body_text"].split()[0] for line in done.stdout.splitlines() if line.startswith("{")]
    assert len(found) == count, f"{len(found)} of {count} messages: {done.stderr[-2000:]}"
    return sorted(found)
