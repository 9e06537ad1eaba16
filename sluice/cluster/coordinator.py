"""Leadership, the in-sync set and fencing, all decided in etcd.

Keys, under ``/sluice/<group>/``:

    members/<node>   {"node", "address", "replication"}   bound to the node's lease
    leader           {"node", "address", "replication"}   bound to the leader's lease
    isr              {"members": [...]}                   written only by the leader

The leader key's ``create_revision`` is the epoch: the fencing token every replicated batch
carries. A campaign is one transaction, ``leader`` absent and ``isr`` unchanged since the node
read it and found itself a member, so only an in-sync node can win (I2). The leader changes
``isr`` in a transaction that also requires its own leader key, by epoch and lease, so a deposed
leader's write fails (I3). Before the first ``isr`` exists, the first campaigner founds the group
and the set.

A leader may confirm only while its lease is certainly alive: until ``lease_ttl_s`` less
``lease_margin_ms`` after it sent the last keepalive etcd answered. ``may_confirm`` reads the
clock each time it is asked, so a process stopped past that deadline and resumed confirms
nothing, even before any timer of its own has run (I8); the deadline passing, or etcd saying the
lease is gone, fences the node for good (``on_fenced``): it steps down by restarting.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from . import etcd as kv
from . import events
from .etcd import Etcd, EtcdUnavailable, KeyValue
from .settings import ClusterConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Node:
    """How a node is reached: its client-facing host and its replication endpoint."""

    node: str
    address: str
    replication: str

    def encode(self) -> bytes:
        return json.dumps({"node": self.node, "address": self.address, "replication": self.replication}).encode()

    @classmethod
    def decode(cls, data: bytes) -> Node:
        fields = json.loads(data)
        return cls(str(fields["node"]), str(fields["address"]), str(fields["replication"]))


@dataclass(frozen=True)
class Leadership:
    """Who leads, and in which epoch."""

    leader: Node
    epoch: int


@dataclass(frozen=True)
class InSyncSet:
    members: tuple[str, ...]
    revision: int
    """The ``isr`` key's mod revision: a change must name it (0: the group has no set yet)."""


class Fenced(Exception):
    """This node's lease is gone or past its deadline: it must not confirm, and steps down."""


class Coordinator:
    """One node's view of its group in etcd."""

    def __init__(self, etcd: Etcd, config: ClusterConfig, me: Node,
                 on_fenced: Callable[[str], None], clock: Callable[[], float] = time.monotonic) -> None:
        self.etcd = etcd
        self.config = config
        self.me = me
        self._on_fenced = on_fenced
        self._clock = clock
        prefix = self.prefix = f"/sluice/{config.name}/"
        self.leader_key = (prefix + "leader").encode()
        self.isr_key = (prefix + "isr").encode()
        self.members_prefix = (prefix + "members/").encode()
        self.lease = 0
        self.epoch = 0
        """The epoch this node leads in; 0 while it does not."""
        self._deadline = 0.0
        self._fenced: str | None = None
        self._keeper: asyncio.Task | None = None
        self._expiry: asyncio.TimerHandle | None = None

    # -- membership and the lease ------------------------------------------------------------

    async def join(self) -> None:
        """Take a lease, announce this node under ``members/`` and keep the lease alive."""
        sent = self._clock()
        self.lease, ttl = await self.etcd.grant(self.config.lease_ttl_s)
        self._renewed(sent, ttl)
        await self.etcd.put(self.members_prefix + self.me.node.encode(), self.me.encode(), self.lease)
        self._keeper = asyncio.create_task(self._keep_alive(), name="etcd lease keepalive")

    async def _keep_alive(self) -> None:
        period = max(0.2, self.config.lease_ttl_s / 3)
        while self._fenced is None:
            await asyncio.sleep(period)
            sent = self._clock()
            try:
                ttl = await self.etcd.keep_alive(self.lease, timeout_s=max(0.1, self._deadline - sent))
            except EtcdUnavailable as error:
                log.warning("could not renew the etcd lease (%s); %.1f s left before this node "
                            "stops confirming", error, max(0.0, self._deadline - self._clock()))
                continue
            if ttl <= 0:
                self._fence("etcd says the lease expired")
                return
            self._renewed(sent, ttl)

    def _renewed(self, sent: float, ttl: int) -> None:
        self._deadline = sent + ttl - self.config.lease_margin_ms / 1000
        if self._expiry is not None:
            self._expiry.cancel()
        loop = asyncio.get_running_loop()
        self._expiry = loop.call_later(max(0.0, self._deadline - self._clock()), self._check_deadline)

    def _check_deadline(self) -> None:
        if self._clock() >= self._deadline:
            self._fence(f"the etcd lease was not renewed within {self.config.lease_ttl_s} s "
                        f"less a {self.config.lease_margin_ms} ms margin")

    def _fence(self, why: str) -> None:
        if self._fenced is not None:
            return
        self._fenced = why
        if self.epoch:
            log.error("leader %s fenced in epoch %d: %s; it confirms nothing more and steps down",
                      self.me.node, self.epoch, why)
        self._on_fenced(why)

    @property
    def fenced(self) -> str | None:
        """Why this node may no longer act for the group; None while it may."""
        if self._fenced is None and self.lease and self._clock() >= self._deadline:
            self._fence("the etcd lease deadline passed")
        return self._fenced

    @property
    def may_confirm(self) -> bool:
        """True while this node leads and its lease is certainly alive (read from the clock now)."""
        return self.epoch != 0 and self.fenced is None

    def abandon(self) -> None:
        """Stop renewing the lease without giving it back: it expires by itself, as after a crash."""
        self._fenced = self._fenced or "abandoned"
        if self._expiry is not None:
            self._expiry.cancel()
        if self._keeper is not None:
            self._keeper.cancel()

    async def close(self) -> None:
        """Stop renewing and give the lease back, so a successor need not wait for it to expire."""
        self._fenced = self._fenced or "closed"
        if self._expiry is not None:
            self._expiry.cancel()
        if self._keeper is not None:
            self._keeper.cancel()
            await asyncio.gather(self._keeper, return_exceptions=True)
        if self.lease:
            try:
                await self.etcd.revoke(self.lease)
            except EtcdUnavailable as error:
                log.warning("could not give back the etcd lease (%s); it expires by itself", error)

    # -- reading the group -----------------------------------------------------------------------

    async def leadership(self) -> tuple[Leadership | None, int]:
        """The current leader (None if none) and the revision it was read at."""
        found, revision = await self.etcd.get(self.leader_key)
        return (None if found is None else Leadership(Node.decode(found.value), found.create_revision)), revision

    async def in_sync(self) -> InSyncSet:
        found, _ = await self.etcd.get(self.isr_key)
        return _in_sync(found)

    async def members(self) -> list[Node]:
        return [Node.decode(found.value) for found in await self.etcd.get_prefix(self.members_prefix)]

    async def leader_changes(self, after_revision: int):
        """Yield the leadership each time the leader key changes after ``after_revision``
        (None when it is gone)."""
        async for found in self.etcd.changes(self.leader_key, after_revision + 1):
            yield None if found is None else Leadership(Node.decode(found.value), found.create_revision)

    # -- leading ---------------------------------------------------------------------------------

    async def campaign(self, unclean: bool = False) -> Leadership | None:
        """Try once to become leader; the new leadership, or None if another node leads or this
        one is not in the in-sync set (``unclean``: the operator's last resort, ignore the set)."""
        if self.fenced is not None:
            raise Fenced(self.fenced)
        isr = await self.in_sync()
        compare = [kv.created_at(self.leader_key, 0)]
        success = [kv.put(self.leader_key, self.me.encode(), self.lease)]
        if isr.revision == 0 or unclean:
            # founding the group, or an unclean election: this node becomes the whole set
            compare.append(kv.modified_at(self.isr_key, isr.revision))
            success.append(kv.put(self.isr_key, _encode_isr([self.me.node])))
        elif self.me.node in isr.members:
            compare.append(kv.modified_at(self.isr_key, isr.revision))
        else:
            return None
        result = await self.etcd.txn(compare, success)
        if not result.succeeded:
            return None
        if self.fenced is not None:  # the lease may have lapsed while the transaction was in flight
            raise Fenced(self.fenced)
        self.epoch = result.revision
        how = "unclean election" if unclean else "founded the group" if isr.revision == 0 else "elected"
        events.counts["elections"] += 1
        log.warning("%s leads in epoch %d (%s; in-sync set %s)", self.me.node, self.epoch, how,
                    ", ".join([self.me.node] if isr.revision == 0 or unclean else isr.members))
        return Leadership(self.me, self.epoch)

    async def change_in_sync(self, members: Sequence[str], expected: InSyncSet) -> InSyncSet | None:
        """Replace the in-sync set, fenced on this node's leadership; None if it was changed
        meanwhile or this node no longer leads (then it must not confirm on the new set)."""
        if not self.epoch or self.me.node not in members:
            raise ValueError("only the leader changes the in-sync set, and stays in it")
        if self.fenced is not None:
            raise Fenced(self.fenced)
        result = await self.etcd.txn(
            [kv.created_at(self.leader_key, self.epoch), kv.held_by(self.leader_key, self.lease),
             kv.modified_at(self.isr_key, expected.revision)],
            [kv.put(self.isr_key, _encode_isr(members))])
        if not result.succeeded:
            return None
        events.counts["in_sync_changes"] += 1
        log.warning("in-sync set of epoch %d: %s (was %s)", self.epoch, ", ".join(members),
                    ", ".join(expected.members))
        return InSyncSet(tuple(members), result.revision)


def _encode_isr(members: Sequence[str]) -> bytes:
    return json.dumps({"members": list(members)}).encode()


def _in_sync(found: KeyValue | None) -> InSyncSet:
    if found is None:
        return InSyncSet((), 0)
    return InSyncSet(tuple(json.loads(found.value)["members"]), found.mod_revision)
