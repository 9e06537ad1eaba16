"""Acks read in the same bytes as a channel.close or connection.close still count, as they do
for RabbitMQ, which reads a connection's frames in order: the acked message is not redelivered."""
from __future__ import annotations

from pamqp.commands import Basic, Channel, Confirm, Connection, Queue

from tests.unit.amqp.client import method
from tests.unit.amqp.fake_wire import Client, run
from tests.unit.amqp.test_messages import content, content_of_get, publish


async def one_delivered(client: Client) -> int:
    """Open channels 1 and 2, queue q with messages a and b; get a on channel 2."""
    await client.open(channels=(1, 2))
    assert isinstance(await client.call(1, Queue.Declare(queue="q")), Queue.DeclareOk)
    await client.call(1, Confirm.Select())
    for body in (b"a", b"b"):
        publish(client, body)
        await client.expect(Basic.Ack)
    client.send_method(2, Basic.Get(queue="q"))
    get, _, body = await content(client, Basic.GetOk)
    assert body == b"a"
    return get.delivery_tag


def test_an_ack_read_with_a_channel_close_counts(tmp_path):
    async def scenario(frontend, core):
        client = Client(frontend)
        tag = await one_delivered(client)
        client.send(method(2, Basic.Ack(tag)) + method(2, Channel.Close(200, "bye", 0, 0)))
        await client.expect(Channel.CloseOk)
        _, _, body = await content_of_get(client, "q")
        assert body == b"b", "the acked message came back"
    run(tmp_path, scenario)


def test_an_ack_read_with_a_connection_close_counts(tmp_path):
    async def scenario(frontend, core):
        client = Client(frontend)
        tag = await one_delivered(client)
        client.send(method(2, Basic.Ack(tag)) + method(0, Connection.Close(200, "bye", 0, 0)))
        await client.closed()
        other = Client(frontend)
        await other.open()
        get = await other.call(1, Basic.Get(queue="q"))
        assert isinstance(get, Basic.GetOk) and get.message_count == 0
        await other.next()  # the content header
        assert (await other.next())[1].value == b"b", "the acked message came back"
    run(tmp_path, scenario)
