"""Whatever ends a channel or a connection, what the client sent before is carried out first, in
order, as RabbitMQ does: publishes read with a channel.close or connection.close are stored
before the close-ok goes out, and so are those read before the socket dropped. Only what was
read on a channel the broker closed with an error is discarded (the spec's rule), and what an
open transaction holds is rolled back."""
from __future__ import annotations

import asyncio
import errno
import logging
from collections.abc import Awaitable, Callable

from pamqp.commands import Basic, Channel, Confirm, Connection, Queue, Tx

from core.assembly import Core
from core.metadata import MetadataRepository
from core.settings import CoreConfig
from protocols.amqp.frames import encode_content, encode_method
from protocols.amqp.frontend import AmqpFrontend
from protocols.amqp.options import AmqpOptions
from protocols.mqtt.topics import SYNTAX
from store import FileStore, StoreConfig
from store.faults import Fault
from tests.unit.amqp.fake_wire import ADMIN, PASSWORD, Client, run
from tests.unit.amqp.test_messages import content

WAIT = 10


def publishes(channel: int, *bodies: bytes, queue: str = "q", exchange: str = "") -> bytes:
    return b"".join(encode_content(channel, Basic.Publish(exchange=exchange, routing_key=queue),
                                   Basic.Properties(), body, 4096) for body in bodies)


def close(channel: int) -> bytes:
    return encode_method(channel, Channel.Close(200, "bye", 0, 0))


def connection_close() -> bytes:
    return encode_method(0, Connection.Close(200, "bye", 0, 0))


async def queued(frontend: AmqpFrontend, queue: str = "q") -> list[bytes]:
    """Every message of ``queue``, in order, taken by a client of its own (basic.get no_ack)."""
    reader = Client(frontend)
    await reader.open()
    bodies = []
    while isinstance(await reader.call(1, Basic.Get(queue=queue, no_ack=True)), Basic.GetOk):
        await reader.next()  # the header
        bodies.append((await reader.next())[1].value)
    reader.send(connection_close())
    await reader.closed()
    return bodies


async def declared(client: Client, *queues: str) -> None:
    for queue in queues:
        assert isinstance(await client.call(1, Queue.Declare(queue=queue)), Queue.DeclareOk)


class SlowDisk:
    """Holds every store call until ``release``: the store's durability, as a slow disk delays
    it, on the broker's one path to the store for AMQP publishes."""

    def __init__(self, core: Core) -> None:
        self._store = core.broker.send_decided
        self._durable = asyncio.Event()
        self.waiting = 0

    def install(self, monkeypatch) -> None:
        monkeypatch.setattr("core.service.Broker.send_decided",
                            lambda broker, messages: self._held(messages))

    async def _held(self, messages):
        self.waiting += 1
        await self._durable.wait()
        return await self._store(messages)

    def release(self) -> None:
        self._durable.set()


async def until(condition: Callable[[], bool]) -> None:
    """Let the loop run until ``condition`` holds (nothing here waits on I/O or time)."""
    async with asyncio.timeout(WAIT):
        while not condition():
            await asyncio.sleep(0)


def test_publishes_read_with_a_connection_close_are_stored_before_close_ok(tmp_path, monkeypatch):
    """RabbitMQ's tutorial send.py: publishes, then connection.close, in one write."""
    async def scenario(frontend, core):
        client = Client(frontend)
        await client.open()
        await declared(client, "q")
        disk = SlowDisk(core)
        disk.install(monkeypatch)
        client.send(publishes(1, *(b"m%d" % n for n in range(5))) + connection_close())
        await until(lambda: disk.waiting)
        assert not client.wire.closed and client._decode() is False, "close-ok before storing"
        disk.release()
        frames = await client.closed()
        assert [type(f) for f in frames] == [Connection.CloseOk]
        assert await queued(frontend) == [b"m0", b"m1", b"m2", b"m3", b"m4"]
    run(tmp_path, scenario)


def test_publishes_read_with_a_channel_close_are_stored_and_other_channels_go_on(tmp_path):
    async def scenario(frontend, core):
        client = Client(frontend)
        await client.open(channels=(1, 2))
        await declared(client, "q")
        client.send(publishes(1, b"a0", b"a1", b"a2") + close(1) + publishes(2, b"b0", b"b1"))
        await client.expect(Channel.CloseOk, 1)
        assert isinstance(await client.call(2, Queue.Declare(queue="q", passive=True)),
                          Queue.DeclareOk)  # after the publishes read before it
        client.send_method(1, Channel.Open())  # the number is free again
        await client.expect(Channel.OpenOk, 1)
        assert await queued(frontend) == [b"a0", b"a1", b"a2", b"b0", b"b1"]
    run(tmp_path, scenario)


def test_publishes_read_before_the_socket_dropped_are_stored_then_the_connection_goes(tmp_path):
    """A TCP reset after publishes: RabbitMQ processes what it read, and so does Sluice; the
    connection's consumers and unacked deliveries go only after that."""
    async def scenario(frontend, core):
        client = Client(frontend)
        await client.open(channels=(1, 2))
        await declared(client, "q", "held")
        client.send(publishes(1, b"held", queue="held"))
        client.send_method(2, Basic.Get(queue="held"))
        await content(client, Basic.GetOk)
        client.send(publishes(1, *(b"m%d" % n for n in range(5))))
        client.adapter.connection_lost()
        await until(lambda: not frontend.connected_count())
        assert await queued(frontend) == [b"m0", b"m1", b"m2", b"m3", b"m4"]
        assert await queued(frontend, "held") == [b"held"], "its unacked delivery came back"
    run(tmp_path, scenario)


def test_what_follows_an_error_on_its_channel_is_discarded_until_close_ok(tmp_path):
    """A publish to a missing exchange closes channel 1 (404); what the client sent on it
    after that, before it saw the close, is discarded, as RabbitMQ discards it; channel 2's
    publishes sent meanwhile are stored, and so is what channel 1 sends once reopened."""
    async def scenario(frontend, core):
        client = Client(frontend)
        await client.open(channels=(1, 2))
        await declared(client, "q")
        client.send(publishes(1, b"before") + publishes(1, b"x", exchange="missing")
                    + publishes(1, b"discarded") + publishes(2, b"other channel"))
        assert (await client.expect(Channel.Close, 1)).reply_code == 404
        client.send(publishes(1, b"discarded too"))  # the client has not seen the close yet
        client.send_method(1, Channel.CloseOk())
        client.send_method(1, Channel.Open())
        await client.expect(Channel.OpenOk, 1)
        client.send(publishes(1, b"after"))
        assert await queued(frontend) == [b"before", b"other channel", b"after"]
    run(tmp_path, scenario)


def test_a_connection_error_discards_only_what_followed_on_its_channel(tmp_path):
    """A reused consumer tag is a connection error (530); publishes read before it on other
    channels are still stored, as RabbitMQ's other channels work through what they read."""
    async def scenario(frontend, core):
        client = Client(frontend)
        await client.open(channels=(1, 2))
        await declared(client, "q", "tagged")
        consume = encode_method(1, Basic.Consume(queue="tagged", consumer_tag="same"))
        client.send(consume + consume + publishes(1, b"discarded")
                    + publishes(2, b"kept 1", b"kept 2"))
        await client.expect(Basic.ConsumeOk, 1)
        assert (await client.expect(Connection.Close, 0)).reply_code == 530
        client.send_method(0, Connection.CloseOk())
        assert await client.closed() == []
        await until(lambda: not frontend.connected_count())  # what it read is carried out
        assert await queued(frontend) == [b"kept 1", b"kept 2"]
    run(tmp_path, scenario)


def test_an_uncommitted_transaction_is_rolled_back_at_close_a_committed_one_is_not(tmp_path):
    """A commit read before the close is carried out (its commit-ok is not sent: the client
    discards all but close-ok after its close)."""
    async def scenario(frontend, core):
        client = Client(frontend)
        await client.open(channels=(1, 2))
        await declared(client, "q")
        for channel in (1, 2):
            assert isinstance(await client.call(channel, Tx.Select()), Tx.SelectOk)
        client.send(publishes(1, b"committed") + encode_method(1, Tx.Commit()) + close(1)
                    + publishes(2, b"uncommitted") + close(2))
        await client.expect(Channel.CloseOk, 1)
        await client.expect(Channel.CloseOk, 2)
        assert await queued(frontend) == [b"committed"]
    run(tmp_path, scenario)


def test_confirmed_publishes_before_a_close_are_stored_and_nothing_else_is_sent(tmp_path):
    """The client discards everything but close-ok after its close (spec): confirms are not
    sent, the messages are stored all the same."""
    async def scenario(frontend, core):
        client = Client(frontend)
        await client.open()
        await declared(client, "q")
        assert isinstance(await client.call(1, Confirm.Select()), Confirm.SelectOk)
        client.send(publishes(1, b"c0", b"c1") + close(1))
        await client.expect(Channel.CloseOk, 1)
        assert await queued(frontend) == [b"c0", b"c1"]
    run(tmp_path, scenario)


def test_a_basic_get_read_with_a_close_takes_nothing(tmp_path):
    """Its get-ok could not go out: the message stays in the queue, not redelivered."""
    async def scenario(frontend, core):
        client = Client(frontend)
        await client.open()
        await declared(client, "q")
        client.send(publishes(1, b"m"))
        assert isinstance(await client.call(1, Queue.Declare(queue="q", passive=True)),
                          Queue.DeclareOk)
        client.send(encode_method(1, Basic.Get(queue="q", no_ack=True)) + close(1))
        await client.expect(Channel.CloseOk, 1)
        assert await queued(frontend) == [b"m"]
    run(tmp_path, scenario)


# --------------------------------------------------------------------------- a failing disk

STORE = StoreConfig(segment_size=1 << 20, index_slot_count=97, index_max_entries=64)


def on_file_store(tmp_path, scenario: Callable[[AmqpFrontend], Awaitable[None]]) -> None:
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
            await scenario(frontend)
        finally:
            await frontend.stop()
            await core.close()
            store.close()
            metadata.close()
    asyncio.run(main())


def test_publishes_that_cannot_be_stored_after_the_client_closed_are_logged(tmp_path, faults,
                                                                            caplog):
    """Nobody can be told any more (no nack, no channel close): one warning line says how
    many were lost."""
    async def scenario(frontend):
        client = Client(frontend)
        await client.open()
        await declared(client, "q")
        faults.add(Fault("commitlog", "sync", errno.EIO))
        with caplog.at_level(logging.WARNING, "protocols.amqp"):
            client.send(publishes(1, b"l0", b"l1", b"l2") + connection_close())
            assert [type(f) for f in await client.closed()] == [Connection.CloseOk]
        [line] = [r.getMessage() for r in caplog.records if r.name == "protocols.amqp.publishing"]
        assert f"AMQP connection {client.adapter.id} of user '{ADMIN}' closed before 3 of its " \
               "publishes could be stored" in line, line
        faults.lift()
    on_file_store(tmp_path, scenario)
