"""The replication port: a leader's log shipped to followers, and the confirm offset."""
from __future__ import annotations

import asyncio
import contextlib

import pytest

from sluice.cluster import wire
from sluice.cluster.in_sync import next_in_sync
from sluice.cluster.replication import LogFollower, LogShipper, MustTruncate, Refused
from store.api import StoreConfig
from store.epochs import Epoch, EpochFile
from store.errors import StoreDegradedError
from store.file_store import FileStore
from store.truncation import truncate_log

SECRET = "s3cret"
SEGMENT = 64 << 10
WAIT = float(__import__("os").environ.get("CLUSTER_TEST_WAIT", 120))  # seconds: only guards against hanging


class Node:
    def __init__(self, directory) -> None:
        self.directory = str(directory)
        self.store = FileStore(self.directory, StoreConfig(segment_size=SEGMENT))
        self.epochs = EpochFile(self.directory)

    def reopen(self) -> None:
        self.store.close()
        self.store = FileStore(self.directory, StoreConfig(segment_size=SEGMENT))
        self.epochs = EpochFile(self.directory)


@pytest.fixture
def nodes(tmp_path):
    made = [Node(tmp_path / name) for name in ("n1", "n2", "n3")]
    yield made
    for node in made:
        node.store.close()


def publish(store: FileStore, count: int, topic: str = "t", start: int = 0) -> int:
    results = [store.append(topic, f"m{i}".encode() * 20, queue_id=i % 2, keys=[f"k{i}"])
               for i in range(start, start + count)]
    return results[-1].end_offset


async def durable(store: FileStore, offset: int) -> None:
    assert await asyncio.to_thread(store.wait_durable, offset, WAIT)


async def confirmed(shipper: LogShipper | LogFollower, offset: int) -> None:
    reached = asyncio.Event()
    shipper.add_confirm_listener(lambda value: value >= offset and reached.set())
    if shipper.confirmed < offset:
        await asyncio.wait_for(reached.wait(), WAIT)


def bodies(store: FileStore, queue_id: int) -> list[bytes]:
    low, high = store.queue_range("t", queue_id)
    return [m.body for m in store.read("t", queue_id, low, max_count=high - low + 1, max_bytes=1 << 40)]


@contextlib.asynccontextmanager
async def leading(node: Node, epoch: int, in_sync: list[str]):
    shipper = LogShipper(node.store, node.epochs, epoch, SECRET, "n1", lambda: in_sync)
    port = await shipper.start("127.0.0.1", 0)
    try:
        yield shipper, port
    finally:
        await shipper.close()


def following(node: Node, name: str, port: int, secret: str = SECRET) -> tuple[LogFollower, asyncio.Task]:
    follower = LogFollower(node.store, node.epochs, name, secret)
    return follower, asyncio.ensure_future(follower.follow("127.0.0.1", port))


async def stop(task: asyncio.Task) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def test_followers_get_every_record_and_the_confirm_offset_waits_for_the_in_sync_set(nodes):
    n1, n2, n3 = nodes

    async def scenario():
        async with leading(n1, 7, ["n1", "n2", "n3"]) as (shipper, port):
            end = publish(n1.store, 300)
            await durable(n1.store, end)
            f2, t2 = following(n2, "n2", port)
            await durable(n2.store, end)
            assert shipper.confirm_offset() == 0, "n3 is in sync and has acknowledged nothing"
            f3, t3 = following(n3, "n3", port)
            await confirmed(shipper, end)
            assert shipper.confirm_offset() == end
            more = publish(n1.store, 50, start=300)
            await confirmed(shipper, more)
            for follower in (f2, f3):  # the next batch or heartbeat tells followers
                await confirmed(follower, more)
            await stop(t2)
            await stop(t3)
        for node in (n2, n3):
            assert await asyncio.to_thread(node.store.wait_visible, more, WAIT)
            assert bodies(node.store, 1) == bodies(n1.store, 1)
            assert node.epochs.history.entries == [Epoch(7, 0)]
    asyncio.run(scenario())


def test_a_follower_without_the_secret_gets_nothing(nodes):
    n1, n2, _ = nodes

    async def scenario():
        async with leading(n1, 3, ["n1"]) as (shipper, port):
            await durable(n1.store, publish(n1.store, 10))
            _, task = following(n2, "n2", port, secret="guess")
            with pytest.raises(Refused, match="wrong cluster secret"):
                await task
            assert "n2" not in shipper.replicas
        assert n2.store.appended_end == 0
    asyncio.run(scenario())


def test_garbage_on_the_replication_port_closes_that_connection_only(nodes):
    n1, n2, _ = nodes

    async def scenario():
        async with leading(n1, 3, ["n1", "n2"]) as (shipper, port):
            end = publish(n1.store, 20)
            await durable(n1.store, end)
            attempts = [b"GET / HTTP/1.1\r\n\r\n", wire.frame(wire.Kind.HELLO, b"{" * 5000),
                        wire.HEADER.pack(1 << 31, wire.Kind.HELLO), wire.frame(wire.Kind.ACK, b"\0" * 8),
                        wire.frame(wire.Kind.HELLO, b'{"node": "n2", "proof": "00", "epochs": [], "end": 0, '
                                                    b'"confirmed": 0, "segment_size": 65536}')]
            for attempt in attempts:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                kind, _ = await wire.read_frame(reader, 0)
                assert kind is wire.Kind.CHALLENGE
                writer.write(attempt)
                leftover = await asyncio.wait_for(reader.read(), WAIT)
                assert b"m0" not in leftover
                writer.close()
            # the secret, but epochs out of order
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            kind, challenge = await wire.read_frame(reader, 0)
            writer.write(wire.encode_hello(wire.Hello("n2", wire.proof(SECRET, challenge, "n2"),
                                                      [(9, 0), (3, 10)], 0, 0, SEGMENT)))
            assert b"m0" not in await asyncio.wait_for(reader.read(), WAIT)
            writer.close()
            assert shipper.replicas == {}
            _, task = following(n2, "n2", port)
            await confirmed(shipper, end)
            await stop(task)
    asyncio.run(scenario())


def test_a_rejoining_node_is_cut_back_to_the_new_leaders_history_then_catches_up(nodes):
    n1, n2, _ = nodes

    async def scenario():
        # epoch 5: n2 led, and n1 followed up to `shared`
        n2.epochs.begin(5, 0)
        shared = publish(n2.store, 40)
        await durable(n2.store, shared)
        n1.epochs.begin(5, 0)
        n1.store.append_replicated(0, n2.store.read_log(0, 1 << 20, shared))
        await durable(n1.store, shared)
        # n2 wrote more in epoch 5 that never reached n1, then died; n1 leads epoch 9
        await durable(n2.store, publish(n2.store, 30, start=1000))
        async with leading(n1, 9, ["n1", "n2"]) as (shipper, port):
            end = publish(n1.store, 25, start=2000)
            await durable(n1.store, end)
            _, task = following(n2, "n2", port)
            with pytest.raises(MustTruncate) as cut:
                await task
            assert cut.value.offset == shared
            n2.store.close()
            truncate_log(n2.directory, cut.value.offset, SEGMENT)
            n2.reopen()
            _, task = following(n2, "n2", port)
            await confirmed(shipper, end)
            assert await asyncio.to_thread(n2.store.wait_visible, end, WAIT)
            await stop(task)
        assert bodies(n2.store, 0) == bodies(n1.store, 0)
        assert len(bodies(n1.store, 0)) == 20 + 13, "the new leader's appends follow the copied records"
        assert n2.epochs.history.entries == [Epoch(5, 0), Epoch(9, shared)]
    asyncio.run(scenario())


def test_readers_and_acknowledgements_on_every_node_wait_for_the_confirm_offset(nodes):
    n1, n2, n3 = nodes

    async def scenario():
        async with leading(n1, 4, ["n1", "n2", "n3"]) as (shipper, port):
            import threading
            heard: list[int] = []
            reached = threading.Event()

            def listener(visible: int, durable: int) -> None:
                heard.append(durable)
                if visible >= end and durable >= end:
                    reached.set()
            end = 1 << 62  # set below, before anything is published
            n1.store.add_listener(listener)
            _, t2 = following(n2, "n2", port)
            end = publish(n1.store, 60)
            await durable(n1.store, end)
            await durable(n2.store, end)
            # n3, in sync, has nothing yet: on both nodes the records exist but nobody sees them
            for node in (n1, n2):
                assert node.store.queue_range("t", 0)[1] == 0
            assert max(heard, default=0) == 0, "no acknowledgement before every in-sync replica has it"
            _, t3 = following(n3, "n3", port)
            await confirmed(shipper, end)
            assert await asyncio.to_thread(n1.store.wait_visible, end, WAIT)
            assert bodies(n1.store, 0) == [f"m{i}".encode() * 20 for i in range(0, 60, 2)]
            assert await asyncio.to_thread(reached.wait, WAIT)
            assert max(heard) == end
            await asyncio.to_thread(n2.store.wait_visible, end, WAIT)  # told by the next batch
            assert bodies(n2.store, 0) == bodies(n1.store, 0)
            await stop(t2)
            await stop(t3)
    asyncio.run(scenario())


def test_below_min_insync_publishes_are_refused_and_nothing_more_is_confirmed(nodes):
    n1, n2, _ = nodes
    in_sync = ["n1"]

    async def scenario():
        shipper = LogShipper(n1.store, n1.epochs, 3, SECRET, "n1", lambda: in_sync, min_insync=2)
        port = await shipper.start("127.0.0.1", 0)
        try:
            assert shipper.refusal is not None and "min_insync is 2" in shipper.refusal
            with pytest.raises(StoreDegradedError, match="min_insync"):
                publish(n1.store, 1)
            in_sync.append("n2")  # the keeper records a follower as in sync again
            shipper.update()
            assert shipper.refusal is None
            end = publish(n1.store, 5)
            _, task = following(n2, "n2", port)
            await confirmed(shipper, end)
            in_sync.remove("n2")
            shipper.update()
            with pytest.raises(StoreDegradedError):
                publish(n1.store, 1)
            assert shipper.confirmed == end
            await stop(task)
        finally:
            await shipper.close()
    asyncio.run(scenario())


def test_a_leader_whose_lease_lapsed_confirms_nothing_more(nodes):
    n1, n2, _ = nodes
    leading_now = [True]

    async def scenario():
        shipper = LogShipper(n1.store, n1.epochs, 3, SECRET, "n1", lambda: ["n1", "n2"],
                             may_confirm=lambda: leading_now[0])
        port = await shipper.start("127.0.0.1", 0)
        try:
            first = publish(n1.store, 5)
            _, task = following(n2, "n2", port)
            await confirmed(shipper, first)
            leading_now[0] = False
            shipper.update()
            with pytest.raises(StoreDegradedError, match="no longer holds the leadership"):
                publish(n1.store, 1)
            assert await asyncio.to_thread(n2.store.wait_durable, first, WAIT)
            assert shipper.confirmed == first
            await stop(task)
        finally:
            await shipper.close()
    asyncio.run(scenario())


def test_an_idle_follower_that_holds_everything_stays_caught_up(nodes):
    n1, n2, _ = nodes
    now = [1000.0]

    async def scenario():
        shipper = LogShipper(n1.store, n1.epochs, 3, SECRET, "n1", lambda: ["n1", "n2"], clock=lambda: now[0])
        port = await shipper.start("127.0.0.1", 0)
        try:
            end = publish(n1.store, 5)
            _, task = following(n2, "n2", port)
            await confirmed(shipper, end)
            now[0] += 3600  # an hour without a record
            shipper.update()  # wakes the sender, which finds nothing to send and the follower at the end
            deadline = asyncio.get_running_loop().time() + WAIT
            while shipper.replicas["n2"].progress.caught_up_at != now[0]:  # no event marks a heartbeat
                assert asyncio.get_running_loop().time() < deadline, "the follower never counted as caught up"
                await asyncio.sleep(0.01)
            progress = shipper.replicas["n2"].progress
            # the next record does not make it look an hour behind
            assert next_in_sync(["n1", "n2"], "n1", {"n2": progress}, leader_durable=end + 100, confirmed=end,
                                epoch_start=0, epoch_began_at=0.0, now=now[0] + 0.1, timeout_s=4.0) == ("n1", "n2")
            await stop(task)
        finally:
            await shipper.close()
    asyncio.run(scenario())
