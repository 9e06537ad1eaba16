"""A follower's client port: every connection relayed byte for byte to the leader.

No MQTT, AMQP or RocketMQ client follows a redirect, so a follower listens on every protocol port
and passes each connection on at layer 4. The internal hop goes to the leader's replication port,
where the relay proves it knows the cluster secret and names the listener and, in a PROXY v1
header, the client (``wire.RELAY``); the leader connects it to its own listener and records the
client's address for that connection (``protocols.relayed_peers``), so logs, ``client list`` and
loopback-only users see the client. The follower acknowledges nothing itself. When the leader
changes, every relayed connection is closed and clients reconnect to any node; while no leader is
known, connections are closed at once (an HTTP request gets an answer saying why first).
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import time
from collections.abc import Awaitable, Callable, Mapping

from protocols import proxy_header, relayed_peers

from . import wire
from .wire import Kind, ProtocolError

log = logging.getLogger(__name__)

CHUNK = 64 << 10
CONNECT_TIMEOUT_S = 5.0
REFUSAL_LOG_S = 60.0


class Relay:
    """Listens on ``host:port`` and relays to the leader's replication port ``target`` (host,
    port), or refuses while it is None."""

    def __init__(self, listener: str, node: str, secret: str,
                 answer: Callable[[bytes], Awaitable[bytes | None]] | None = None,
                 local_host: str | None = None,
                 tls: Callable[[], ssl.SSLContext] | None = None,
                 unrelayed: Callable[[str], bytes] | None = None) -> None:
        """``answer``, for an HTTP port: given a request's head, the whole response this node
        gives itself (its own health and cluster view), or None to relay the request;
        ``unrelayed``, with it: the whole response to a request that cannot be relayed, given
        why. ``tls``: what gives the client context that verifies the leader's replication
        port, asked for each connection so that a reloaded CA applies (None: plaintext)."""
        self._tls = tls
        self.listener, self.node, self._secret = listener, node, secret
        self._answer = answer
        self._unrelayed = unrelayed if answer is not None else None
        self._local = (local_host, 0) if local_host else None
        self._refusals = 0
        self._refusal_logged_at = -REFUSAL_LOG_S
        """The address connections to the leader come from (this node's own)."""
        self.target: tuple[str, int] | None = None
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task] = set()

    async def start(self, host: str, port: int) -> int:
        self._server = await asyncio.start_server(self._relay, host, port, reuse_address=True)
        return self._server.sockets[0].getsockname()[1]

    async def retarget(self, target: tuple[str, int] | None) -> None:
        """Relay new connections to ``target`` and close every connection relayed so far."""
        self.target = target
        await self._close_connections()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        await self._close_connections()
        if self._server is not None:
            await self._server.wait_closed()

    async def _close_connections(self) -> None:
        tasks = list(self._connections)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _relay(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._connections.add(task)
        leader_writer = None
        try:
            head = b""
            if self._answer is not None:
                try:
                    async with asyncio.timeout(CONNECT_TIMEOUT_S):
                        head = await client_reader.readuntil(b"\r\n\r\n")
                except (asyncio.LimitOverrunError, asyncio.IncompleteReadError, TimeoutError, ConnectionError):
                    return
                response = await self._answer(head)
                if response is not None:
                    client_writer.write(response)
                    return
            target = self.target
            if target is None:
                self._not_relayed(client_writer, "the group has no leader right now")
                return
            try:
                async with asyncio.timeout(CONNECT_TIMEOUT_S):
                    leader_reader, leader_writer = await asyncio.open_connection(
                        *target, local_addr=self._local, ssl=self._tls and self._tls(),
                        server_hostname=self._tls and target[0])
                    await self._introduce(client_writer, leader_reader, leader_writer)
            except (OSError, TimeoutError, asyncio.IncompleteReadError, ProtocolError) as error:
                why = str(error) or type(error).__name__
                self._refused(target, why)
                self._not_relayed(client_writer, f"the leader at {target[0]}:{target[1]} did not take "
                                                 f"the request ({why})")
                return
            leader_writer.write(head)
            await _pump_both(client_reader, client_writer, leader_reader, leader_writer)
        except asyncio.CancelledError:  # the leader changed or the relay closes: end quietly
            pass
        finally:
            self._connections.discard(task)
            for writer in (client_writer, leader_writer):
                if writer is not None:
                    writer.close()
                    with contextlib.suppress(Exception):
                        await writer.wait_closed()

    def _not_relayed(self, client: asyncio.StreamWriter, why: str) -> None:
        """Answer an HTTP request that was read and will not be relayed (nothing reached the
        leader), when this port has such an answer."""
        if self._unrelayed is not None:
            client.write(self._unrelayed(why))

    def _refused(self, target: tuple[str, int], why: str) -> None:
        """Log that the leader did not take a connection: the first time, then once a minute
        with how many more it refused, not once per client."""
        now = time.monotonic()
        self._refusals += 1
        if now - self._refusal_logged_at >= REFUSAL_LOG_S:
            log.info("%s relay: the leader at %s:%d did not take %d client connection(s) (last: %s); "
                     "they were closed, their clients reconnect", self.listener, *target, self._refusals, why)
            self._refusal_logged_at, self._refusals = now, 0

    async def _introduce(self, client: asyncio.StreamWriter, reader: asyncio.StreamReader,
                         writer: asyncio.StreamWriter) -> None:
        kind, challenge = await wire.read_frame(reader, 0)
        if kind is not Kind.CHALLENGE or len(challenge) != wire.CHALLENGE_SIZE:
            raise ProtocolError("the leader did not open with a challenge")
        header = proxy_header.encode(client.get_extra_info("peername")[:2], client.get_extra_info("sockname")[:2])
        writer.write(wire.encode_relay(wire.RelayRequest(
            self.node, wire.proof(self._secret, challenge, self.node), self.listener, header)))
        kind, payload = await wire.read_frame(reader, 0)
        if kind is Kind.REFUSED:
            raise ProtocolError(f"refused: {payload.decode(errors='replace')}")
        if kind is not Kind.RELAY:
            raise ProtocolError(f"expected RELAY, got {kind.name}")


class RelayIngress:
    """The leader's side of relayed connections: each is connected to this node's own listener
    for it, and the client's address recorded for that local connection."""

    def __init__(self, listeners: Mapping[str, tuple[str, int]]) -> None:
        """``listeners``: listener name -> (host, port) of this node's listener."""
        self.listeners = dict(listeners)

    async def serve(self, request: wire.RelayRequest, reader: asyncio.StreamReader,
                    writer: asyncio.StreamWriter) -> None:
        target = self.listeners.get(request.listener)
        if target is None:
            writer.write(wire.frame(Kind.REFUSED, f"no {request.listener!r} listener here".encode()))
            raise ProtocolError(f"{request.node} relayed to an unknown listener {request.listener!r}")
        try:
            client = proxy_header.decode(request.proxy)
        except proxy_header.ProxyHeaderError as error:
            raise ProtocolError(f"RELAY with {error}") from None
        sock = socket.socket(socket.AF_INET6 if ":" in target[0] else socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            sock.bind((target[0], 0))  # the local end is known, and recorded, before the listener sees it
            local = sock.getsockname()[:2]
            if client.host is not None and client.port is not None:
                relayed_peers.register(local, (client.host, client.port))
            await asyncio.get_running_loop().sock_connect(sock, target)
        except BaseException:
            relayed_peers.forget(sock.getsockname()[:2])
            sock.close()
            raise
        local_reader, local_writer = await asyncio.open_connection(sock=sock)
        try:
            writer.write(wire.frame(Kind.RELAY))
            await _pump_both(reader, writer, local_reader, local_writer)
        finally:
            relayed_peers.forget(local)
            local_writer.close()
            with contextlib.suppress(Exception):
                await local_writer.wait_closed()


async def _pump_both(reader_a: asyncio.StreamReader, writer_a: asyncio.StreamWriter,
                     reader_b: asyncio.StreamReader, writer_b: asyncio.StreamWriter) -> None:
    """Copy a to b and b to a until either side ends."""
    pumps = [asyncio.ensure_future(_pump(reader_a, writer_b)), asyncio.ensure_future(_pump(reader_b, writer_a))]
    try:
        await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for pump in pumps:
            pump.cancel()
        await asyncio.gather(*pumps, return_exceptions=True)


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy until end of stream, waiting for the other side to take each chunk (backpressure)."""
    with contextlib.suppress(ConnectionError):
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
