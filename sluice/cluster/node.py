"""One node of a replica group: it follows the leader etcd names, or leads when it wins.

A node joins (its lease and ``members/`` key), then loops: with a leader, it follows it until
the leader key changes, cutting its log back first when the leader says it must; with none, it
campaigns, and a node not in the in-sync set waits for the next change instead. A node that wins
records its epoch, serves the replication port, keeps the in-sync set and hands the store to
``on_leading`` (the broker starts serving clients on it). Leading ends only with fencing: the
caller then stops the process, which comes back as a follower (crash-only, as LavinMQ does).
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from core.errors import SluiceError
from store import snapshot as store_snapshot
from store.errors import StoreError
from store.epochs import EpochFile
from store.truncation import truncate_log

from .coordinator import Coordinator, Fenced, Leadership, Node
from . import etcd as kv
from . import events, snapshots
from .etcd import Etcd, EtcdUnavailable
from .in_sync import InSyncGate
from .in_sync_keeper import InSyncKeeper
from .replication import LogFollower, LogShipper, MustInstall, MustTruncate, Refused, ReplicatedStore
from .settings import ClusterConfig
from .status import report_progress, unclean_key
from .wire import ProtocolError

log = logging.getLogger(__name__)

RETRY_S = 0.5
"""Pause before following or campaigning again after a failed attempt."""
SNAPSHOT_FILE = "snapshot.incoming"
"""Where in the data directory a follower keeps a snapshot the leader sent, until installed."""


class Metadata(Protocol):
    """The node's metadata database, as snapshots need it (``MetadataRepository`` is one)."""

    def dump(self) -> bytes: ...
    def restore(self, data: bytes) -> None: ...


@dataclass
class Leading:
    """What a node that won hands to the broker."""

    store: ReplicatedStore
    shipper: LogShipper
    coordinator: Coordinator
    epoch: int
    keeper: InSyncKeeper


class ReplicaNode:
    def __init__(self, config: ClusterConfig, data_dir: str, open_store: Callable[[], ReplicatedStore],
                 address: str, replication_host: str, on_leading: Callable[[Leading], Awaitable[None]],
                 on_leader: Callable[[Node | None], Awaitable[None]] | None = None,
                 metadata: Metadata | None = None,
                 tls: tuple[ssl.SSLContext, Callable[[], ssl.SSLContext]] | None = None) -> None:
        """``open_store`` opens the store in ``data_dir`` (the composition root's job); the node
        calls it again after cutting the log back. ``on_leader`` hears of each other node it
        follows, and None when it has no leader. With ``metadata``, a follower behind the
        leader's log start is sent a snapshot (``snapshots``) rather than refused. ``tls``:
        (server context, what gives the client context as last loaded) of the replication
        port; None: plaintext."""
        self.tls = tls
        self.config, self.data_dir, self._open_store = config, data_dir, open_store
        self._metadata = metadata
        self.replication_host = replication_host
        self._on_leading = on_leading
        self._on_leader = on_leader
        self.fenced = asyncio.Event()
        self.etcd = Etcd(config.endpoints)
        me = Node(config.node_id, address, f"{replication_host}:{config.replication_port}")
        self.coordinator = Coordinator(self.etcd, config, me, self._fence)
        self.store = open_store()
        self.epochs = EpochFile(data_dir)
        self.confirmed = 0
        """The highest confirm offset a leader has told this node."""
        self.role = "starting"
        self.leading: Leading | None = None
        self._keeper: asyncio.Task | None = None
        self._reporter: asyncio.Task | None = None

    def _fence(self, why: str) -> None:
        if self.leading is not None:
            events.counts["fenced"] += 1
        self.fenced.set()
        if self.leading is not None:
            self.leading.shipper.update()  # confirms stop and publishes are refused at once

    async def run(self) -> None:
        """Follow or lead until fenced (then return: the caller stops the process)."""
        await self.coordinator.join()
        while not self.fenced.is_set():
            try:
                leadership, revision = await self.coordinator.leadership()
                if leadership is None or leadership.leader.node == self.coordinator.me.node:
                    await self._tell_leader(None)
                if leadership is None:
                    won = await self.coordinator.campaign() or await self._unclean_campaign()
                    if won is not None:
                        await self._lead(won)
                        return
                    await self._await_leader_change(revision, RETRY_S * 4)
                elif leadership.leader.node == self.coordinator.me.node:
                    await self._await_leader_change(revision)  # our key from before a restart
                else:
                    await self._follow(leadership, revision)
            except EtcdUnavailable as error:
                log.warning("etcd: %s; retrying", error)
                await asyncio.sleep(RETRY_S)
            except Fenced:
                return

    async def _tell_leader(self, leader: Node | None) -> None:
        if self._on_leader is not None:
            await self._on_leader(leader)

    async def _unclean_campaign(self) -> Leadership | None:
        """Campaign without being in sync, once, if an operator named this node for it."""
        key = unclean_key(self.coordinator)
        named, _ = await self.etcd.get(key)
        if named is None or named.value.decode() != self.coordinator.me.node:
            return None
        won = await self.coordinator.campaign(unclean=True)
        if won is not None:
            await self.etcd.txn([kv.modified_at(key, named.mod_revision)], [kv.delete(key)])
        return won

    async def _await_leader_change(self, revision: int, timeout_s: float | None = None) -> None:
        async def changed() -> None:
            async for _ in self.coordinator.leader_changes(revision):
                return
        with contextlib.suppress(asyncio.TimeoutError):
            async with asyncio.timeout(timeout_s):
                await changed()

    async def _follow(self, leadership: Leadership, revision: int) -> None:
        """Replicate from ``leadership`` until the leader key changes."""
        self.role = "follower"
        await self._tell_leader(leadership.leader)
        host, _, port = leadership.leader.replication.rpartition(":")
        watch = asyncio.ensure_future(self._await_leader_change(revision))
        try:
            while not watch.done():
                follower = LogFollower(self.store, self.epochs, self.coordinator.me.node, self.config.secret,
                                       self.replication_host,
                                       os.path.join(self.data_dir, SNAPSHOT_FILE) if self._metadata else None,
                                       tls=self.tls and self.tls[1]())
                follower.confirmed = self.confirmed
                follower.add_confirm_listener(self._saw_confirmed)
                fetch = asyncio.ensure_future(follower.follow(host, int(port)))
                await asyncio.wait([watch, fetch], return_when=asyncio.FIRST_COMPLETED)
                if not fetch.done():
                    fetch.cancel()
                    await asyncio.gather(fetch, return_exceptions=True)
                    return
                try:
                    fetch.result()
                except MustTruncate as cut:
                    await self._truncate(cut.offset)
                    continue
                except MustInstall as install:
                    await self._install(install.path)
                    continue
                except Refused as refused:
                    log.error("leader %s refused this node: %s", leadership.leader.node, refused)
                except (ProtocolError, OSError, asyncio.IncompleteReadError, asyncio.TimeoutError) as error:
                    log.info("replication from %s ended (%s); reconnecting", leadership.leader.node,
                             error or type(error).__name__)
                with contextlib.suppress(asyncio.TimeoutError):
                    async with asyncio.timeout(RETRY_S):
                        await asyncio.shield(watch)
        finally:
            watch.cancel()
            await asyncio.gather(watch, return_exceptions=True)

    def _saw_confirmed(self, offset: int) -> None:
        self.confirmed = max(self.confirmed, offset)

    async def _truncate(self, offset: int) -> None:
        """Close the store, cut the log at ``offset`` (never below what was confirmed), reopen."""
        await asyncio.to_thread(self.store.close)
        events.counts["truncations"] += 1
        try:
            await asyncio.to_thread(truncate_log, self.data_dir, offset, self.store.config.segment_size,
                                    self.confirmed)
        finally:
            self.store = await asyncio.to_thread(self._open_store)
            self.epochs = EpochFile(self.data_dir)

    async def _install(self, path: str) -> None:
        """Begin the store from the leader's snapshot in ``path``, and the metadata database
        from its rows; the store is closed meanwhile."""
        await asyncio.to_thread(self.store.close)
        events.counts["snapshots"] += 1
        try:
            with open(path, "rb") as file:
                received = snapshots.decode(await asyncio.to_thread(file.read))
            await asyncio.to_thread(store_snapshot.install, self.data_dir, received.store)
            assert self._metadata is not None
            await asyncio.to_thread(self._metadata.restore, received.metadata)
            self.confirmed = max(self.confirmed, received.store.log_start)  # the group had confirmed it all
        except (ProtocolError, StoreError, ValueError, SluiceError) as error:
            log.error("could not begin from the leader's snapshot (%s); asking for another", error)
        finally:
            self.store = await asyncio.to_thread(self._open_store)
            self.epochs = EpochFile(self.data_dir)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    def _take_snapshot(self) -> bytes:
        """What a follower behind this leader's log start begins from. Blocking."""
        assert self._metadata is not None
        metadata = self._metadata.dump()  # before the store: entries after it are in the log
        return snapshots.encode(snapshots.Snapshot(store_snapshot.take(self.store), metadata))

    async def _lead(self, won: Leadership) -> None:
        self.role = "leader"
        recorded = await self.coordinator.in_sync()
        gate = InSyncGate(recorded.members)
        shipper = LogShipper(self.store, self.epochs, won.epoch, self.config.secret, self.coordinator.me.node,
                             gate.members, min_insync=self.config.min_insync,
                             may_confirm=lambda: self.coordinator.may_confirm,
                             snapshot=self._take_snapshot if self._metadata is not None else None,
                             tls=self.tls and self.tls[0])
        await shipper.start(self.replication_host, self.config.replication_port)
        epoch_start = self.epochs.history.latest.start
        keeper = InSyncKeeper(self.coordinator, shipper, gate, recorded, epoch_start)
        self._keeper = asyncio.ensure_future(keeper.run())
        self._reporter = asyncio.ensure_future(report_progress(self.coordinator, shipper))
        self.leading = Leading(self.store, shipper, self.coordinator, won.epoch, keeper)
        await self._on_leading(self.leading)
        await self.fenced.wait()

    async def close(self, give_back_lease: bool = True) -> None:
        """Stop (``give_back_lease``: let a successor take over at once rather than after the TTL)."""
        for task in (self._keeper, self._reporter):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        if self.leading is not None:
            await self.leading.shipper.close()
        if give_back_lease:
            await self.coordinator.close()
        else:
            self.coordinator.abandon()
        await self.etcd.close()
        await asyncio.to_thread(self.store.close)
