"""Durable exchanges, queues and bindings survive a broker restart; transient ones do not; the
guest user is created on the first start only when ``amqp.guest_from_loopback`` is on."""
from __future__ import annotations

import pika.exceptions as errors
import pytest

from tests.conftest import CONFIG
from tests.integration.amqp.conftest import SLUICE_PASSWORD, SLUICE_USER, connect


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
