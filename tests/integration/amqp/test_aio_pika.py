"""aio-pika against a real `sluice serve`: connect, declare and bind, a refusal, heartbeats,
and publisher confirms (aio-pika's default channel) with a consumer."""
from __future__ import annotations

import asyncio
from datetime import datetime, timezone

import aio_pika
import aiormq.exceptions
from pamqp.commands import Basic
import pytest


def url(server, user: str = "guest", password: str = "guest", heartbeat: int = 9) -> str:
    return f"amqp://{user}:{password}@{server.amqp}/?heartbeat={heartbeat}"


def test_declare_bind_and_a_refusal(amqp_server):
    async def main() -> None:
        connection = await aio_pika.connect(url(amqp_server))
        assert connection.transport.connection.connection_tune.heartbeat == 9
        channel = await connection.channel()
        exchange = await channel.declare_exchange("aio-events", aio_pika.ExchangeType.FANOUT)
        queue = await channel.declare_queue("", exclusive=True)
        await queue.bind(exchange)
        with pytest.raises(aiormq.exceptions.ChannelPreconditionFailed):
            await channel.declare_exchange("aio-events", aio_pika.ExchangeType.DIRECT)
        await connection.close()
    asyncio.run(main())


def test_publisher_confirms_and_a_consumer_round_trip(amqp_server):
    async def main() -> None:
        connection = await aio_pika.connect(url(amqp_server))
        channel = await connection.channel()  # publisher confirms on
        queue = await channel.declare_queue("", exclusive=True)
        stamp = datetime(2024, 5, 1, 12, 0, tzinfo=timezone.utc)
        sent = aio_pika.Message(b"hello", headers={"k": "v", "n": 1}, message_id="m-1",
                                correlation_id="c-1", timestamp=stamp,
                                delivery_mode=aio_pika.DeliveryMode.PERSISTENT)
        confirmation = await channel.default_exchange.publish(sent, routing_key=queue.name)
        assert isinstance(confirmation, Basic.Ack)
        async with queue.iterator() as messages:
            async for message in messages:
                async with message.process():
                    assert message.body == b"hello" and message.headers == {"k": "v", "n": 1}
                    assert (message.message_id, message.correlation_id) == ("m-1", "c-1")
                    assert message.timestamp == stamp and not message.redelivered
                break
        await connection.close()
    asyncio.run(main())


def test_a_direct_reply_address_reaches_its_consumer_only_from_its_own_virtual_host(amqp_server):
    """Direct reply-to addresses are per virtual host, as in RabbitMQ: a publisher on another
    virtual host that learned an address reaches no one (its mandatory reply comes back
    NO_ROUTE); a reply from the requester's own virtual host arrives."""
    from tests.integration.test_admin_api import Http
    admin = Http(amqp_server.admin if "://" in amqp_server.admin else f"http://{amqp_server.admin}")
    assert admin("POST", "/vhosts", {"name": "reply-elsewhere"})[0] in (201, 409)

    async def main() -> None:
        caller = await aio_pika.connect(url(amqp_server))
        calling = await caller.channel()
        replies: asyncio.Queue = asyncio.Queue()
        reply_consumer = await calling.get_queue("amq.rabbitmq.reply-to", ensure=False)
        await reply_consumer.consume(replies.put, no_ack=True)
        requests = await calling.declare_queue("", exclusive=True)
        await calling.default_exchange.publish(
            aio_pika.Message(b"ping", reply_to="amq.rabbitmq.reply-to"), routing_key=requests.name)
        request = await requests.get(timeout=10)
        address = request.reply_to
        assert address.startswith("amq.rabbitmq.reply-to.")

        outsider = await aio_pika.connect(
            f"amqp://sluice:sluice@{amqp_server.amqp}/reply-elsewhere?heartbeat=9")
        forging = await outsider.channel(on_return_raises=True)
        with pytest.raises(aio_pika.exceptions.DeliveryError):
            await forging.default_exchange.publish(aio_pika.Message(b"forged"),
                                                   routing_key=address, mandatory=True)
        answerer = await aio_pika.connect(url(amqp_server))
        answering = await answerer.channel()
        await answering.default_exchange.publish(aio_pika.Message(b"genuine"), routing_key=address,
                                                 mandatory=True)
        reply = await asyncio.wait_for(replies.get(), 10)
        assert reply.body == b"genuine"
        await outsider.close()
        await answerer.close()
        await caller.close()
    asyncio.run(main())
