"""`sluice serve` as one node of a replica group (``[cluster] etcd`` set).

The node opens its store and joins the group in etcd (``sluice.cluster.node``). While it follows,
it replicates the leader's log and listens on every client port with a relay to the leader
(``sluice.cluster.relay``); its admin port answers ``/health`` and ``/cluster`` itself and relays
the rest. When it wins an election it closes the relays and starts the whole broker on its store,
exactly as a single node does, with the store confirming only what the in-sync set holds. A
leader that is fenced (its lease lapsed) stops the broker and starts over as a follower: the
process stays up, its clients reconnect to any node.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from sluice.cluster.coordinator import Node
from sluice.cluster.etcd import EtcdUnavailable
from sluice.cluster.metadata_sync import MetadataSync, group_master_key
from sluice.cluster.metrics import cluster_metrics
from sluice.cluster.node import Leading, ReplicaNode
from sluice.cluster.relay import Relay, RelayIngress
from sluice.cluster.status import cluster_status
from store.errors import StoreError

from protocols.tls import ServerTls

from .app import (READY_LINE, RunningBroker, StartupError, _listening_ports, _open_metadata, _open_store,
                  _server_tls, _start, print_endpoints, reload_tls)
from .config import Config

log = logging.getLogger("sluice")

RETRY_S = 1.0
CATCH_UP_S = 30.0
"""How long a node taking the lead waits for its whole log to be confirmed before it applies
the metadata journal (followers ack within milliseconds unless none is up)."""


class ClusterMember:
    """One run of this node: following, perhaps leading, until stopped or fenced."""

    def __init__(self, config: Config) -> None:
        self.config = config
        cluster = config.cluster
        self.tls: ServerTls | None = _server_tls(config) if cluster.tls else None
        """The replication port's certificate (None: plaintext)."""
        replication_tls = None
        if self.tls is not None:
            try:
                self.tls.peer()  # a bad tls.client_ca stops the start, not every connection
            except ValueError as error:
                raise StartupError(str(error)) from None
            replication_tls = (self.tls.context(), self.tls.peer)
        self.metadata = _open_metadata(config, key=group_master_key(cluster.secret))
        self.node = ReplicaNode(cluster, config.data_dir, lambda: _open_store(config),
                                address=config.native.advertised_host or config.native.host,
                                replication_host=cluster.host, on_leading=self._lead,
                                on_leader=self._follow, metadata=self.metadata,
                                tls=replication_tls)
        self.relays: list[Relay] = []
        self.running: RunningBroker | None = None
        self.leader: Node | None = None
        self.metadata_sync = MetadataSync(lambda: self.node.store, self.metadata)
        self._syncing: asyncio.Task | None = None
        self._retaining: asyncio.Task | None = None
        self.tier: Any = None
        """The leader's tier as this node follows it (``tiering.FollowerTier``); None: no tier."""
        if config.tier.url:
            from .tiering import FollowerTier  # pyarrow and boto3: only with a tier

            try:
                self.tier = FollowerTier(config.tier)
            except ValueError as error:
                raise StartupError(str(error)) from None

    # -- following ---------------------------------------------------------------------------

    async def start_relays(self) -> None:
        """Listen on every client port, relaying to the leader (refusing while there is none)."""
        cluster = self.config.cluster
        # Over HTTPS the follower cannot read a request's head: the leader answers them all.
        https = self.config.tls.enabled and self.config.admin.tls
        for dotted, host, port in _listening_ports(self.config):
            answer = self._answer if dotted == "admin.port" and not https else None
            relay = Relay(dotted, cluster.node_id, cluster.secret, answer, local_host=cluster.host,
                          tls=self.node.tls and self.node.tls[1], unrelayed=self._unrelayed)
            await relay.start(host, port)
            self.relays.append(relay)

    async def _follow(self, leader: Node | None) -> None:
        self.leader = leader
        if leader is None:
            log.warning("no leader: client connections are refused until one is elected")
        else:
            log.warning("following %s (epoch of its leadership in /cluster); client connections "
                        "are relayed to it", leader.node)
        target = None
        if leader is not None:
            host, _, port = leader.replication.rpartition(":")
            target = (host, int(port))
        for relay in self.relays:
            await relay.retarget(target)

    async def _answer(self, head: bytes) -> bytes | None:
        """A follower's own answer to ``GET /health`` and ``GET /cluster``; None relays the request."""
        line = head.split(b"\r\n", 1)[0].split(b" ")
        if len(line) != 3 or line[0] != b"GET":
            return None
        path = line[1].split(b"?", 1)[0]
        if path == b"/health":
            return _http(200, {"status": "ok", "cluster": self.health()})
        if path == b"/metrics":
            registry = CollectorRegistry(auto_describe=False)
            registry.register(_Families(self.metrics))
            body = generate_latest(registry)
            return (f"HTTP/1.1 200 OK\r\nContent-Type: {CONTENT_TYPE_LATEST}\r\nContent-Length: {len(body)}\r\n"
                    "Connection: close\r\n\r\n").encode() + body
        if path == b"/cluster":
            try:
                return _http(200, await self.status())
            except EtcdUnavailable as error:
                return _http(503, {"error": "etcd_unavailable", "message": f"etcd does not answer ({error}); "
                                   "the group's state is unknown"})
        return None

    def _unrelayed(self, why: str) -> bytes:
        """A follower's answer to an admin request it cannot pass to the leader: 503, naming the
        leader it follows (if any) and what to do."""
        leader = self.leader.node if self.leader is not None else None
        return _http(503, {"error": "no_leader" if leader is None else "leader_unreachable", "leader": leader,
                           "message": f"node {self.config.cluster.node_id} is a follower and could not pass "
                                      f"this request to the leader{' ' + leader if leader else ''}: {why}; "
                                      "nothing was done: send it again in a few seconds, once a leader "
                                      "serves (GET /cluster on any node shows the group)"})

    # -- the view the admin API shows -------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        coordinator = self.node.coordinator
        leader = coordinator.me.node if self.node.role == "leader" else self.leader and self.leader.node
        return {"node": coordinator.me.node, "role": self.node.role, "leader": leader,
                "epoch": coordinator.epoch or None, "durable_end": self.node.store.durable_offset,
                "confirmed": self.node.confirmed if self.node.leading is None else self.node.leading.shipper.confirmed}

    async def status(self) -> dict[str, Any]:
        return await cluster_status(self.node.coordinator)

    def metrics(self) -> Iterator[Metric]:
        return cluster_metrics(self.node)

    # -- leading -------------------------------------------------------------------------------

    async def _lead(self, leading: Leading) -> None:
        for relay in self.relays:
            await relay.close()
        self.relays = []
        await self._writable(leading)
        # everything this node's log holds is confirmed in its epoch: the metadata takes it all
        await asyncio.to_thread(leading.store.wait_visible, leading.store.appended_end, CATCH_UP_S)
        await asyncio.to_thread(self.metadata_sync.catch_up)
        self.metadata.replicate_through(self.metadata_sync.journal)
        self.running = await _start(self.config, store=leading.store, cluster=self, metadata=self.metadata)
        leading.shipper.relays = RelayIngress(self.running.listener_addresses())
        print(f"Node {self.config.cluster.node_id} leads the group in epoch {leading.epoch}.", flush=True)
        print_endpoints(self.running)

    async def _writable(self, leading: Leading) -> None:
        """Wait until the group takes writes (``min_insync`` replicas in sync): starting the
        broker writes (its own topics, the default user) and those must be replicated."""
        await leading.keeper.checked.wait()  # members that are down have left the in-sync set
        changed = asyncio.Event()
        leading.shipper.add_progress_listener(changed.set)
        while leading.shipper.refusal is not None:
            log.warning("waiting for followers before serving clients: %s", leading.shipper.refusal)
            changed.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(5.0):
                    await changed.wait()

    # -- one run --------------------------------------------------------------------------------

    async def run(self, stopping: asyncio.Event) -> bool:
        """Until ``stopping`` is set (False), or this node is fenced or could not start the
        broker as leader (True: start over)."""
        await self.start_relays()
        self._syncing = asyncio.ensure_future(self.metadata_sync.follow())
        self._retaining = asyncio.ensure_future(self._retain_while_following())
        cluster = self.config.cluster
        print(f"Sluice node {cluster.node_id} of group {cluster.name!r} (etcd {cluster.etcd}), "
              f"replication on {cluster.host}:{cluster.replication_port}, data dir "
              f"{os.path.abspath(self.config.data_dir)}", flush=True)
        print(f"{READY_LINE} Stop it with Ctrl+C or SIGTERM.", flush=True)
        working = asyncio.ensure_future(self._run_node())
        stopped = asyncio.ensure_future(stopping.wait())
        try:
            await asyncio.wait([working, stopped], return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not working.done():
                working.cancel()
                await asyncio.gather(working, return_exceptions=True)
            stopped.cancel()
        fenced = not stopping.is_set()
        failed = working.exception() if working.done() and not working.cancelled() else None
        if isinstance(failed, StartupError):  # a port in use, a locked data dir: the operator must act
            await self.close(give_back_lease=True)
            raise failed
        if failed is not None:  # starting the broker failed (the group stopped taking writes meanwhile)
            log.error("node %s could not serve as leader (%s); it steps down and starts over",
                      self.config.cluster.node_id, failed)
            await self.close(give_back_lease=True)
            return True
        await self.close(give_back_lease=not fenced)
        return fenced

    async def reload_tls(self) -> None:
        """SIGHUP: reload the replication port's certificate and client CA, and the broker's
        while leading."""
        await reload_tls(self.tls, "the replication port")
        if self.running is not None:
            await self.running.reload_tls()

    async def _retain_while_following(self) -> None:
        """Delete a follower's oldest segments by the store's retention limits, as the leader's
        broker does on the leader (only what the group confirmed goes: retention deletes only
        what was dispatched, and a follower dispatches only confirmed records). With a tier,
        the leader's newest manifest is read first: only what it tiered may go."""
        period = self.config.core.retention_check_interval_ms / 1000
        while self.node.leading is None:
            await asyncio.sleep(period)
            if self.node.leading is not None:
                return
            if self.tier is not None:  # the leader's tiered end gates what this node deletes
                self.tier.attach(self.node.store)
                await asyncio.to_thread(self.tier.refresh)
            try:
                report = await asyncio.to_thread(self.node.store.apply_retention)
            except (OSError, ValueError, StoreError) as error:  # the store was being reopened (cut back)
                log.info("retention skipped this time: %s", error)
                continue
            if report.deleted_segments:
                log.info("retention deleted %d segments (%d bytes); the log now starts at offset %d",
                         len(report.deleted_segments), report.deleted_bytes, report.log_min_offset)

    async def _run_node(self) -> None:
        while True:
            try:
                await self.node.run()
                return
            except EtcdUnavailable as error:
                log.error("cannot reach etcd at %s (%s); retrying in %.0f s", self.config.cluster.etcd,
                          error, RETRY_S)
                await asyncio.sleep(RETRY_S)

    async def close(self, give_back_lease: bool) -> None:
        for relay in self.relays:
            await relay.close()
        self.relays = []
        for task in (self._syncing, self._retaining):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        if self.running is not None:
            await self.running.stop()
        await self.node.close(give_back_lease)
        await asyncio.to_thread(self.metadata.close)


async def run_cluster_node(config: Config, stopping: asyncio.Event) -> None:
    """Serve as a node of the group until ``stopping`` is set, starting over after being fenced.
    SIGHUP reloads the TLS certificate."""
    loop = asyncio.get_running_loop()
    while True:
        member = ClusterMember(config)
        loop.add_signal_handler(signal.SIGHUP,
                                lambda: loop.create_task(member.reload_tls(), name="reload-tls"))
        if not await member.run(stopping):
            return
        log.warning("node %s stepped down; it rejoins the group as a follower", config.cluster.node_id)


class _Families(Collector):
    def __init__(self, collect: Callable[[], Iterator[Metric]]) -> None:
        self.collect = collect  # type: ignore[method-assign]


def _http(status: int, body: dict[str, Any]) -> bytes:
    data = json.dumps(body).encode()
    reason = {200: "OK", 503: "Service Unavailable"}[status]
    retry = "Retry-After: 2\r\n" if status == 503 else ""
    return (f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n{retry}"
            "Cache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\nConnection: close\r\n\r\n").encode() + data

