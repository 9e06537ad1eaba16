"""aio-pika against a real `sluice serve`: connect, declare and bind, a refusal, heartbeats,
and a publish or confirm.select (aio-pika's default channel) answered with 540."""
from __future__ import annotations

import asyncio

import aio_pika
import aiormq.exceptions
import pytest


def url(server, user: str = "guest", password: str = "guest", heartbeat: int = 9) -> str:
    return f"amqp://{user}:{password}@{server.amqp}/?heartbeat={heartbeat}"


def test_declare_bind_and_a_refusal(amqp_server):
    async def main() -> None:
        connection = await aio_pika.connect(url(amqp_server))
        assert connection.transport.connection.connection_tune.heartbeat == 9
        channel = await connection.channel(publisher_confirms=False)  # confirms come later
        exchange = await channel.declare_exchange("aio-events", aio_pika.ExchangeType.FANOUT)
        queue = await channel.declare_queue("", exclusive=True)
        await queue.bind(exchange)
        with pytest.raises(aiormq.exceptions.ChannelPreconditionFailed):
            await channel.declare_exchange("aio-events", aio_pika.ExchangeType.DIRECT)
        await connection.close()
    asyncio.run(main())


def test_a_publish_closes_the_connection_with_540(amqp_server):
    async def main() -> None:
        connection = await aio_pika.connect(url(amqp_server))
        channel = await connection.channel(publisher_confirms=False)
        await channel.default_exchange.publish(aio_pika.Message(b"hello"), routing_key="q")
        with pytest.raises(aiormq.exceptions.ConnectionNotImplemented):
            await asyncio.wait_for(connection.transport.connection.closing, 10)
            await channel.declare_queue("", exclusive=True)
    asyncio.run(main())


def test_a_default_channel_asks_for_confirms_and_gets_540(amqp_server):
    async def main() -> None:
        connection = await aio_pika.connect(url(amqp_server))
        with pytest.raises(aiormq.exceptions.ConnectionNotImplemented, match="Confirm.Select"):
            await connection.channel()
    asyncio.run(main())
