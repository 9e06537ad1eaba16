"""aiormq (the low-level asyncio client under aio-pika) against a real `sluice serve`: the
declare-ok answers, confirmed publishes, a consumer acking with prefetch, nack with and without
requeue, basic.get, a mandatory return, and channel errors that leave the connection open."""
from __future__ import annotations

import asyncio
import uuid

import aiormq
import aiormq.exceptions
import pytest
from pamqp.commands import Basic

WAIT_S = 10


def name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def url(server) -> str:
    return f"amqp://guest:guest@{server.amqp}//?heartbeat=5"


def test_declare_answers_confirms_consume_and_ack(amqp_server):
    async def main() -> None:
        connection = await aiormq.connect(url(amqp_server))
        channel = await connection.channel()  # publisher confirms on by default
        exchange = name("aiormq-direct")
        assert isinstance(await channel.exchange_declare(exchange, exchange_type="direct"),
                          aiormq.spec.Exchange.DeclareOk)
        declared = await channel.queue_declare("", exclusive=True)
        assert declared.queue.startswith("amq.gen-") and declared.message_count == 0
        await channel.queue_bind(declared.queue, exchange, routing_key="k")
        for n in range(5):
            confirmation = await channel.basic_publish(
                str(n).encode(), exchange=exchange, routing_key="k",
                properties=aiormq.spec.Basic.Properties(delivery_mode=2, message_id=f"m{n}"))
            assert isinstance(confirmation, Basic.Ack)
        counted = await channel.queue_declare(declared.queue, passive=True)
        assert counted.message_count == 5 and counted.consumer_count == 0
        await channel.basic_qos(prefetch_count=2)
        received: asyncio.Queue = asyncio.Queue()
        consume_ok = await channel.basic_consume(declared.queue, received.put)
        bodies = []
        for _ in range(5):
            message = await asyncio.wait_for(received.get(), WAIT_S)
            bodies.append((message.body, message.header.properties.message_id))
            await message.channel.basic_ack(message.delivery.delivery_tag)
        assert bodies == [(str(n).encode(), f"m{n}") for n in range(5)]
        await channel.basic_cancel(consume_ok.consumer_tag)
        assert (await channel.queue_declare(declared.queue, passive=True)).message_count == 0
        await connection.close()
    asyncio.run(main())


def test_nack_requeue_get_and_get_empty(amqp_server):
    async def main() -> None:
        connection = await aiormq.connect(url(amqp_server))
        channel = await connection.channel()
        queue = (await channel.queue_declare("", exclusive=True)).queue
        await channel.basic_publish(b"one", routing_key=queue)
        await channel.basic_publish(b"two", routing_key=queue)
        first = await channel.basic_get(queue)
        assert first.body == b"one" and not first.delivery.redelivered
        assert first.delivery.message_count == 1
        await channel.basic_nack(first.delivery.delivery_tag, requeue=True)
        again = await channel.basic_get(queue)
        assert again.body == b"one" and again.delivery.redelivered
        second = await channel.basic_get(queue)
        assert second.body == b"two"
        await channel.basic_nack(second.delivery.delivery_tag, multiple=True, requeue=False)
        empty = await channel.basic_get(queue)
        assert isinstance(empty.delivery, Basic.GetEmpty)
        await connection.close()
    asyncio.run(main())


def test_mandatory_publish_is_returned(amqp_server):
    async def main() -> None:
        connection = await aiormq.connect(url(amqp_server))
        channel = await connection.channel(on_return_raises=True)
        with pytest.raises(aiormq.exceptions.PublishError) as returned:
            await channel.basic_publish(b"nobody", exchange="amq.direct", routing_key=name("none"),
                                        mandatory=True)
        assert returned.value.message.body == b"nobody"
        await connection.close()
    asyncio.run(main())


def test_channel_errors_close_only_the_channel(amqp_server):
    async def main() -> None:
        connection = await aiormq.connect(url(amqp_server))
        channel = await connection.channel()
        with pytest.raises(aiormq.exceptions.ChannelNotFoundEntity) as missing:
            await channel.queue_declare(name("missing"), passive=True)
        assert missing.value.args[0].startswith("NOT_FOUND - no queue")
        channel = await connection.channel()
        with pytest.raises(aiormq.exceptions.ChannelPreconditionFailed):
            await channel.exchange_declare("amq.direct", exchange_type="fanout")
        channel = await connection.channel()
        with pytest.raises(aiormq.exceptions.ChannelAccessRefused):
            await channel.exchange_declare(name("amq.reserved"), exchange_type="direct")
        channel = await connection.channel()
        with pytest.raises(aiormq.exceptions.ChannelNotFoundEntity):
            await channel.basic_publish(b"x", exchange=name("no-exchange"), routing_key="k")
        channel = await connection.channel()
        assert (await channel.queue_declare("", exclusive=True)).queue
        assert not connection.is_closed
        await connection.close()
    asyncio.run(main())


def test_direct_reply_to_round_trip(amqp_server):
    """RabbitMQ's direct reply-to: the reply reaches the requesting channel's no-ack consumer
    of amq.rabbitmq.reply-to, and nothing is stored for it."""
    async def main() -> None:
        server = await aiormq.connect(url(amqp_server))
        serving = await server.channel()
        requests = (await serving.queue_declare("", exclusive=True)).queue

        async def answer(message) -> None:
            props = message.header.properties
            await serving.basic_publish(message.body.upper(), routing_key=props.reply_to,
                                        properties=aiormq.spec.Basic.Properties(
                                            correlation_id=props.correlation_id))
        await serving.basic_consume(requests, answer, no_ack=True)
        client = await aiormq.connect(url(amqp_server))
        calling = await client.channel()
        replies: asyncio.Queue = asyncio.Queue()
        await calling.basic_consume("amq.rabbitmq.reply-to", replies.put, no_ack=True)
        await calling.basic_publish(b"ping", routing_key=requests, properties=(
            aiormq.spec.Basic.Properties(reply_to="amq.rabbitmq.reply-to", correlation_id="7")))
        reply = await asyncio.wait_for(replies.get(), WAIT_S)
        assert (reply.body, reply.header.properties.correlation_id) == (b"PING", "7")
        assert reply.delivery.routing_key.startswith("amq.rabbitmq.reply-to.")
        assert reply.delivery.exchange == "" and not reply.delivery.redelivered
        await client.close()
        await server.close()
    asyncio.run(main())
