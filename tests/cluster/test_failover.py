"""Three replica nodes on one etcd, in one process: the group elects a leader, followers copy its
log, the leader's death hands leadership to an in-sync follower in a newer epoch, and the dead
leader comes back as a follower, cut back to the new history where it had written past it."""
from __future__ import annotations

import asyncio

from sluice.cluster.node import Leading, ReplicaNode
from sluice.cluster.settings import ClusterConfig
from store.api import StoreConfig
from store.file_store import FileStore
from bench.processes import free_ports
from tests.cluster.test_replication import SECRET, WAIT, bodies, confirmed, publish, stop

SEGMENT = 64 << 10


class Group:
    def __init__(self, etcd_url: str, tmp_path) -> None:
        self.etcd_url, self.tmp_path = etcd_url, tmp_path
        self.ports = dict(zip(("n1", "n2", "n3"), free_ports(3)))
        self.nodes: dict[str, ReplicaNode] = {}
        self.tasks: dict[str, asyncio.Task] = {}
        self.leaders: asyncio.Queue[tuple[str, Leading]] = asyncio.Queue()

    def start(self, name: str) -> ReplicaNode:
        config = ClusterConfig(etcd=self.etcd_url, node_id=name, secret=SECRET, lease_ttl_s=2,
                               lease_margin_ms=500, replica_timeout_ms=1_500,
                               replication_port=self.ports[name])

        async def on_leading(leading: Leading) -> None:
            await self.leaders.put((name, leading))

        directory = str(self.tmp_path / name)
        node = ReplicaNode(config, directory, lambda: FileStore(directory, StoreConfig(segment_size=SEGMENT)),
                           "127.0.0.1", "127.0.0.1", on_leading)
        self.nodes[name] = node
        self.tasks[name] = asyncio.ensure_future(node.run())
        return node

    async def crash(self, name: str) -> None:
        """Stop a node the way SIGKILL would for the group: no lease given back."""
        await stop(self.tasks.pop(name))
        await self.nodes.pop(name).close(give_back_lease=False)

    async def close(self) -> None:
        for name in list(self.tasks):
            await stop(self.tasks.pop(name))
            await self.nodes.pop(name).close()


async def in_sync(leading: Leading, members: set[str]) -> None:
    current = await leading.coordinator.in_sync()
    if set(current.members) == members:
        return
    async for _ in leading.coordinator.etcd.changes(leading.coordinator.isr_key, current.revision + 1):
        if set((await leading.coordinator.in_sync()).members) == members:
            return


def test_the_leaders_death_hands_over_to_an_in_sync_follower_and_it_rejoins_cut_back(etcd, tmp_path):
    async def scenario():
        group = Group(etcd.url, tmp_path)
        try:
            group.start("n1")
            first, leading = await asyncio.wait_for(group.leaders.get(), WAIT)
            assert first == "n1", "the only node founds the group"
            group.start("n2")
            group.start("n3")
            await asyncio.wait_for(in_sync(leading, {"n1", "n2", "n3"}), WAIT)
            end = publish(leading.store, 200)
            await confirmed(leading.shipper, end)
            assert await asyncio.to_thread(leading.store.wait_visible, end, WAIT)
            kept = bodies(leading.store, 0)
            assert len(kept) == 100
            old_epoch = leading.epoch
            # n1 writes past what it ever shipped (a record nobody acknowledged), then dies
            await leading.shipper.close()
            unconfirmed = publish(leading.store, 5, start=1000)
            await asyncio.to_thread(leading.store.wait_durable, unconfirmed, WAIT)
            await group.crash("n1")
            second, leading = await asyncio.wait_for(group.leaders.get(), WAIT)
            assert second in {"n2", "n3"} and leading.epoch > old_epoch
            # the new leader shows its log once the group confirms it again (without n1, gone)
            await confirmed(leading.shipper, end)
            assert await asyncio.to_thread(leading.store.wait_visible, end, WAIT)
            assert bodies(leading.store, 0) == kept, "every confirmed record is on the new leader"
            more = publish(leading.store, 50, start=2000)
            await confirmed(leading.shipper, more)
            # n1 comes back: cut back to the new history, caught up, in sync again
            group.start("n1")
            await asyncio.wait_for(in_sync(leading, {"n1", "n2", "n3"}), WAIT)
            rejoined = group.nodes["n1"]
            assert await asyncio.to_thread(rejoined.store.wait_durable, leading.store.durable_offset, WAIT)
            assert bodies(rejoined.store, 0) == bodies(leading.store, 0)
            assert [e.epoch for e in rejoined.epochs.history.entries] == [old_epoch, leading.epoch]
        finally:
            await group.close()
    asyncio.run(scenario())
