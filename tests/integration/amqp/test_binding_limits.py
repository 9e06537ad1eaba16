"""Binding limits against a real `sluice serve` with pika and aio-pika: a binding beyond the
queue's, the exchange's or the virtual host's limit is refused with 406 PRECONDITION_FAILED on its
channel, naming the setting, and the connection goes on; a queue with thousands of bindings is
deleted in one go."""
from __future__ import annotations

import asyncio

import aio_pika
import aiormq.exceptions
import pika.exceptions as errors
import pytest

from tests.conftest import CONFIG
from tests.integration.amqp.conftest import connect

LIMITS = CONFIG + """
[core]
max_bindings_per_queue = 3
max_bindings_per_exchange = 4
max_bindings_per_vhost = 6
"""


@pytest.fixture
def limited_server(sluice_server, tmp_path):
    server = sluice_server(tmp_path / "data", config=LIMITS)
    server.wait_ready()
    return server


def test_pika_a_binding_beyond_the_queues_limit_is_refused_406(limited_server):
    connection = connect(limited_server)
    channel = connection.channel()
    channel.queue_declare("pika-limited", exclusive=True)
    for key in ("a", "b", "c"):
        channel.queue_bind("pika-limited", "amq.direct", key)
    channel.queue_bind("pika-limited", "amq.direct", "c")  # bound already: no new binding
    with pytest.raises(errors.ChannelClosedByBroker) as refused:
        channel.queue_bind("pika-limited", "amq.direct", "d")
    assert refused.value.reply_code == 406
    assert "core.max_bindings_per_queue" in refused.value.reply_text
    again = connection.channel()  # only the channel closed
    again.queue_unbind("pika-limited", "amq.direct", "a")
    again.queue_bind("pika-limited", "amq.direct", "d")
    connection.close()


def test_pika_a_binding_beyond_the_vhosts_limit_is_refused_406(limited_server):
    connection = connect(limited_server)
    channel = connection.channel()
    for queue in ("v1", "v2", "v3"):
        channel.queue_declare(queue, exclusive=True)
        channel.queue_bind(queue, "amq.direct", "a")
        channel.queue_bind(queue, "amq.fanout", "")
    with pytest.raises(errors.ChannelClosedByBroker) as refused:
        channel.queue_bind("v1", "amq.topic", "#")
    assert refused.value.reply_code == 406
    assert "core.max_bindings_per_vhost" in refused.value.reply_text
    connection.close()


def test_aio_pika_a_binding_beyond_the_exchanges_limit_is_refused_406(limited_server):
    async def main() -> None:
        connection = await aio_pika.connect(f"amqp://guest:guest@{limited_server.amqp}/")
        channel = await connection.channel()
        exchange = await channel.declare_exchange("aio-limited", aio_pika.ExchangeType.HEADERS)
        queues = [await channel.declare_queue(f"aio-{i}", exclusive=True) for i in range(5)]
        for queue in queues[:4]:
            await queue.bind(exchange, arguments={"x-match": "all", "q": queue.name})
        with pytest.raises(aiormq.exceptions.ChannelPreconditionFailed) as refused:
            await queues[4].bind(exchange, arguments={"q": queues[4].name})
        assert "core.max_bindings_per_exchange" in str(refused.value)
        channel = await connection.channel()  # the headers exchange routes by its index
        exchange = await channel.get_exchange("aio-limited")
        await exchange.publish(aio_pika.Message(b"routed", headers={"q": "aio-2"}), "")
        got = await (await channel.get_queue("aio-2")).get(timeout=10)
        assert got.body == b"routed"
        await connection.close()
    asyncio.run(main())


def test_a_queue_with_thousands_of_bindings_is_deleted(sluice_server, tmp_path):
    server = sluice_server(tmp_path / "data")
    server.wait_ready()
    connection = connect(server)
    channel = connection.channel()
    channel.queue_declare("many", durable=False)
    channel.queue_declare("other", durable=False)
    for i in range(2_000):
        channel.queue_bind("many", "amq.topic", f"devices.d{i}.#")
    channel.queue_bind("other", "amq.topic", "devices.d1.#")
    assert channel.queue_delete("many").method.message_count == 0
    channel.basic_publish("amq.topic", "devices.d1.temp", b"21.5")
    assert channel.queue_declare("other", passive=True).method.message_count == 1
    with pytest.raises(errors.ChannelClosedByBroker) as gone:
        channel.queue_declare("many", passive=True)
    assert gone.value.reply_code == 404
    connection.close()
