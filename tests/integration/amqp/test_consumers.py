"""How messages are handed to consumers, against a real `sluice serve`: priority queues
(x-max-priority and the message priority), single active consumer, consumer priorities
(x-priority) and their argument checks."""
from __future__ import annotations

import asyncio
import uuid

import aio_pika
import pika
import pika.exceptions as errors
import pytest

from tests.integration.amqp.conftest import connect

WAIT_S = 10


def name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def url(server) -> str:
    return f"amqp://guest:guest@{server.amqp}/"


def test_a_priority_queue_hands_out_higher_priorities_first(amqp_server):
    connection = connect(amqp_server)
    channel = connection.channel()
    channel.confirm_delivery()
    queue = name("urgent")
    channel.queue_declare(queue, durable=True, arguments={"x-max-priority": 5})
    published = [(b"low", 1), (b"top", 5), (b"none", None), (b"zero", 0), (b"over", 9),
                 (b"mid", 3), (b"low2", 1)]
    for body, priority in published:
        channel.basic_publish("", queue, body, pika.BasicProperties(priority=priority))
    assert channel.queue_declare(queue, passive=True).method.message_count == len(published)
    got = []
    while (answer := channel.basic_get(queue, auto_ack=True))[0] is not None:
        got.append(answer[2])
    # above the max counts as the max; none as 0; equal priorities keep their order
    assert got == [b"top", b"over", b"mid", b"low", b"low2", b"none", b"zero"]
    connection.close()


@pytest.mark.parametrize("value,reason", [(256, "max_value_exceeded"), (-1, "value_negative"),
                                          ("ten", "unacceptable_type")])
def test_a_bad_max_priority_is_refused_with_406(amqp_server, value, reason):
    connection = connect(amqp_server)
    channel = connection.channel()
    queue = name("bad")
    with pytest.raises(errors.ChannelClosedByBroker) as closed:
        channel.queue_declare(queue, arguments={"x-max-priority": value})
    assert closed.value.reply_code == 406 and reason in closed.value.reply_text
    assert connection.channel().queue_declare("", exclusive=True)  # nothing else is disturbed
    connection.close()


async def _received(queue: asyncio.Queue, count: int) -> list[aio_pika.IncomingMessage]:
    async with asyncio.timeout(WAIT_S):
        return [await queue.get() for _ in range(count)]


def test_a_single_active_consumer_gets_everything_and_the_next_takes_over(amqp_server):
    async def main() -> None:
        queue_name = name("sac")
        first = await aio_pika.connect(url(amqp_server))
        second = await aio_pika.connect(url(amqp_server))
        ch1, ch2 = await first.channel(), await second.channel()
        await ch1.set_qos(prefetch_count=10)
        await ch2.set_qos(prefetch_count=10)
        q1 = await ch1.declare_queue(queue_name, arguments={"x-single-active-consumer": True})
        q2 = await ch2.declare_queue(queue_name, arguments={"x-single-active-consumer": True})
        inbox1, inbox2 = asyncio.Queue(), asyncio.Queue()
        await q1.consume(inbox1.put)
        await q2.consume(inbox2.put)
        for n in range(5):
            await ch2.default_exchange.publish(aio_pika.Message(b"%d" % n), queue_name)
        taken = await _received(inbox1, 5)
        assert [m.body for m in taken] == [b"0", b"1", b"2", b"3", b"4"]
        declared = await ch2.declare_queue(queue_name, passive=True)
        assert declared.declaration_result.consumer_count == 2
        assert declared.declaration_result.message_count == 0 and inbox2.empty()
        for message in taken[:2]:
            await message.ack()
        await first.close()  # the active consumer goes with 3 unacked
        await ch2.default_exchange.publish(aio_pika.Message(b"5"), queue_name)
        again = await _received(inbox2, 4)
        assert [(m.body, m.redelivered) for m in again] == \
            [(b"2", True), (b"3", True), (b"4", True), (b"5", False)]
        await second.close()
    asyncio.run(main())


def test_higher_priority_consumers_get_messages_while_they_have_room(amqp_server):
    async def main() -> None:
        queue_name = name("prio-consumers")
        connection = await aio_pika.connect(url(amqp_server))
        low_ch, high_ch = await connection.channel(), await connection.channel()
        await low_ch.set_qos(prefetch_count=100)
        await high_ch.set_qos(prefetch_count=2)
        low_q = await low_ch.declare_queue(queue_name)
        high_q = await high_ch.declare_queue(queue_name)
        inbox: asyncio.Queue = asyncio.Queue()

        async def to_low(message):
            await inbox.put(("low", message))

        async def to_high(message):
            await inbox.put(("high", message))

        await low_q.consume(to_low)  # registered first, so order alone would favour it
        await high_q.consume(to_high, arguments={"x-priority": 10})

        async def taker(body: bytes) -> str:
            await low_ch.default_exchange.publish(aio_pika.Message(body), queue_name)
            async with asyncio.timeout(WAIT_S):
                who, message = await inbox.get()
            assert message.body == body
            held.setdefault(who, []).append(message)
            return who

        held: dict[str, list] = {}
        assert [await taker(b"%d" % n) for n in range(4)] == ["high", "high", "low", "low"]
        await held["high"][0].ack()  # room again: the next message goes to the high one
        assert await taker(b"4") == "high"
        bad = await (await connection.channel()).declare_queue(queue_name)
        with pytest.raises(aio_pika.exceptions.ChannelPreconditionFailed):
            await bad.consume(to_low, arguments={"x-priority": "high"})
        await connection.close()
    asyncio.run(main())


def test_priority_levels_and_a_stream_are_rebuilt_after_a_crash(sluice_server, tmp_path):
    server = sluice_server(tmp_path / "data", "--flush", "sync")
    server.wait_ready()
    connection = connect(server)
    channel = connection.channel()
    channel.confirm_delivery()
    channel.queue_declare("urgent", durable=True, arguments={"x-max-priority": 3})
    channel.queue_declare("log", durable=True, arguments={"x-queue-type": "stream"})
    for body, priority in ((b"low", 0), (b"high", 3), (b"mid", 2)):
        persistent = pika.BasicProperties(delivery_mode=2, priority=priority)
        channel.basic_publish("", "urgent", body, persistent)
        channel.basic_publish("", "log", body, persistent)
    server.kill()  # SIGKILL: the levels and the stream come back from the log alone

    again = sluice_server(tmp_path / "data", "--flush", "sync")
    again.wait_ready()
    channel = connect(again).channel()
    got = [channel.basic_get("urgent", auto_ack=True)[2] for _ in range(3)]
    assert got == [b"high", b"mid", b"low"]
    channel.basic_qos(prefetch_count=10)
    read = []
    for method, properties, body in channel.consume("log", arguments={"x-stream-offset": "first"},
                                                    inactivity_timeout=WAIT_S):
        assert method is not None, "the stream lost messages"
        read.append(body)
        channel.basic_ack(method.delivery_tag)
        if len(read) == 3:
            break
    assert read == [b"low", b"high", b"mid"]
