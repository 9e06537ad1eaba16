"""Queue limits across a broker restart: a durable queue keeps its arguments (TTL, dead-letter
exchange, x-expires) and its incarnation, a quorum queue's delivery count goes on, and an
x-expires queue is deleted once unused after the restart too."""
from __future__ import annotations

import time

import pika.exceptions as errors

from tests.integration.amqp.conftest import connect
from tests.integration.amqp.test_queue_limits import WAIT_S, next_message

ARGUMENTS = {"x-message-ttl": 100, "x-dead-letter-exchange": "dlx"}


def test_queue_arguments_and_delivery_counts_survive_a_restart(sluice_server, tmp_path):
    server = sluice_server(tmp_path / "data")
    server.wait_ready()
    connection = connect(server)
    channel = connection.channel()
    channel.confirm_delivery()
    channel.exchange_declare("dlx", "fanout", durable=True)
    channel.queue_declare("dead", durable=True)
    channel.queue_bind("dead", "dlx")
    channel.queue_declare("ttl", durable=True, arguments=ARGUMENTS)
    channel.queue_declare("idle", durable=True, arguments={"x-expires": 300})
    channel.queue_declare("qq", durable=True, arguments={"x-queue-type": "quorum"})
    channel.basic_publish("", "qq", b"again")
    method, _, _ = channel.basic_get("qq")
    channel.basic_nack(method.delivery_tag, requeue=True)
    connection.close()
    assert server.stop() == 0

    again = sluice_server(tmp_path / "data")
    again.wait_ready()
    connection = connect(again)
    channel = connection.channel()
    channel.confirm_delivery()
    channel.queue_declare("ttl", durable=True, arguments=ARGUMENTS)  # the same: accepted
    channel.basic_publish("", "ttl", b"stale")
    _, properties, body = next_message(channel, "dead")
    assert body == b"stale" and properties.headers["x-death"][0]["reason"] == "expired"

    method, properties, body = channel.basic_get("qq", auto_ack=True)
    assert body == b"again" and method.redelivered
    assert properties.headers["x-delivery-count"] == 1

    deadline = time.monotonic() + WAIT_S
    while True:  # nothing announces the deletion: look until it is gone
        probe = connect(again)
        try:
            probe.channel().queue_declare("idle", passive=True)
        except errors.ChannelClosedByBroker as closed:
            assert closed.reply_code == 404
            break
        finally:
            if probe.is_open:
                probe.close()
        assert time.monotonic() < deadline, "x-expires did not delete the queue"
        connection.process_data_events(time_limit=0.05)
    connection.close()
