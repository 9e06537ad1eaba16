"""A follower's client port: every connection relayed byte for byte to the leader's same port.

No MQTT, AMQP or RocketMQ client follows a redirect, so a follower listens on every protocol port
and passes each connection on at layer 4, opening the connection to the leader with a PROXY v1
header so the leader sees the client's own address (for logs, ``client list`` and loopback-only
guest). The follower acknowledges nothing itself. When the leader changes, every relayed
connection is closed and clients reconnect to any node; while no leader is known, connections
are refused (closed at once).
"""
from __future__ import annotations

import asyncio
import contextlib
import logging

from protocols import proxy_header

log = logging.getLogger(__name__)

CHUNK = 64 << 10
CONNECT_TIMEOUT_S = 5.0


class Relay:
    """Listens on ``host:port`` and relays to ``target`` (host, port), or refuses while it is None."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.target: tuple[str, int] | None = None
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task] = set()

    async def start(self, host: str, port: int) -> int:
        self._server = await asyncio.start_server(self._relay, host, port)
        return self._server.sockets[0].getsockname()[1]

    async def retarget(self, target: tuple[str, int] | None) -> None:
        """Relay new connections to ``target`` and close every connection relayed so far."""
        self.target = target
        await self._close_connections()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        await self._close_connections()

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
            target = self.target
            if target is None:
                return
            try:
                async with asyncio.timeout(CONNECT_TIMEOUT_S):
                    leader_reader, leader_writer = await asyncio.open_connection(*target)
            except (OSError, TimeoutError) as error:
                log.info("%s relay: the leader at %s:%d is unreachable (%s); closing the client's connection",
                         self.name, *target, error or "timed out")
                return
            leader_writer.write(proxy_header.encode(client_writer.get_extra_info("peername")[:2],
                                                    client_writer.get_extra_info("sockname")[:2]))
            pumps = [asyncio.ensure_future(_pump(client_reader, leader_writer)),
                     asyncio.ensure_future(_pump(leader_reader, client_writer))]
            try:
                await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for pump in pumps:
                    pump.cancel()
                await asyncio.gather(*pumps, return_exceptions=True)
        finally:
            self._connections.discard(task)
            for writer in (client_writer, leader_writer):
                if writer is not None:
                    writer.close()
                    with contextlib.suppress(Exception):
                        await writer.wait_closed()


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy until end of stream, waiting for the other side to take each chunk (backpressure)."""
    with contextlib.suppress(ConnectionError):
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
