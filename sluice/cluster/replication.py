"""Shipping the commit log from the leader to its followers, and the confirm offset.

The leader (``LogShipper``) serves the replication port. A follower proves it knows the cluster
secret, names its epochs and log end, and is told where to start: the consistent point of the
two histories (``store.epochs``). From there the leader streams durable records in batches that
never span epochs, and the follower (``LogFollower``) appends them verbatim, fsyncs them by its
own group commit and acknowledges its durable end. The confirm offset is the smallest durable
end over the in-sync set, the leader's own included (DESIGN.md I1): nothing above it is
acknowledged to a client or shown to a reader. Each batch carries it, so followers know it too.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from core.untrusted import DenialLog
from store.api import StoreConfig
from store.epochs import Epoch, EpochFile, EpochFileError, EpochHistory, consistent_point

from . import snapshots, wire
from .in_sync import Progress
from .relay import RelayIngress
from .wire import Kind, ProtocolError

log = logging.getLogger(__name__)
_denials = DenialLog(log)

HANDSHAKE_TIMEOUT_S = 10.0
MAX_UNPROVEN = 64
"""Replication connections that may be waiting to prove the cluster secret at once; more are
closed at once, so peers without it cannot hold the port's resources."""
SNAPSHOT_TIMEOUT_S = 300.0
"""How long a follower waits for the leader to make a snapshot, and for each part of it."""
HEARTBEAT_S = 0.5
"""How often an idle leader tells its followers the confirm offset (an empty batch)."""
BATCH_BYTES = 1 << 20


class ReplicatedStore(Protocol):
    """What replication needs of a store (``store.ReplicatedStore`` has it; the composition root
    opens the store and hands it over)."""

    config: StoreConfig
    directory: str
    compaction: Any

    @property
    def durable_offset(self) -> int: ...
    @property
    def appended_end(self) -> int: ...
    @property
    def log_start(self) -> int: ...
    def append_replicated(self, offset: int, data: bytes) -> int: ...
    def read_log(self, offset: int, max_bytes: int, end: int) -> bytes: ...
    def confirm(self, offset: int) -> None: ...
    def refuse_appends(self, reason: str | None) -> None: ...
    def compact(self, topic: str) -> int: ...
    def queue_starts(self) -> tuple[int, list[tuple[str, int, int]]]: ...
    def add_listener(self, listener: Callable[[int, int], None]) -> None: ...
    def remove_listener(self, listener: Callable[[int, int], None]) -> None: ...
    def close(self) -> None: ...


class Refused(Exception):
    """The leader refused this follower; the message says why and what to do."""


class MustInstall(Exception):
    """The leader sent a snapshot (in the file at ``path``): begin the store from it, then rejoin."""

    def __init__(self, path: str) -> None:
        super().__init__(f"a snapshot of the leader's state, in {path}")
        self.path = path


class MustTruncate(Exception):
    """The follower's log goes past the leader's history: cut it at ``offset``, then rejoin."""

    def __init__(self, offset: int) -> None:
        super().__init__(f"the log parts from the leader's at offset {offset}")
        self.offset = offset


@dataclass
class Replica:
    """One follower as the leader sees it."""

    node: str
    address: str
    progress: Progress


class _Signal:
    """Wakes every waiter at once; waiters take ``current`` before they look, so none is missed."""

    def __init__(self) -> None:
        self.current = asyncio.Event()

    def fire(self) -> None:
        self.current.set()
        self.current = asyncio.Event()


def _watch_store(store: ReplicatedStore, signal: _Signal) -> Callable[[int, int], None]:
    """Fire ``signal`` on the loop whenever the store reports progress; returns the listener."""
    loop = asyncio.get_running_loop()

    def listener(visible: int, durable: int) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed
            loop.call_soon_threadsafe(signal.fire)
    store.add_listener(listener)
    return listener


class LogShipper:
    """The leader's side: the replication port, the followers' progress, the confirm offset."""

    def __init__(self, store: ReplicatedStore, epochs: EpochFile, epoch: int, secret: str, node: str,
                 in_sync: Callable[[], Iterable[str]], clock: Callable[[], float] = time.monotonic, *,
                 min_insync: int = 1, may_confirm: Callable[[], bool] = lambda: True,
                 relays: RelayIngress | None = None, snapshot: Callable[[], bytes] | None = None,
                 tls: ssl.SSLContext | None = None) -> None:
        """``may_confirm`` says whether this node still holds its leadership (its lease is
        renewed in time); below ``min_insync`` in-sync replicas or without it, nothing more is
        confirmed and new appends are refused. ``snapshot`` makes the snapshot a follower
        behind the log start gets (``snapshots``; blocking); without it such a follower is
        refused. ``tls``: the replication port's server context (None: plaintext)."""
        if not secret:
            raise ValueError("a cluster needs a secret shared by its nodes ([cluster] secret)")
        self.store, self.epochs, self.epoch, self.node = store, epochs, epoch, node
        self._secret = secret
        self._tls = tls
        self._in_sync = in_sync
        self._clock = clock
        self.min_insync = min_insync
        self._may_confirm = may_confirm
        self.relays = relays
        """Where client connections relayed by followers go (None: refused)."""
        self._snapshot = snapshot
        self.refusal: str | None = None
        """Why this leader refuses publishes right now (None while it takes them)."""
        self.replicas: dict[str, Replica] = {}
        self.confirmed = 0
        self._confirm_listeners: list[Callable[[int], None]] = []
        self._progress_listeners: list[Callable[[], None]] = []
        self._signal = _Signal()
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task] = set()
        self._unproven: set[asyncio.Task] = set()
        """Connections that have not proved the cluster secret yet (at most MAX_UNPROVEN)."""
        loop = asyncio.get_running_loop()

        def listener(visible: int, durable: int) -> None:
            with contextlib.suppress(RuntimeError):  # the loop is closed
                loop.call_soon_threadsafe(self.update)
        self._listener = listener
        store.add_listener(listener)

    # -- the confirm offset ----------------------------------------------------------------------

    def confirm_offset(self) -> int:
        """The smallest durable end over the in-sync set (a member not connected counts as what
        it last acknowledged): records below it are on the disk of every in-sync replica."""
        ends = [self.store.durable_offset]
        for member in self._in_sync():
            if member != self.node:
                replica = self.replicas.get(member)
                ends.append(replica.progress.durable if replica is not None else 0)
        return min(ends)

    def add_confirm_listener(self, listener: Callable[[int], None]) -> None:
        """Call ``listener(confirm_offset)`` on the event loop each time it advances."""
        self._confirm_listeners.append(listener)

    def follower_positions(self, now: float) -> dict[str, tuple[int, int, float, bool]]:
        """Follower -> (durable end, bytes behind the leader, seconds it has not held
        everything the leader had (0 while it does), connected)."""
        durable = self.store.durable_offset
        found = {}
        for node, replica in self.replicas.items():
            progress = replica.progress
            behind = max(0, durable - progress.durable)
            found[node] = (progress.durable, behind, now - progress.caught_up_at if behind else 0.0,
                           progress.connected)
        return found

    def in_sync_members(self) -> set[str]:
        """The members confirms wait for now."""
        return set(self._in_sync())

    def add_progress_listener(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` on the event loop whenever a durable end moves."""
        self._progress_listeners.append(listener)

    def _why_refused(self) -> str | None:
        if not self._may_confirm():
            return ("this node no longer holds the leadership (its etcd lease was not renewed in "
                    "time); reconnect: another node leads")
        in_sync = len(self.in_sync_members())
        if in_sync < self.min_insync:
            return (f"only {in_sync} replica(s) in sync, min_insync is {self.min_insync}: publishes "
                    "are refused until a follower catches up")
        return None

    def update(self) -> None:
        """Durable ends or the in-sync set moved: advance the confirm offset, wake the senders."""
        refusal = self._why_refused()
        if refusal != self.refusal:
            self.refusal = refusal
            self.store.refuse_appends(refusal)
            if refusal is None:
                log.warning("publishes are taken again: %d replicas in sync", len(self.in_sync_members()))
            else:
                log.error("publishes are refused: %s", refusal)
        confirmed = self.confirm_offset() if refusal is None else self.confirmed
        if confirmed > self.confirmed:
            self.confirmed = confirmed
            self.store.confirm(confirmed)
            for listener in self._confirm_listeners:
                listener(confirmed)
        for progressed in self._progress_listeners:
            progressed()
        self._signal.fire()

    # -- serving followers -----------------------------------------------------------------------

    async def start(self, host: str, port: int) -> int:
        """Record this epoch's start, listen on ``host:port`` (0: any free port); return the port."""
        latest = self.epochs.history.latest
        if latest is None or latest.epoch < self.epoch:
            self.epochs.begin(self.epoch, self.store.appended_end)
        self.confirmed = self.confirm_offset()
        self.store.confirm(self.confirmed)  # from now on readers and acknowledgements wait for it
        self.update()
        handshake = {"ssl_handshake_timeout": HANDSHAKE_TIMEOUT_S} if self._tls is not None else {}
        self._server = await asyncio.start_server(self._accept, host, port, ssl=self._tls,
                                                  **handshake)
        return self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        self.store.remove_listener(self._listener)
        if self._server is not None:
            self._server.close()
        tasks = list(self._connections)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        peer_host, peer_port = writer.get_extra_info("peername")[:2]
        peer = f"{peer_host}:{peer_port}"
        if len(self._unproven) >= MAX_UNPROVEN:
            _denials.denied(peer_host, "busy", "replication peer %s closed at once: %d connections have not "
                            "proved the cluster secret yet", peer, len(self._unproven))
            writer.close()
            return
        self._connections.add(task)
        self._unproven.add(task)
        try:
            await self._serve(reader, writer, peer)
        except ProtocolError as error:
            _denials.denied(peer_host, "protocol", "replication peer %s closed: %s", peer, error)
        except asyncio.TimeoutError:
            _denials.denied(peer_host, "timeout", "replication peer %s closed: it did not say who it is within "
                            "%.0f s", peer, HANDSHAKE_TIMEOUT_S)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self._unproven.discard(task)
            self._connections.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: str) -> None:
        challenge = os.urandom(wire.CHALLENGE_SIZE)
        writer.write(wire.frame(Kind.CHALLENGE, challenge))
        async with asyncio.timeout(HANDSHAKE_TIMEOUT_S):
            kind, payload = await wire.read_frame(reader, 0)
        if kind is Kind.RELAY:
            await self._serve_relay(wire.decode_relay(payload), challenge, reader, writer)
            return
        if kind is not Kind.HELLO:
            raise ProtocolError(f"expected HELLO or RELAY, got {kind.name}")
        hello = wire.decode_hello(payload)
        if not wire.proves(self._secret, challenge, hello):
            await self._refuse(writer, "wrong cluster secret")
            raise ProtocolError(f"{hello.node!r} does not know the cluster secret")
        self._unproven.discard(asyncio.current_task())
        if hello.segment_size != self.store.config.segment_size:
            await self._refuse(writer, f"segment_size {hello.segment_size} differs from the leader's "
                                       f"{self.store.config.segment_size}; every node needs the same")
            raise ProtocolError(f"{hello.node} has segment_size {hello.segment_size}")
        leader_end = self.store.durable_offset
        try:
            history = EpochHistory([Epoch(epoch, start) for epoch, start in hello.epochs])
        except EpochFileError as error:
            raise ProtocolError(f"HELLO with {error}") from None
        start = consistent_point(history, hello.end, lambda epoch: self.epochs.history.end_of(epoch, leader_end))
        if start < self.store.log_start:
            await self._send_snapshot(writer, hello.node, start)
            return
        writer.write(wire.encode_start(self.epoch, start))
        await writer.drain()
        replica = Replica(hello.node, peer, Progress(min(start, hello.end), self._clock()))
        self.replicas[hello.node] = replica
        log.info("follower %s (%s) replicates from offset %d in epoch %d", hello.node, peer, start, self.epoch)
        acks = asyncio.ensure_future(self._read_acks(reader, replica))
        try:
            await self._send(writer, start, acks, replica)
        finally:
            acks.cancel()
            replica.progress.connected = False

    async def _send_snapshot(self, writer: asyncio.StreamWriter, node: str, start: int) -> None:
        """``node`` shares history with this log only below its start (retention deleted the
        rest): send it a snapshot to begin from, or refuse it when there is none to send."""
        log_start = self.store.log_start
        if self._snapshot is None:
            await self._refuse(writer, f"the leader's log now begins at offset {log_start} (retention) and "
                                       f"this node has only up to {start} in common with it")
            raise ProtocolError(f"{node} is behind the leader's retention")
        log.warning("follower %s has only up to offset %d in common with this log, which now begins at %d "
                    "(retention): sending it a snapshot to begin from", node, start, log_start)
        writer.write(wire.frame(Kind.SNAPSHOT))  # one follows: the follower waits while it is made
        await writer.drain()
        data = await asyncio.to_thread(self._snapshot)
        await snapshots.send(writer, data)
        log.info("sent follower %s a snapshot of %d bytes", node, len(data))

    async def _serve_relay(self, request: wire.RelayRequest, challenge: bytes, reader: asyncio.StreamReader,
                           writer: asyncio.StreamWriter) -> None:
        if not wire.proves_relay(self._secret, challenge, request):
            await self._refuse(writer, "wrong cluster secret")
            raise ProtocolError(f"{request.node!r} does not know the cluster secret")
        self._unproven.discard(asyncio.current_task())
        if self.relays is None:  # elected a moment ago: the broker is starting
            await self._refuse(writer, "this node serves no clients yet")
            return
        await self.relays.serve(request, reader, writer)

    async def _refuse(self, writer: asyncio.StreamWriter, reason: str) -> None:
        writer.write(wire.frame(Kind.REFUSED, reason.encode()))
        with contextlib.suppress(ConnectionError):
            await writer.drain()

    async def _read_acks(self, reader: asyncio.StreamReader, replica: Replica) -> None:
        while True:
            kind, payload = await wire.read_frame(reader, 0)
            if kind is not Kind.ACK:
                raise ProtocolError(f"expected ACK, got {kind.name}")
            durable = wire.decode_ack(payload)
            if durable > self.store.durable_offset:
                raise ProtocolError(f"{replica.node} acknowledged offset {durable}, beyond what was sent")
            replica.progress.acknowledged(durable, self.store.durable_offset, self._clock())
            self.update()

    async def _send(self, writer: asyncio.StreamWriter, offset: int, acks: asyncio.Future, replica: Replica) -> None:
        told, last_sent = -1, 0.0
        while not acks.done():
            wakeup = self._signal.current
            end = self.epochs.history.next_start(offset) or self.store.durable_offset
            records = self.store.read_log(offset, BATCH_BYTES, end)
            now = self._clock()
            if not records and replica.progress.durable >= offset:
                replica.progress.caught_up_at = now  # idle and holding everything: it keeps up
            if records or self.confirmed != told or now - last_sent >= HEARTBEAT_S:
                epoch = self.epochs.history.epoch_at(offset) if records else self.epoch
                writer.write(wire.encode_batch(epoch, offset, self.confirmed, records))
                await writer.drain()
                offset += len(records)
                told, last_sent = self.confirmed, now
                continue
            with contextlib.suppress(asyncio.TimeoutError):
                async with asyncio.timeout(HEARTBEAT_S):
                    await wakeup.wait()
        acks.result()  # raises what ended the follower's side


class LogFollower:
    """The follower's side: fetch from the leader, append, acknowledge what is durable."""

    def __init__(self, store: ReplicatedStore, epochs: EpochFile, node: str, secret: str,
                 local_host: str | None = None, snapshot_path: str | None = None,
                 tls: ssl.SSLContext | None = None) -> None:
        """``local_host``: the address this node connects from (its own), so the leader and any
        firewall see which node it is; ``snapshot_path``: where a snapshot the leader sends is
        kept (None: one is a protocol error); ``tls``: the client context that verifies the
        leader's replication port (None: plaintext)."""
        self._tls = tls
        self.store, self.epochs, self.node = store, epochs, node
        self._snapshot_path = snapshot_path
        self._local = (local_host, 0) if local_host else None
        self._secret = secret
        self.confirmed = 0
        """The highest confirm offset the leader has told; a cut below it is refused."""
        self.leader_epoch = 0
        self._signal = _Signal()
        self._confirm_listeners: list[Callable[[int], None]] = []

    def add_confirm_listener(self, listener: Callable[[int], None]) -> None:
        """Call ``listener(confirm_offset)`` each time the leader's confirm offset advances."""
        self._confirm_listeners.append(listener)

    async def follow(self, host: str, port: int) -> None:
        """Replicate from the leader at ``host:port`` until the connection ends. Raises
        MustTruncate when the log must be cut first, Refused when the leader refuses, and
        ProtocolError, ConnectionError or IncompleteReadError when the connection fails."""
        self.store.confirm(self.confirmed)  # readers here see only what the group confirmed
        reader, writer = await asyncio.open_connection(host, port, local_addr=self._local,
                                                       ssl=self._tls,
                                                       server_hostname=self._tls and host)
        listener = _watch_store(self.store, self._signal)
        try:
            await self._follow(reader, writer)
        finally:
            self.store.remove_listener(listener)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _follow(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        async with asyncio.timeout(HANDSHAKE_TIMEOUT_S):
            kind, challenge = await wire.read_frame(reader, 0)
        if kind is not Kind.CHALLENGE or len(challenge) != wire.CHALLENGE_SIZE:
            raise ProtocolError("the leader did not open with a challenge")
        end = self.store.appended_end
        writer.write(wire.encode_hello(wire.Hello(
            self.node, wire.proof(self._secret, challenge, self.node),
            [(entry.epoch, entry.start) for entry in self.epochs.history.entries], end, self.confirmed,
            self.store.config.segment_size)))
        async with asyncio.timeout(HANDSHAKE_TIMEOUT_S):
            kind, payload = await wire.read_frame(reader, 0)
        if kind is Kind.REFUSED:
            raise Refused(payload.decode(errors="replace"))
        if kind is Kind.SNAPSHOT and self._snapshot_path is not None:
            async with asyncio.timeout(SNAPSHOT_TIMEOUT_S):
                kind, payload = await wire.read_frame(reader, 0)  # the leader made it meanwhile
            if kind is not Kind.SNAPSHOT:
                raise ProtocolError(f"expected SNAPSHOT, got {kind.name}")
            await snapshots.receive(reader, payload, self._snapshot_path, SNAPSHOT_TIMEOUT_S)
            raise MustInstall(self._snapshot_path)
        if kind is not Kind.START:
            raise ProtocolError(f"expected START, got {kind.name}")
        epoch, start = wire.decode_start(payload)
        latest = self.epochs.history.latest
        if latest is not None and epoch < latest.epoch:
            raise ProtocolError(f"the leader is in epoch {epoch}, older than this node's {latest.epoch}")
        if start < end:
            raise MustTruncate(start)
        if start > end:
            raise ProtocolError(f"the leader starts this node at {start}, past its end {end}")
        self.leader_epoch = epoch
        acks = asyncio.ensure_future(self._acknowledge(writer))
        try:
            await self._receive(reader, acks)
        finally:
            acks.cancel()
            await asyncio.gather(acks, return_exceptions=True)

    async def _receive(self, reader: asyncio.StreamReader, acks: asyncio.Future) -> None:
        limit = self.store.config.segment_size
        while not acks.done():
            async with asyncio.timeout(4 * HEARTBEAT_S + 5):
                kind, payload = await wire.read_frame(reader, limit)
            if kind is not Kind.BATCH:
                raise ProtocolError(f"expected BATCH, got {kind.name}")
            epoch, offset, confirmed, records = wire.decode_batch(payload)
            if epoch > self.leader_epoch:
                raise ProtocolError(f"a batch of epoch {epoch} from the leader of epoch {self.leader_epoch}")
            if records:
                latest = self.epochs.history.latest
                if latest is None or epoch > latest.epoch:
                    self.epochs.begin(epoch, offset)
                elif epoch < latest.epoch:
                    raise ProtocolError(f"a batch of epoch {epoch} after epoch {latest.epoch} began")
                self.store.append_replicated(offset, records)
            confirmed = min(confirmed, self.store.appended_end)
            if confirmed > self.confirmed:
                self.confirmed = confirmed
                self.store.confirm(confirmed)
                for listener in self._confirm_listeners:
                    listener(confirmed)
        acks.result()

    async def _acknowledge(self, writer: asyncio.StreamWriter) -> None:
        told = -1
        while True:
            wakeup = self._signal.current
            durable = self.store.durable_offset
            if durable != told:
                writer.write(wire.encode_ack(durable))
                await writer.drain()
                told = durable
                continue
            await wakeup.wait()
