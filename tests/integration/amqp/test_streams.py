"""Stream queues against a real `sluice serve`: declared durable only, read by each consumer
from its own x-stream-offset (first, last, next, an offset, a timestamp, an interval) with the
offset on every delivery, not consumed by acks, prefetch honoured, and RabbitMQ's refusals
(basic.get 540, automatic acks 540, no prefetch 406)."""
from __future__ import annotations

import asyncio
import uuid
from datetime import datetime, timedelta, timezone

import aio_pika
import pika
import pika.exceptions as errors
import pytest

from tests.integration.amqp.conftest import connect

WAIT_S = 10
STREAM = {"x-queue-type": "stream"}


def name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def url(server) -> str:
    return f"amqp://guest:guest@{server.amqp}/"


def declared_stream(server, count: int) -> str:
    """A new durable stream holding ``count`` confirmed messages b"0", b"1", ..."""
    connection = connect(server)
    channel = connection.channel()
    channel.confirm_delivery()
    queue = name("events")
    channel.queue_declare(queue, durable=True, arguments=STREAM)
    for n in range(count):
        channel.basic_publish("", queue, b"%d" % n)
    connection.close()
    return queue


async def read(channel: aio_pika.abc.AbstractChannel, queue_name: str, offset: object,
               count: int, *, ack: bool = True) -> list[tuple[bytes, int]]:
    """``count`` deliveries of a consumer starting at ``offset``: (body, x-stream-offset)."""
    queue = await channel.get_queue(queue_name, ensure=False)
    inbox: asyncio.Queue = asyncio.Queue()
    tag = await queue.consume(inbox.put, arguments={"x-stream-offset": offset})
    got = []
    async with asyncio.timeout(WAIT_S):
        for _ in range(count):
            message = await inbox.get()
            got.append((message.body, message.headers["x-stream-offset"]))
            if ack:
                await message.ack()
    await queue.cancel(tag)
    return got


def test_each_consumer_reads_the_whole_stream_from_its_own_offset(amqp_server):
    queue = declared_stream(amqp_server, 6)

    async def main() -> None:
        connection = await aio_pika.connect(url(amqp_server))
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=100)
        everything = await read(channel, queue, "first", 6)
        assert [body for body, _ in everything] == [b"0", b"1", b"2", b"3", b"4", b"5"]
        first = everything[0][1]
        assert [offset for _, offset in everything] == list(range(first, first + 6))
        again = await read(channel, queue, "first", 6)  # acks removed nothing
        assert again == everything
        assert await read(channel, queue, first + 4, 2) == everything[4:]
        assert await read(channel, queue, "last", 1) == everything[5:]
        past = datetime.now(timezone.utc) - timedelta(hours=1)
        assert await read(channel, queue, past, 6) == everything
        assert await read(channel, queue, "1h", 6) == everything

        # "next" and a timestamp from the future see only what is published afterwards
        inbox: asyncio.Queue = asyncio.Queue()
        stream = await channel.get_queue(queue, ensure=False)
        future = datetime.now(timezone.utc) + timedelta(hours=1)
        await stream.consume(inbox.put, arguments={"x-stream-offset": "next"})
        await stream.consume(inbox.put, arguments={"x-stream-offset": future})
        await channel.default_exchange.publish(aio_pika.Message(b"later"), queue)
        async with asyncio.timeout(WAIT_S):
            late = [await inbox.get() for _ in range(2)]
        assert [m.body for m in late] == [b"later", b"later"]
        assert {m.headers["x-stream-offset"] for m in late} == {first + 6}
        await connection.close()
    asyncio.run(main())


def test_a_stream_consumer_honours_its_prefetch(amqp_server):
    queue = declared_stream(amqp_server, 5)

    async def main() -> None:
        connection = await aio_pika.connect(url(amqp_server))
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=2)
        stream = await channel.get_queue(queue, ensure=False)
        inbox: asyncio.Queue = asyncio.Queue()
        await stream.consume(inbox.put, arguments={"x-stream-offset": "first"})
        async with asyncio.timeout(WAIT_S):
            held = [await inbox.get() for _ in range(2)]
            await channel.declare_queue(queue, passive=True)  # a round trip: more had time
            assert inbox.empty(), "no more than prefetch_count unacked"
            await held[0].ack()
            third = await inbox.get()
        assert [m.body for m in held + [third]] == [b"0", b"1", b"2"]
        await connection.close()
    asyncio.run(main())


@pytest.mark.parametrize("flags,prop", [({"durable": False}, "non-durable"),
                                         ({"exclusive": True}, "exclusive-owner"),
                                         ({"auto_delete": True}, "auto-delete")])
def test_a_stream_is_durable_and_shared_only(amqp_server, flags, prop):
    connection = connect(amqp_server)
    channel = connection.channel()
    options = {"durable": True, **flags}
    with pytest.raises(errors.ChannelClosedByBroker) as closed:
        channel.queue_declare(name("s"), arguments=STREAM, **options)
    assert closed.value.reply_code == 406 and prop in closed.value.reply_text
    connection.close()


def test_refusals_as_rabbitmq_answers_them(amqp_server):
    queue = declared_stream(amqp_server, 1)
    connection = connect(amqp_server)
    channel = connection.channel()
    with pytest.raises(errors.ChannelClosedByBroker) as closed:
        channel.basic_consume(queue, lambda *_: None)  # no basic.qos
    assert closed.value.reply_code == 406 and "prefetch" in closed.value.reply_text
    channel = connection.channel()
    channel.basic_qos(prefetch_count=10)
    with pytest.raises(errors.ChannelClosedByBroker) as closed:
        channel.basic_consume(queue, lambda *_: None, arguments={"x-stream-offset": "soon"})
    assert closed.value.reply_code == 406
    channel = connection.channel()
    channel.basic_qos(prefetch_count=10)
    with pytest.raises(errors.ConnectionClosedByBroker) as shut:
        channel.basic_consume(queue, lambda *_: None, auto_ack=True)
    assert shut.value.reply_code == 540
    channel = connect(amqp_server).channel()
    with pytest.raises(errors.ConnectionClosedByBroker) as shut:
        channel.basic_get(queue)
    assert shut.value.reply_code == 540 and "stream" in shut.value.reply_text
