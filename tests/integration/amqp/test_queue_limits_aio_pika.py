"""Messages leaving queues with aio-pika against a real `sluice serve`: a consumer's reject
dead-letters with x-death, an expiration set in seconds expires the message, a full
reject-publish queue fails the publish, and a quorum queue counts redeliveries."""
from __future__ import annotations

import asyncio
import uuid

import aio_pika
import aio_pika.exceptions
import pytest

from tests.integration.amqp.test_aio_pika import url

WAIT_S = 10


def name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


async def first(queue: aio_pika.abc.AbstractQueue) -> aio_pika.abc.AbstractIncomingMessage:
    """The next message of ``queue``, acked."""
    async with queue.iterator() as messages:
        async for message in messages:
            await message.ack()
            return message
    raise AssertionError("the iterator ended")


def test_a_consumer_s_reject_and_an_expiration_dead_letter_with_x_death(amqp_server):
    async def main() -> None:
        connection = await aio_pika.connect(url(amqp_server))
        channel = await connection.channel()
        dlx = await channel.declare_exchange(name("dlx"), aio_pika.ExchangeType.FANOUT)
        dead = await channel.declare_queue(name("dead"))
        await dead.bind(dlx)
        source = await channel.declare_queue(name("src"),
                                             arguments={"x-dead-letter-exchange": dlx.name})
        await channel.default_exchange.publish(aio_pika.Message(b"refused"), source.name)
        async with source.iterator() as messages:
            async for message in messages:
                await message.reject(requeue=False)
                break
        rejected = await asyncio.wait_for(first(dead), WAIT_S)
        assert rejected.body == b"refused"
        assert rejected.headers["x-death"][0]["reason"] == "rejected"
        assert rejected.headers["x-first-death-queue"] == source.name

        await channel.default_exchange.publish(
            aio_pika.Message(b"late", expiration=0.05), source.name)
        expired = await asyncio.wait_for(first(dead), WAIT_S)
        assert expired.body == b"late" and expired.expiration is None
        death = expired.headers["x-death"][0]
        assert (death["reason"], death["original-expiration"]) == ("expired", "50")
        await connection.close()
    asyncio.run(main())


def test_a_full_reject_publish_queue_fails_the_publish(amqp_server):
    async def main() -> None:
        connection = await aio_pika.connect(url(amqp_server))
        channel = await connection.channel()
        queue = await channel.declare_queue(name("one"), arguments={
            "x-max-length": 1, "x-overflow": "reject-publish"})
        await channel.default_exchange.publish(aio_pika.Message(b"in"), queue.name)
        with pytest.raises(aio_pika.exceptions.DeliveryError):
            await channel.default_exchange.publish(aio_pika.Message(b"out"), queue.name)
        await connection.close()
    asyncio.run(main())


def test_a_quorum_queue_redelivery_carries_x_delivery_count(amqp_server):
    async def main() -> None:
        connection = await aio_pika.connect(url(amqp_server))
        channel = await connection.channel()
        queue = await channel.declare_queue(name("qq"), durable=True,
                                            arguments={"x-queue-type": "quorum"})
        await channel.default_exchange.publish(aio_pika.Message(b"retry"), queue.name)
        counts = []
        async with queue.iterator() as messages:
            async for message in messages:
                counts.append((message.redelivered, (message.headers or {}).get(
                    "x-delivery-count")))
                if len(counts) == 3:
                    await message.ack()
                    break
                await message.nack(requeue=True)
        assert counts == [(False, None), (True, 1), (True, 2)]
        await queue.delete()
        await connection.close()
    asyncio.run(main())
