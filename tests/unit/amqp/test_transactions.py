"""Transactions through the AMQP adapter on fake wires: what one connection's open transactions
may hold is bounded (406 beyond it, the budget coming back at rollback), and a tx method on a
channel that is not transactional is 406."""
from __future__ import annotations

from pamqp.commands import Basic, Channel, Queue, Tx

from protocols.amqp import transactions
from protocols.amqp.frames import encode_content
from tests.unit.amqp.fake_wire import Client, run


def publish(client: Client, body: bytes) -> None:
    client.send(encode_content(1, Basic.Publish(exchange="", routing_key="q"),
                               Basic.Properties(), body, 4096))


def test_a_transaction_holds_a_bounded_number_of_bytes(tmp_path, monkeypatch):
    monkeypatch.setattr(transactions, "MAX_HELD_BYTES", 10)

    async def scenario(frontend, core):
        client = Client(frontend)
        await client.open()
        assert isinstance(await client.call(1, Queue.Declare(queue="q")), Queue.DeclareOk)
        assert isinstance(await client.call(1, Tx.Select()), Tx.SelectOk)
        publish(client, b"8 bytes!")
        assert isinstance(await client.call(1, Tx.Rollback()), Tx.RollbackOk)
        publish(client, b"8 bytes!")  # the rollback gave the budget back
        publish(client, b"8 more!!")
        close = (await client.next())[1]
        assert isinstance(close, Channel.Close) and close.reply_code == 406
        assert "at most 10 bytes" in close.reply_text
    run(tmp_path, scenario)


def test_commit_and_rollback_need_tx_select(tmp_path):
    async def scenario(frontend, core):
        client = Client(frontend)
        await client.open(channels=(1, 2))
        for channel, method in ((1, Tx.Commit()), (2, Tx.Rollback())):
            close = await client.call(channel, method)
            assert isinstance(close, Channel.Close) and close.reply_code == 406
            assert close.reply_text == "PRECONDITION_FAILED - channel is not transactional"
    run(tmp_path, scenario)


def test_an_unknown_delivery_tag_in_a_transaction_is_406_at_once(tmp_path):
    async def scenario(frontend, core):
        client = Client(frontend)
        await client.open()
        assert isinstance(await client.call(1, Queue.Declare(queue="q")), Queue.DeclareOk)
        publish(client, b"one")
        got = await client.call(1, Basic.Get(queue="q"))
        assert isinstance(got, Basic.GetOk)
        await client.next()  # header
        await client.next()  # body
        assert isinstance(await client.call(1, Tx.Select()), Tx.SelectOk)
        client.send_method(1, Basic.Ack(got.delivery_tag))
        close = await client.call(1, Basic.Ack(got.delivery_tag))  # twice in one transaction
        assert isinstance(close, Channel.Close) and close.reply_code == 406
        assert close.reply_text == f"PRECONDITION_FAILED - unknown delivery tag {got.delivery_tag}"
    run(tmp_path, scenario)
