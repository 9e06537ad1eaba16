"""A failing store under AMQP publishers, with faults injected into a real `FileStore` (as
tests/unit/core/test_durable.py does): the publish that cannot be made durable is nacked, the
publisher is blocked (connection.blocked, not read) until the store writes again, another
connection's consumer goes on, and nothing confirmed is lost."""
from __future__ import annotations

import asyncio
import errno

from pamqp.commands import Basic, Confirm, Connection, Queue

from core.assembly import Core
from core.metadata import MetadataRepository
from core.settings import CoreConfig
from protocols.amqp.frames import encode_content
from protocols.amqp.frontend import AmqpFrontend
from protocols.amqp.options import AmqpOptions
from protocols.mqtt.topics import SYNTAX
from store import FileStore, StoreConfig
from store.faults import Fault
from tests.unit.amqp.fake_wire import ADMIN, PASSWORD, Client

STORE = StoreConfig(segment_size=1 << 20, index_slot_count=97, index_max_entries=64)
WAIT = 30


def publish(client: Client, body: bytes) -> None:
    client.send(encode_content(1, Basic.Publish(exchange="", routing_key="jobs"),
                               Basic.Properties(delivery_mode=2), body, 4096))


def test_a_failing_store_nacks_blocks_the_publisher_and_loses_nothing_confirmed(tmp_path,
                                                                                faults):
    async def main() -> None:
        store = FileStore(str(tmp_path / "store"), STORE)
        metadata = MetadataRepository.for_data_dir(str(tmp_path))
        core = Core(store, metadata, str(tmp_path), CoreConfig(offset_commit_interval_ms=50),
                    subject_syntax=SYNTAX)
        await core.start()
        core.broker.users.create_user(ADMIN, PASSWORD, admin=True)
        frontend = AmqpFrontend(core.broker, core.vhosts, core.queues, AmqpOptions())
        await frontend.start()
        try:
            publisher, consumer = Client(frontend), Client(frontend)
            await publisher.open()
            await consumer.open()
            assert isinstance(await publisher.call(1, Queue.Declare(queue="jobs", durable=True)),
                              Queue.DeclareOk)
            assert isinstance(await publisher.call(1, Confirm.Select()), Confirm.SelectOk)
            publish(publisher, b"kept")
            assert (await publisher.expect(Basic.Ack, 1)).delivery_tag == 1

            faults.add(Fault("commitlog", "sync", errno.EIO))
            publish(publisher, b"failing")
            answers = {type(frame): frame for _, frame in
                       [await publisher.next(), await publisher.next()]}  # in either order
            assert answers[Basic.Nack].delivery_tag == 2
            assert answers[Connection.Blocked].reason == "low on disk"
            assert not publisher.wire.reading
            got = await consumer.call(1, Basic.Get(queue="jobs", no_ack=True))
            assert isinstance(got, Basic.GetOk), "a consumer-only connection goes on"
            await consumer.next()  # the header
            assert (await consumer.next())[1].value == b"kept"
            assert consumer.wire.reading

            faults.lift()
            await asyncio.wait_for(publisher.expect(Connection.Unblocked, 0), WAIT)
            assert publisher.wire.reading
            publish(publisher, b"after")
            assert (await publisher.expect(Basic.Ack, 1)).delivery_tag == 3
            assert not publisher.wire.closed and not consumer.wire.closed
            bodies = []
            for _ in range(3):
                get = await consumer.call(1, Basic.Get(queue="jobs", no_ack=True))
                if isinstance(get, Basic.GetEmpty):
                    break
                await consumer.next()  # the header
                bodies.append((await consumer.next())[1].value)
            assert b"after" in bodies, bodies
            assert set(bodies) <= {b"failing", b"after"}, "a nacked message may still be stored"
        finally:
            await frontend.stop()
            await core.close()
            store.close()
            metadata.close()
    asyncio.run(main())
