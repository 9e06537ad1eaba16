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
