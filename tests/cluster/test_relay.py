"""A follower's relay: bytes both ways, the client's address passed on, connections closed when
the leader changes and refused while there is none."""
from __future__ import annotations

import asyncio

from protocols.proxy_header import decode, header_length
from sluice.cluster.relay import Relay

WAIT = 30


class EchoLeader:
    """A stand-in for the leader's listener: reads the PROXY header, then echoes."""

    def __init__(self) -> None:
        self.clients: asyncio.Queue = asyncio.Queue()

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self.server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        line = await reader.readuntil(b"\r\n")
        assert header_length(line) == len(line)
        await self.clients.put(decode(line))
        while data := await reader.read(1 << 16):
            writer.write(data)
            await writer.drain()
        writer.close()


def test_the_relay_passes_bytes_both_ways_with_the_clients_address():
    async def scenario():
        leader = EchoLeader()
        leader_port = await leader.start()
        relay = Relay("mqtt")
        port = await relay.start("127.0.0.1", 0)
        await relay.retarget(("127.0.0.1", leader_port))
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        client = await asyncio.wait_for(leader.clients.get(), WAIT)
        assert (client.host, client.port) == writer.get_extra_info("sockname")[:2]
        payload = bytes(range(256)) * 4096  # 1 MiB, more than any socket buffer
        writer.write(payload)
        echoed = await asyncio.wait_for(reader.readexactly(len(payload)), WAIT)
        assert echoed == payload
        # the leader changes: relayed connections close, and new ones go to the new leader
        await relay.retarget(None)
        assert await asyncio.wait_for(reader.read(), WAIT) == b""
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        assert await asyncio.wait_for(reader.read(), WAIT) == b"", "no leader: refused"
        await relay.retarget(("127.0.0.1", leader_port))
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"again")
        assert await asyncio.wait_for(reader.readexactly(5), WAIT) == b"again"
        writer.close()
        await relay.close()
        leader.server.close()
    asyncio.run(scenario())
