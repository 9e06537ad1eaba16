"""What `sluice cluster status` shows, from any node: leader, epoch, in-sync set and each node's
log position, all read from etcd.

The leader publishes its followers' progress (``progress`` key, bound to its lease) every
``REPORT_S``; every node reads the leader, the in-sync set, the members and that progress, so
a follower answers too, even while no node leads (then the last progress is gone with the
lease, and positions are unknown).
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable

from .coordinator import Coordinator
from .etcd import EtcdUnavailable
from .replication import LogShipper

REPORT_S = 1.0


def progress_key(coordinator: Coordinator) -> bytes:
    return (coordinator.prefix + "progress").encode()


def unclean_key(coordinator: Coordinator) -> bytes:
    """Names the node an operator wants elected without being in sync (its last resort)."""
    return (coordinator.prefix + "unclean").encode()


async def report_progress(coordinator: Coordinator, shipper: LogShipper, clock: Callable[[], float] = time.monotonic) -> None:
    """The leader's loop: publish every follower's durable end and how long it has lagged."""
    key = progress_key(coordinator)
    while coordinator.fenced is None:
        leader_durable = shipper.store.durable_offset
        nodes = {coordinator.me.node: {"durable": leader_durable, "lag_s": 0.0}}
        for node, (durable, _, lag_s, connected) in shipper.follower_positions(clock()).items():
            nodes[node] = {"durable": durable, "connected": connected, "lag_s": round(lag_s, 3)}
        body = {"epoch": coordinator.epoch, "confirmed": shipper.confirmed, "durable": leader_durable,
                "refusal": shipper.refusal, "nodes": nodes}
        with contextlib.suppress(EtcdUnavailable):
            await coordinator.etcd.put(key, json.dumps(body).encode(), coordinator.lease)
        await asyncio.sleep(REPORT_S)


async def cluster_status(coordinator: Coordinator) -> dict:
    """``{"leader", "epoch", "isr", "confirmed", "nodes": [{"id", "address", "role", "durable_end",
    "lag_bytes", "lag_s"}]}``; raises EtcdUnavailable when etcd does not answer."""
    leadership, _ = await coordinator.leadership()
    isr = await coordinator.in_sync()
    members = {node.node: node for node in await coordinator.members()}
    found, _ = await coordinator.etcd.get(progress_key(coordinator))
    progress = json.loads(found.value) if found is not None else {}
    if leadership is None or progress.get("epoch") != leadership.epoch:
        progress = {}
    positions = progress.get("nodes", {})
    leader_durable = progress.get("durable")
    nodes = []
    for name in sorted(set(members) | set(isr.members)):
        member = members.get(name)
        position = positions.get(name, {})
        durable = position.get("durable")
        if leadership is not None and name == leadership.leader.node:
            role = "leader"
        elif member is None:
            role = "down"
        elif name in isr.members:
            role = "follower"
        else:
            role = "catching up"
        nodes.append({"id": name, "address": member.address if member else None, "role": role,
                      "in_sync": name in isr.members, "durable_end": durable,
                      "lag_bytes": None if durable is None or leader_durable is None else max(0, leader_durable - durable),
                      "lag_s": position.get("lag_s")})
    return {"leader": leadership.leader.node if leadership else None,
            "epoch": leadership.epoch if leadership else None, "isr": list(isr.members),
            "confirmed": progress.get("confirmed"), "refusal": progress.get("refusal"), "nodes": nodes}
