"""A follower's relay: bytes both ways through the leader's replication port, the client's
address known to the leader's listener, connections closed when the leader changes and refused
while there is none (an HTTP request answered with why), and nothing relayed for a peer without
the cluster secret."""
from __future__ import annotations

import asyncio

from protocols import relayed_peers
from sluice.cluster.relay import Relay, RelayIngress
from sluice.cluster.replication import LogShipper
from store.api import StoreConfig
from store.epochs import EpochFile
from store.file_store import FileStore

SECRET = "s3cret"
WAIT = 30


class EchoListener:
    """A stand-in for the leader's MQTT listener: records who it thinks the peer is, then echoes."""

    def __init__(self) -> None:
        self.peers: asyncio.Queue = asyncio.Queue()

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self.server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await self.peers.put(relayed_peers.client_address(writer.get_extra_info("peername")))
        while data := await reader.read(1 << 16):
            writer.write(data)
            await writer.drain()
        writer.close()


async def leader_with(tmp_path, listener_port: int) -> tuple[LogShipper, int, FileStore]:
    store = FileStore(str(tmp_path), StoreConfig(segment_size=64 << 10))
    shipper = LogShipper(store, EpochFile(str(tmp_path)), 1, SECRET, "n1", lambda: ["n1"],
                         relays=RelayIngress({"mqtt": ("127.0.0.1", listener_port)}))
    return shipper, await shipper.start("127.0.0.1", 0), store


def test_the_relay_passes_bytes_both_ways_and_the_leader_sees_the_clients_address(tmp_path):
    async def scenario():
        listener = EchoListener()
        shipper, replication_port, store = await leader_with(tmp_path, await listener.start())
        relay = Relay("mqtt", "n2", SECRET)
        port = await relay.start("127.0.0.1", 0)
        await relay.retarget(("127.0.0.1", replication_port))
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        seen = await asyncio.wait_for(listener.peers.get(), WAIT)
        assert seen == "%s:%d" % writer.get_extra_info("sockname")[:2]
        payload = bytes(range(256)) * 4096  # 1 MiB, more than any socket buffer
        writer.write(payload)
        echoed = await asyncio.wait_for(reader.readexactly(len(payload)), WAIT)
        assert echoed == payload
        # the leader changes: relayed connections close, and new ones go to the new leader
        await relay.retarget(None)
        assert await asyncio.wait_for(reader.read(), WAIT) == b""
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        assert await asyncio.wait_for(reader.read(), WAIT) == b"", "no leader: refused"
        await relay.retarget(("127.0.0.1", replication_port))
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"again")
        assert await asyncio.wait_for(reader.readexactly(5), WAIT) == b"again"
        writer.close()
        await relay.close()
        await shipper.close()
        listener.server.close()
        store.close()
        assert not relayed_peers._relayed, "every relayed connection is forgotten once closed"
    asyncio.run(scenario())


def test_a_relay_without_the_cluster_secret_reaches_no_listener(tmp_path):
    async def scenario():
        listener = EchoListener()
        shipper, replication_port, store = await leader_with(tmp_path, await listener.start())
        relay = Relay("mqtt", "intruder", "guessed")
        port = await relay.start("127.0.0.1", 0)
        await relay.retarget(("127.0.0.1", replication_port))
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"CONNECT")
        assert await asyncio.wait_for(reader.read(), WAIT) == b""
        assert listener.peers.empty(), "nothing reached the leader's listener"
        other = Relay("nonesuch", "n2", SECRET)  # the secret, but a listener the leader does not have
        port = await other.start("127.0.0.1", 0)
        await other.retarget(("127.0.0.1", replication_port))
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        assert await asyncio.wait_for(reader.read(), WAIT) == b""
        assert listener.peers.empty()
        for closing in (relay, other, shipper):
            await closing.close()
        listener.server.close()
        store.close()
    asyncio.run(scenario())


def test_an_http_request_that_cannot_be_relayed_gets_the_ports_answer_saying_why(tmp_path):
    """The admin port's relay reads each request's head: one it can pass to no leader is answered
    (the follower's 503), not dropped; nothing reaches a leader's listener."""
    async def scenario():
        async def relay_everything(head: bytes) -> None:
            return None
        relay = Relay("admin.port", "n2", SECRET, relay_everything,
                      unrelayed=lambda why: b"HTTP/1.1 503 Service Unavailable\r\n\r\n" + why.encode())
        port = await relay.start("127.0.0.1", 0)
        request = b"POST /events/evt2/a HTTP/1.1\r\nHost: n2\r\nContent-Length: 2\r\n\r\n{}"

        async def answer() -> bytes:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(request)
            answered = await asyncio.wait_for(reader.read(), WAIT)
            writer.close()
            return answered
        assert await answer() == b"HTTP/1.1 503 Service Unavailable\r\n\r\nthe group has no leader right now"
        closed = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
        gone = closed.sockets[0].getsockname()[1]
        closed.close()
        await closed.wait_closed()  # a leader that died: nothing listens there any more
        await relay.retarget(("127.0.0.1", gone))
        answered = await answer()
        assert answered.startswith(b"HTTP/1.1 503 Service Unavailable\r\n\r\nthe leader at 127.0.0.1:%d did "
                                   b"not take the request (" % gone), answered
        await relay.close()
    asyncio.run(scenario())
