"""Durable exchanges, queues and bindings survive a broker restart; transient ones do not; the
guest user is created on the first start only when ``amqp.guest_from_loopback`` is on; publishes
a client's close was answered for are stored."""
from __future__ import annotations

import pika
import pika.exceptions as errors
import pytest

from tests.conftest import CONFIG
from tests.integration.amqp.conftest import SLUICE_PASSWORD, SLUICE_USER, connect

WAIT_S = 30.0


def test_durable_topology_survives_a_restart(sluice_server, tmp_path):
    server = sluice_server(tmp_path / "data")
    server.wait_ready()
    connection = connect(server)
    channel = connection.channel()
    channel.exchange_declare("orders", "topic", durable=True)
    channel.queue_declare("billing", durable=True, arguments={"x-note": b"kept"})
    channel.queue_bind("billing", "orders", "order.*")
    channel.queue_declare("scratch", durable=False)
    connection.close()
    assert server.stop() == 0

    again = sluice_server(tmp_path / "data")
    again.wait_ready()
    connection = connect(again)
    channel = connection.channel()
    channel.exchange_declare("orders", passive=True)
    channel.queue_declare("billing", passive=True)
    channel.queue_bind("billing", "orders", "order.*")  # the same binding again: no change
    channel.queue_declare("billing", durable=True, arguments={"x-note": "kept"})
    with pytest.raises(errors.ChannelClosedByBroker) as gone:
        channel.queue_declare("scratch", passive=True)
    assert gone.value.reply_code == 404
    connection.close()


def test_without_guest_from_loopback_there_is_no_guest(sluice_server, tmp_path):
    server = sluice_server(tmp_path / "data", config=CONFIG + "[amqp]\nguest_from_loopback = false\n")
    server.wait_ready()
    with pytest.raises(errors.ProbableAuthenticationError):
        connect(server)
    connect(server, user=SLUICE_USER, password=SLUICE_PASSWORD).close()


@pytest.mark.parametrize("stop", ["SIGTERM", "SIGKILL"])
def test_publishes_answered_by_close_ok_survive_the_broker_and_reach_a_consumer(
        sluice_server, tmp_path, stop):
    """Persistent publishes without confirms, then connection.close(): once close-ok is back
    they are stored (durable under sync flush), so they outlive a graceful stop, and a SIGKILL
    too, and a consumer gets each of them after the restart."""
    server = sluice_server(tmp_path / "data")
    server.wait_ready()
    connection = connect(server)
    channel = connection.channel()
    channel.queue_declare("kept", durable=True)
    for i in range(5):
        channel.basic_publish("", "kept", f"m{i}".encode(),
                              pika.BasicProperties(delivery_mode=2))
    channel.close()
    for i in range(5, 10):
        connection.channel().basic_publish("", "kept", f"m{i}".encode(),
                                           pika.BasicProperties(delivery_mode=2))
    connection.close()
    if stop == "SIGTERM":
        assert server.stop() == 0
    else:
        server.kill()

    again = sluice_server(tmp_path / "data")
    again.wait_ready()
    connection = connect(again)
    channel = connection.channel()
    got = []
    for method, _, body in channel.consume("kept", inactivity_timeout=WAIT_S):
        assert method is not None, f"only {got} arrived"
        channel.basic_ack(method.delivery_tag)
        got.append(body)
        if len(got) == 10:
            break
    channel.cancel()
    assert got == [f"m{i}".encode() for i in range(10)]
    connection.close()
