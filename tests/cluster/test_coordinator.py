"""Leadership, the in-sync set and fencing against a real etcd."""
from __future__ import annotations

import asyncio

import pytest

from sluice.cluster.coordinator import Coordinator, Fenced, InSyncSet, Node
from sluice.cluster.etcd import Etcd, EtcdUnavailable, channel_target
from sluice.cluster.settings import ClusterConfig

TTL_S = 2


class Clock:
    """Monotonic time that a test can move ahead, as if the process had been stopped."""

    def __init__(self) -> None:
        self.skew = 0.0

    def __call__(self) -> float:
        import time
        return time.monotonic() + self.skew


def coordinator(etcd_url: str, name: str, fenced: list, clock=None, ttl_s: int = TTL_S) -> Coordinator:
    config = ClusterConfig(etcd=etcd_url, node_id=name, lease_ttl_s=ttl_s, lease_margin_ms=500)
    me = Node(name, f"127.0.0.{name[-1]}", f"127.0.0.{name[-1]}:5679")
    kwargs = {"clock": clock} if clock is not None else {}
    return Coordinator(Etcd([etcd_url]), config, me, lambda why: fenced.append((name, why)), **kwargs)


def run(coroutine):
    return asyncio.run(coroutine)


def test_the_first_campaigner_founds_the_group_and_its_epoch_is_the_leader_key_revision(etcd):
    async def scenario():
        fenced: list = []
        n1, n2 = coordinator(etcd.url, "n1", fenced), coordinator(etcd.url, "n2", fenced)
        await n1.join()
        await n2.join()
        won = await n1.campaign()
        assert won is not None and won.leader.node == "n1"
        assert await n2.campaign() is None
        leadership, _ = await n2.leadership()
        assert leadership == won and leadership.epoch == n1.epoch > 0
        assert (await n2.in_sync()).members == ("n1",)
        assert {node.node for node in await n1.members()} == {"n1", "n2"}
        assert n1.may_confirm and not n2.may_confirm
        for node in (n1, n2):
            await node.close()
            await node.etcd.close()
        assert fenced == []
    run(scenario())


def test_only_an_in_sync_node_can_win_and_the_leader_alone_changes_the_set(etcd):
    async def scenario():
        fenced: list = []
        n1, n2, n3 = (coordinator(etcd.url, name, fenced) for name in ("n1", "n2", "n3"))
        for node in (n1, n2, n3):
            await node.join()
        await n1.campaign()
        isr = await n1.change_in_sync(["n1", "n2"], await n1.in_sync())
        assert isr is not None and isr.members == ("n1", "n2")
        with pytest.raises(ValueError):
            await n2.change_in_sync(["n2"], isr)  # not the leader
        assert await n1.change_in_sync(["n1"], InSyncSet(("n1",), isr.revision - 1)) is None  # stale
        await n1.close()  # gives the lease back: the leader key goes at once
        assert await n3.campaign() is None, "n3 is not in the in-sync set"
        won = await n2.campaign()
        assert won is not None and won.epoch > n1.epoch
        assert await n3.campaign(unclean=True) is None, "a leader exists"
        for node in (n2, n3):
            await node.close()
        for node in (n1, n2, n3):
            await node.etcd.close()
    run(scenario())


def test_a_leader_whose_lease_lapsed_is_fenced_and_its_writes_fail(etcd):
    async def scenario():
        fenced: list = []
        clock = Clock()
        n1 = coordinator(etcd.url, "n1", fenced, clock=clock)
        n2 = coordinator(etcd.url, "n2", fenced)
        await n1.join()
        await n2.join()
        await n1.campaign()
        old = await n1.change_in_sync(["n1", "n2"], await n1.in_sync())
        # Stopped past its lease: the first thing it does on waking is ask whether it may confirm.
        n1._keeper.cancel()
        clock.skew = TTL_S
        assert not n1.may_confirm
        assert fenced == [("n1", "the etcd lease deadline passed")]
        # etcd expires the lease by itself; n2, in sync, takes over in a newer epoch
        async for leadership in n2.leader_changes((await n2.etcd.get(n2.leader_key))[1]):
            if leadership is None:
                break
        won = await n2.campaign()
        assert won is not None and won.epoch > n1.epoch
        with pytest.raises(Fenced):
            await n1.change_in_sync(["n1"], old)
        # even a write that skipped the local check fails in etcd: the leader key is n2's now
        n1._fenced = None
        clock.skew = -1000
        assert await n1.change_in_sync(["n1"], await n1.in_sync()) is None
        assert (await n2.in_sync()).members == ("n1", "n2")
        assert await n1.etcd.keep_alive(n1.lease) <= 0
        await n2.close()
        for node in (n1, n2):
            await node.etcd.close()
    run(scenario())


def test_keepalives_hold_the_lease_well_past_its_ttl(etcd):
    async def scenario():
        fenced: list = []
        n1 = coordinator(etcd.url, "n1", fenced, ttl_s=3)
        await n1.join()
        await n1.campaign()
        leadership, revision = await n1.leadership()
        watch = n1.leader_changes(revision)
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(watch.__anext__(), timeout=6)  # no change while renewed
        assert n1.may_confirm and fenced == []
        await n1.close()
        await n1.etcd.close()
    run(scenario())


def test_an_unreachable_etcd_is_an_error_not_a_decision(tmp_path):
    from bench.processes import free_ports

    async def scenario():
        client = Etcd([f"http://127.0.0.1:{free_ports(1)[0]}"], timeout_s=0.5)
        with pytest.raises(EtcdUnavailable):
            await client.get(b"/sluice/x/leader")
        await client.close()
    run(scenario())


@pytest.mark.parametrize("urls, target", [
    (["http://127.0.0.1:2379"], "127.0.0.1:2379"),
    (["127.0.0.2:2379"], "127.0.0.2:2379"),
    (["etcd.internal"], "etcd.internal:2379"),
    (["http://127.0.0.1:2379", "http://127.0.0.2:22379"], "ipv4:127.0.0.1:2379,127.0.0.2:22379"),
])
def test_etcd_endpoints_become_one_channel_target(urls, target):
    assert channel_target(urls) == target


@pytest.mark.parametrize("urls", [[], ["https://127.0.0.1:2379"], ["a.example:2379", "b.example:2379"]])
def test_etcd_endpoints_we_cannot_use_are_refused_with_a_reason(urls):
    with pytest.raises(ValueError):
        channel_target(urls)
