"""AMQP transactions against a real `sluice serve` with pika: publishes and acks of a
transactional channel take effect at tx.commit (durable by commit-ok: they survive a SIGKILL
right after it), tx.rollback drops them, and a channel is transactional or confirming, never
both (406 as in RabbitMQ)."""
from __future__ import annotations

import uuid

import pika
import pika.exceptions as errors
import pytest

from tests.integration.amqp.conftest import connect


def name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def ready(channel, queue: str) -> int:
    return channel.queue_declare(queue, passive=True).method.message_count


def test_publishes_are_stored_at_commit_and_dropped_at_rollback(amqp_server):
    connection = connect(amqp_server)
    tx, watch = connection.channel(), connection.channel()
    queue = name("tx")
    watch.queue_declare(queue)
    tx.tx_select()
    for n in range(3):
        tx.basic_publish("", queue, b"%d" % n)
    assert ready(watch, queue) == 0, "a publish in a transaction was stored before commit"
    tx.tx_commit()
    assert ready(watch, queue) == 3
    tx.basic_publish("", queue, b"rolled back")
    tx.tx_rollback()
    tx.tx_commit()  # an empty transaction: nothing more
    assert ready(watch, queue) == 3
    assert [watch.basic_get(queue, auto_ack=True)[2] for _ in range(3)] == [b"0", b"1", b"2"]
    assert watch.basic_get(queue) == (None, None, None)
    connection.close()


def test_acks_take_effect_at_commit_and_rollback_leaves_them_unacked(amqp_server):
    connection = connect(amqp_server)
    setup = connection.channel()
    queue = name("tx-acks")
    setup.queue_declare(queue)
    for n in range(3):
        setup.basic_publish("", queue, b"%d" % n)
    tx = connection.channel()
    tx.tx_select()
    tags = [tx.basic_get(queue)[0].delivery_tag for _ in range(3)]
    tx.basic_ack(tags[0])
    tx.tx_rollback()  # the ack of message 0 is undone: it stays unacked
    tx.basic_ack(tags[1])
    tx.tx_commit()  # message 1 is acked for good
    tx.basic_ack(tags[2])  # never committed
    tx.close()  # the unacked and uncommitted come back
    back = sorted(setup.basic_get(queue, auto_ack=True)[2] for _ in range(2))
    assert back == [b"0", b"2"] and ready(setup, queue) == 0
    connection.close()


def test_a_channel_is_transactional_or_confirming_not_both(amqp_server):
    connection = connect(amqp_server)
    channel = connection.channel()
    channel.confirm_delivery()
    with pytest.raises(errors.ChannelClosedByBroker) as refused:
        channel.tx_select()
    assert refused.value.reply_code == 406
    assert "cannot switch from confirm to tx mode" in refused.value.reply_text
    channel = connection.channel()
    channel.tx_select()
    with pytest.raises(errors.ChannelClosedByBroker) as refused:
        channel.confirm_delivery()
    assert refused.value.reply_code == 406
    assert "cannot switch from tx to confirm mode" in refused.value.reply_text
    channel = connection.channel()
    with pytest.raises(errors.ChannelClosedByBroker) as refused:
        channel.tx_commit()
    assert refused.value.reply_code == 406 and "not transactional" in refused.value.reply_text
    connection.close()


def test_a_committed_transaction_survives_a_sigkill(sluice_server, tmp_path):
    server = sluice_server(tmp_path / "data")
    server.wait_ready()
    connection = connect(server)
    channel = connection.channel()
    channel.queue_declare("ledger", durable=True)
    channel.tx_select()
    for n in range(50):
        channel.basic_publish("", "ledger", b"entry %d" % n, pika.BasicProperties(delivery_mode=2))
    channel.tx_commit()
    server.kill()  # SIGKILL right after commit-ok

    again = sluice_server(tmp_path / "data")
    again.wait_ready()
    connection = connect(again)
    channel = connection.channel()
    bodies = [channel.basic_get("ledger", auto_ack=True)[2] for _ in range(50)]
    assert bodies == [b"entry %d" % n for n in range(50)]
    connection.close()
