"""pika's asyncio adapter (``pika.adapters.asyncio_connection.AsyncioConnection``, callback
style) against a real `sluice serve`: declares, confirmed publishes (the acks arrive as
``Basic.Ack`` frames with ``multiple``), a consumer acking, nack with requeue, basic.get and
a channel closed by a 404 while the connection stays open."""
from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import Any

import pika
from pika.adapters.asyncio_connection import AsyncioConnection

from tests.integration.amqp.conftest import parameters

WAIT_S = 10


def name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


class Client:
    """Callbacks of one AsyncioConnection turned into awaitables."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.connection: AsyncioConnection | None = None

    def future(self) -> tuple[asyncio.Future, Callable[..., None]]:
        """A future and a pika callback resolving it with its last argument."""
        future = self.loop.create_future()

        def done(*args: Any) -> None:
            if not future.done():
                future.set_result(args[-1] if args else None)
        return future, done

    async def connect(self, server) -> None:
        opened = self.loop.create_future()
        self.connection = AsyncioConnection(
            parameters(server), custom_ioloop=self.loop,
            on_open_callback=lambda conn: opened.set_result(conn),
            on_open_error_callback=lambda conn, error: opened.set_exception(error))
        await asyncio.wait_for(opened, WAIT_S)

    async def channel(self) -> Any:
        future, done = self.future()
        self.connection.channel(on_open_callback=done)
        return await asyncio.wait_for(future, WAIT_S)

    async def call(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run a pika method taking ``callback=`` and await the frame it answers with."""
        future, done = self.future()
        method(*args, callback=done, **kwargs)
        return await asyncio.wait_for(future, WAIT_S)

    async def close(self) -> None:
        closed = self.loop.create_future()
        self.connection.add_on_close_callback(lambda conn, reason: closed.set_result(reason))
        self.connection.close()
        await asyncio.wait_for(closed, WAIT_S)


def test_declare_confirmed_publish_consume_and_ack(amqp_server):
    async def main() -> None:
        client = Client(asyncio.get_running_loop())
        await client.connect(amqp_server)
        channel = await client.channel()
        exchange, queue = name("pa-fanout"), name("pa-q")
        await client.call(channel.exchange_declare, exchange, "fanout", durable=False)
        declared = await client.call(channel.queue_declare, queue, auto_delete=True)
        assert declared.method.queue == queue and declared.method.message_count == 0
        await client.call(channel.queue_bind, queue, exchange)
        acks: list[pika.spec.Basic.Ack] = []
        all_acked = asyncio.get_running_loop().create_future()

        def on_confirm(frame: Any) -> None:
            acks.append(frame.method)
            if frame.method.delivery_tag == 3 and not all_acked.done():
                all_acked.set_result(None)
        selected = asyncio.get_running_loop().create_future()
        channel.confirm_delivery(on_confirm, callback=lambda frame: selected.set_result(frame))
        await asyncio.wait_for(selected, WAIT_S)
        for n in range(1, 4):
            channel.basic_publish(exchange, "", f"m{n}".encode(),
                                  pika.BasicProperties(delivery_mode=2, headers={"n": n}))
        await asyncio.wait_for(all_acked, WAIT_S)
        assert all(isinstance(ack, pika.spec.Basic.Ack) for ack in acks)
        received: asyncio.Queue = asyncio.Queue()
        await client.call(channel.basic_qos, prefetch_count=10)
        consume_ok = asyncio.get_running_loop().create_future()
        tag = channel.basic_consume(queue, lambda ch, method, props, body:
                                    received.put_nowait((method, props, body)),
                                    callback=lambda frame: consume_ok.set_result(frame))
        await asyncio.wait_for(consume_ok, WAIT_S)
        got = [await asyncio.wait_for(received.get(), WAIT_S) for _ in range(3)]
        assert [(body, props.headers) for _, props, body in got] == [
            (f"m{n}".encode(), {"n": n}) for n in range(1, 4)]
        assert all(method.consumer_tag == tag and not method.redelivered for method, _, _ in got)
        channel.basic_ack(got[-1][0].delivery_tag, multiple=True)
        await client.call(channel.basic_cancel, tag)
        # auto_delete: the queue went with its last consumer
        gone = await client.channel()
        closed = asyncio.get_running_loop().create_future()
        gone.add_on_close_callback(lambda ch, reason: closed.set_result(reason))
        gone.queue_declare(queue, passive=True)
        reason = await asyncio.wait_for(closed, WAIT_S)
        assert reason.reply_code == 404
        await client.close()
    asyncio.run(main())


def test_nack_requeue_and_get(amqp_server):
    async def main() -> None:
        client = Client(asyncio.get_running_loop())
        await client.connect(amqp_server)
        channel = await client.channel()
        queue = (await client.call(channel.queue_declare, "", exclusive=True)).method.queue
        channel.basic_publish("", queue, b"retry", pika.BasicProperties(correlation_id="c"))
        future, done = client.future()
        channel.basic_get(queue, lambda ch, method, props, body: done((method, props, body)))
        method, props, body = await asyncio.wait_for(future, WAIT_S)
        assert (body, props.correlation_id, method.redelivered) == (b"retry", "c", False)
        channel.basic_nack(method.delivery_tag, requeue=True)
        future, done = client.future()
        channel.basic_get(queue, lambda ch, method, props, body: done((method, props, body)))
        method, props, body = await asyncio.wait_for(future, WAIT_S)
        assert (body, method.redelivered) == (b"retry", True)
        channel.basic_ack(method.delivery_tag)
        future, done = client.future()
        channel.callbacks.add(channel.channel_number, pika.spec.Basic.GetEmpty, done)
        channel.basic_get(queue, lambda *delivered: done(delivered))
        assert isinstance((await asyncio.wait_for(future, WAIT_S)).method, pika.spec.Basic.GetEmpty)
        await client.close()
    asyncio.run(main())
