"""The replication port's authorization matrix: every operation a peer can attempt on a leader's
replication port × {no secret, a wrong secret, the cluster secret}. Only the last gets anything:
the log, a snapshot, a relayed client connection. Nothing a peer sends can put a record into the leader's
log (the port takes acknowledgements, never records), and peers that never prove the secret
cannot hold more than a bounded number of connections."""
from __future__ import annotations

import asyncio
import json

import pytest

from sluice.cluster import replication, wire
from sluice.cluster.relay import RelayIngress
from sluice.cluster.replication import LogShipper
from sluice.cluster.wire import Kind
from tests.cluster.test_replication import SECRET, WAIT, Node, publish

PEERS = {"no secret": "", "wrong secret": "guessed", "cluster secret": SECRET}


@pytest.fixture
def leader(tmp_path):
    node = Node(tmp_path / "n1")
    yield node
    node.store.close()


async def serving(node: Node, listener_port: int) -> tuple[LogShipper, int]:
    shipper = LogShipper(node.store, node.epochs, 4, SECRET, "n1", lambda: ["n1"],
                         relays=RelayIngress({"mqtt.port": ("127.0.0.1", listener_port)}))
    return shipper, await shipper.start("127.0.0.1", 0)


async def attempt(port: int, first_frame) -> tuple[list[tuple[Kind, bytes]], bool]:
    """Connect, answer the challenge with ``first_frame(challenge)``; the frames the leader sent
    after it, and whether it closed the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    kind, challenge = await wire.read_frame(reader, 0)
    assert kind is Kind.CHALLENGE
    writer.write(first_frame(challenge))
    frames, closed = [], False
    try:
        async with asyncio.timeout(2):  # a leader that sends nothing more within 2 s keeps it open
            while True:
                frames.append(await wire.read_frame(reader, 64 << 20))
    except asyncio.IncompleteReadError:
        closed = True
    except TimeoutError:
        pass
    writer.close()
    return frames, closed


def hello(secret: str):
    return lambda challenge: wire.encode_hello(wire.Hello(
        "n9", wire.proof(secret, challenge, "n9") if secret else b"", [], 0, 0, 64 << 10))


def relay(secret: str):
    return lambda challenge: wire.encode_relay(wire.RelayRequest(
        "n9", wire.proof(secret, challenge, "n9") if secret else b"", "mqtt.port",
        b"PROXY TCP4 127.0.0.9 127.0.0.1 5000 1883\r\n"))


EXPECTED = {  # (operation, peer) -> what the peer gets
    ("fetch the log", "no secret"): "refused", ("fetch the log", "wrong secret"): "refused",
    ("fetch the log", "cluster secret"): "records",
    ("relay a client", "no secret"): "refused", ("relay a client", "wrong secret"): "refused",
    ("relay a client", "cluster secret"): "relayed",
}


@pytest.mark.parametrize("operation, peer", list(EXPECTED))
def test_only_a_peer_with_the_cluster_secret_gets_the_log_or_a_relay(leader, operation, peer):
    async def scenario():
        reached = asyncio.Event()

        async def listener(reader, writer):
            reached.set()
            writer.close()
        server = await asyncio.start_server(listener, "127.0.0.1", 0)
        shipper, port = await serving(leader, server.sockets[0].getsockname()[1])
        end = publish(leader.store, 20)
        assert await asyncio.to_thread(leader.store.wait_durable, end, WAIT)
        try:
            frame = hello if operation == "fetch the log" else relay
            frames, closed = await attempt(port, frame(PEERS[peer]))
            kinds = [kind for kind, _ in frames]
            if EXPECTED[operation, peer] == "refused":
                assert closed and kinds == [Kind.REFUSED], kinds
                assert not reached.is_set(), "a refused relay reached the listener"
            elif EXPECTED[operation, peer] == "records":
                assert kinds[0] is Kind.START and Kind.BATCH in kinds
                assert any(wire.decode_batch(payload)[3] for kind, payload in frames if kind is Kind.BATCH)
            else:
                assert kinds[:1] == [Kind.RELAY]
                await asyncio.wait_for(reached.wait(), WAIT)
        finally:
            await shipper.close()
            server.close()
    asyncio.run(scenario())


@pytest.mark.parametrize("kind", [Kind.BATCH, Kind.ACK, Kind.START, Kind.CHALLENGE, Kind.REFUSED])
def test_a_peer_cannot_put_a_record_into_the_leaders_log(leader, kind):
    """Whatever frame a peer answers the challenge with, without or with the secret, the
    leader's log does not grow: its port never takes records."""
    async def scenario():
        shipper, port = await serving(leader, 1)
        end = publish(leader.store, 5)
        assert await asyncio.to_thread(leader.store.wait_durable, end, WAIT)
        record = leader.store.read_log(0, 1 << 20, end)
        try:
            payload = {Kind.BATCH: wire.encode_batch(9, end, end, record),
                       Kind.ACK: wire.encode_ack(end)}.get(kind, wire.frame(kind, json.dumps({}).encode()))
            frames, closed = await attempt(port, lambda challenge: payload)
            assert closed, "the leader hangs up on a peer that does not say HELLO or RELAY"
            assert leader.store.appended_end == end
        finally:
            await shipper.close()
    asyncio.run(scenario())


def test_peers_that_never_prove_the_secret_hold_a_bounded_number_of_connections(leader, monkeypatch):
    monkeypatch.setattr(replication, "MAX_UNPROVEN", 4)

    async def scenario():
        shipper, port = await serving(leader, 1)
        try:
            idle = [await asyncio.open_connection("127.0.0.1", port) for _ in range(4)]
            for reader, _ in idle:
                assert (await wire.read_frame(reader, 0))[0] is Kind.CHALLENGE
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            assert await asyncio.wait_for(reader.read(), WAIT) == b"", "the fifth is closed at once"
            # a member of the group still gets in once one of them goes away
            idle[0][1].close()
            deadline = asyncio.get_running_loop().time() + WAIT
            while True:  # the leader notices the close when it next reads: no event to await
                frames, _ = await attempt(port, hello(SECRET))
                if frames and frames[0][0] is Kind.START:
                    break
                assert asyncio.get_running_loop().time() < deadline
                await asyncio.sleep(0.05)
            for _, held in idle[1:]:
                held.close()
        finally:
            await shipper.close()
    asyncio.run(scenario())


@pytest.mark.parametrize("peer", list(PEERS))
def test_only_a_peer_with_the_cluster_secret_gets_a_snapshot(leader, peer, monkeypatch):
    """A snapshot holds the metadata database (password hashes, encrypted secrets): a node
    behind the leader's log start gets one only once it proved the secret."""
    monkeypatch.setattr(type(leader.store), "log_start", property(lambda store: 1 << 40))  # retention ran

    async def scenario():
        shipper = LogShipper(leader.store, leader.epochs, 4, SECRET, "n1", lambda: ["n1"],
                             snapshot=lambda: b"the group's users and queues")
        port = await shipper.start("127.0.0.1", 0)
        try:
            frames, closed = await attempt(port, hello(PEERS[peer]))
        finally:
            await shipper.close()
        kinds = [kind for kind, _ in frames]
        assert closed
        if peer == "cluster secret":
            assert kinds == [Kind.SNAPSHOT, Kind.SNAPSHOT, Kind.SNAPSHOT_END]
            assert frames[1][1] == b"the group's users and queues"
        else:
            assert kinds == [Kind.REFUSED]
    asyncio.run(scenario())
