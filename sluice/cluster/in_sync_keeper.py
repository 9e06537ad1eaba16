"""The leader's loop that keeps the in-sync set recorded in etcd in line with its followers.

It applies ``in_sync.next_in_sync`` whenever a follower's progress changes and at least every
quarter of ``replica_timeout_ms``. A change is proposed to the gate first (confirms then wait for
old and new members together), committed in etcd fenced on the leader's epoch and lease, and
only then does the gate let go of a dropped member (I3). A commit etcd refuses (the set was
changed meanwhile, or this node no longer leads) is abandoned and the set read again.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from .coordinator import Coordinator, InSyncSet
from .etcd import EtcdUnavailable
from .in_sync import InSyncGate, next_in_sync
from .replication import LogShipper

log = logging.getLogger(__name__)


class InSyncKeeper:
    def __init__(self, coordinator: Coordinator, shipper: LogShipper, gate: InSyncGate, recorded: InSyncSet,
                 epoch_start: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.coordinator, self.shipper, self.gate = coordinator, shipper, gate
        self.recorded = recorded
        self.epoch_start = epoch_start
        self._clock = clock
        self._began_at = clock()
        self._timeout_s = coordinator.config.replica_timeout_ms / 1000
        self._changed = asyncio.Event()
        shipper.add_progress_listener(self._changed.set)
        self.checked = asyncio.Event()
        """Set once the set was first brought in line (members found down are out of it)."""

    async def run(self) -> None:
        """Until cancelled (or this node is fenced)."""
        while self.coordinator.fenced is None:
            if self.checked.is_set():
                with contextlib.suppress(asyncio.TimeoutError):
                    async with asyncio.timeout(self._timeout_s / 4):
                        await self._changed.wait()
            self._changed.clear()
            try:
                await self.check()
                self.checked.set()
            except EtcdUnavailable as error:
                log.warning("could not record the in-sync set (%s); confirms wait for the old and new "
                            "members until it can", error)

    async def check(self) -> None:
        """Record the set the rule asks for now, if it differs from the recorded one."""
        me = self.coordinator.me.node
        followers = {node: replica.progress for node, replica in self.shipper.replicas.items()}
        alive = {node.node for node in await self.coordinator.members()}
        wanted = next_in_sync(self.recorded.members, me, followers, leader_durable=self.shipper.store.durable_offset,
                              confirmed=self.shipper.confirmed, epoch_start=self.epoch_start,
                              epoch_began_at=self._began_at, now=self._clock(), timeout_s=self._timeout_s,
                              alive=alive)
        if set(wanted) == set(self.recorded.members):
            return
        self.gate.propose(wanted)
        self.shipper.update()
        try:
            result = await self.coordinator.change_in_sync(wanted, self.recorded)
        except BaseException:
            self.gate.abandoned()
            raise
        if result is None:
            self.gate.abandoned()
            self.recorded = await self.coordinator.in_sync()
            self.gate.committed(self.recorded.members)
        else:
            self.recorded = result
            self.gate.committed(result.members)
        self.shipper.update()
