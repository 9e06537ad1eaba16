"""Live delivery does not wait for the disk, acknowledgements do.

A connected non-persistent subscriber gets a QoS 0/1 message as soon as it is in the log's
write buffer, while the publisher's PUBACK still waits for the fsync covering it. A QoS 2
message, and whatever the same publisher sends behind it, reaches live subscribers only once
durable. The commit log's fsync is held by a `FileOps` that blocks it (the store's file
operations hook, as the fault tests use), over a real `FileStore` behind a real front end.
"""
from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Iterator

import pytest

from core.assembly import Core
from core.metadata import MetadataRepository
from core.settings import CoreConfig
from protocols.mqtt.frontend import MqttFrontend
from protocols.mqtt.options import MqttOptions
from protocols.mqtt.packets import PubAck, Publish, PubRec, PubRel, PubComp
from protocols.mqtt.topics import SYNTAX
from store import FileStore, StoreConfig, fileops
from store.fileops import FileOps
from tests.unit.mqtt.fake_wire import PASSWORD, USER, Client
from tests.unit.mqtt.test_adapter import subscribed

STORE = StoreConfig(segment_size=1 << 20, index_slot_count=97, index_max_entries=64)


class HeldSync(FileOps):
    """Real file operations whose commit-log fsyncs wait while the gate is closed."""

    def __init__(self) -> None:
        self._open = threading.Event()
        self._open.set()
        self.waiting = threading.Event()
        """Set once an fsync is blocked at the closed gate."""

    def hold(self) -> None:
        self.waiting.clear()
        self._open.clear()

    def release(self) -> None:
        self._open.set()

    def admit(self, site: str, op: str, path: str, size: int = 0) -> int:
        if site == "commitlog" and op == "sync" and not self._open.is_set():
            self.waiting.set()
            self._open.wait()
        return super().admit(site, op, path, size)


@pytest.fixture
def held_sync() -> Iterator[HeldSync]:
    ops = HeldSync()
    previous = fileops.install(ops)
    yield ops
    ops.release()
    fileops.install(previous)


Scenario = Callable[[MqttFrontend], Awaitable[None]]


def run_on_disk(tmp_path, held_sync: HeldSync, scenario: Scenario) -> None:
    """``scenario`` against a front end over a core on a `FileStore` with ``flush = sync``
    whose fsyncs ``held_sync`` can hold (released before the store closes)."""
    async def main() -> None:
        store = FileStore(str(tmp_path / "store"), STORE)
        metadata = MetadataRepository.for_data_dir(str(tmp_path))
        core = Core(store, metadata, str(tmp_path), CoreConfig(offset_commit_interval_ms=50),
                    subject_syntax=SYNTAX, flush="sync")
        await core.start()
        core.broker.users.create_user(USER, PASSWORD.decode(), admin=True)
        frontend = MqttFrontend(core.broker, core.queues, core.state, MqttOptions())
        await frontend.start()
        try:
            await scenario(frontend)
        finally:
            held_sync.release()
            await frontend.stop()
            await core.close()
            store.close()
            metadata.close()
    asyncio.run(main())


async def fsync_held(held_sync: HeldSync) -> None:
    """Wait (off the loop) until the flusher is blocked in the held fsync."""
    assert await asyncio.to_thread(held_sync.waiting.wait, 5), "no fsync was attempted"


@pytest.mark.parametrize("qos", [0, 1])
def test_a_live_subscriber_gets_a_message_before_the_fsync_that_acks_it(tmp_path, held_sync, qos):
    async def scenario(frontend):
        sub = await subscribed(frontend, "sub", ("t", 1))
        pub = Client(frontend)
        await pub.connect("pub")
        held_sync.hold()
        pub.send(Publish("t", b"early", qos, packet_id=1 if qos else None))
        delivered = await sub.expect(Publish)
        assert (delivered.payload, delivered.qos) == (b"early", qos)
        await fsync_held(held_sync)
        if qos:
            assert await pub.settled() == [], "the PUBACK waits for the fsync"
        held_sync.release()
        if qos:
            assert (await pub.expect(PubAck)).packet_id == 1
    run_on_disk(tmp_path, held_sync, scenario)


def test_a_qos2_message_and_what_follows_it_reach_live_subscribers_once_durable(tmp_path, held_sync):
    async def scenario(frontend):
        sub = await subscribed(frontend, "sub", ("t", 2))
        pub = Client(frontend)
        await pub.connect("pub")
        held_sync.hold()
        pub.send(Publish("t", b"exactly once", 2, packet_id=1))
        pub.send(Publish("t", b"behind it", 1, packet_id=2))
        await fsync_held(held_sync)
        assert await sub.settled() == [], "nothing may reach the subscriber before it is durable"
        assert await pub.settled() == []
        held_sync.release()
        assert (await pub.expect(PubRec)).packet_id == 1
        assert (await pub.expect(PubAck)).packet_id == 2
        first, second = await sub.expect(Publish), await sub.expect(Publish)
        assert [(first.payload, first.qos), (second.payload, second.qos)] == \
            [(b"exactly once", 2), (b"behind it", 1)]
        pub.send(PubRel(1))
        assert (await pub.expect(PubComp)).packet_id == 1
    run_on_disk(tmp_path, held_sync, scenario)


def test_a_publishers_next_messages_do_not_wait_for_the_fsync_of_its_earlier_ones(tmp_path, held_sync):
    async def scenario(frontend):
        sub = await subscribed(frontend, "sub", ("t", 1))
        pub = Client(frontend)
        await pub.connect("pub")
        held_sync.hold()
        pub.send(Publish("t", b"first", 1, packet_id=1))
        assert (await sub.expect(Publish)).payload == b"first"
        await fsync_held(held_sync)
        pub.send(Publish("t", b"second", 1, packet_id=2))  # read while the first one's fsync waits
        assert (await sub.expect(Publish)).payload == b"second"
        assert await pub.settled() == [], "both PUBACKs wait for the fsync"
        held_sync.release()
        assert [(await pub.expect(PubAck)).packet_id for _ in range(2)] == [1, 2]
    run_on_disk(tmp_path, held_sync, scenario)
