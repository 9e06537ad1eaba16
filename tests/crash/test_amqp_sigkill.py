"""SIGKILL `sluice serve` (sync flush) with confirmed AMQP publishes stored and deliveries left
unacknowledged: after the restart every confirmed message is still in its durable queue, the
unacknowledged ones come back with redelivered=true (the others with redelivered=false), and
the topology is there.

The kill happens on events (every publish confirmed, the deliveries received), never after a
fixed sleep.
"""
from __future__ import annotations

import pika
import pytest

from tests.integration.amqp.conftest import connect

pytestmark = pytest.mark.crash

MESSAGES = 200
UNACKED = 5
PREFETCH = 3


def drain(channel) -> list[tuple[bytes, bool]]:
    """Every message left in ``jobs``, acknowledged: (body, redelivered)."""
    got = []
    while True:
        method, _, body = channel.basic_get("jobs")
        if method is None:
            return got
        got.append((body, method.redelivered))
        channel.basic_ack(method.delivery_tag)


def test_confirmed_publishes_and_unacked_deliveries_survive_sigkill(sluice_server, tmp_path):
    server = sluice_server(tmp_path / "data", "--flush", "sync")
    server.wait_ready()
    producer = connect(server)
    channel = producer.channel()
    channel.confirm_delivery()
    channel.exchange_declare("work", "direct", durable=True)
    channel.queue_declare("jobs", durable=True)
    channel.queue_bind("jobs", "work", "job")
    persistent = pika.BasicProperties(delivery_mode=2, content_type="text/plain")
    confirmed = set()
    for n in range(MESSAGES):
        body = f"job {n}".encode()
        channel.basic_publish("work", "job", body, persistent, mandatory=True)  # confirmed here
        confirmed.add(body)

    consumer = connect(server).channel()
    in_flight = []
    for _ in range(UNACKED):
        method, _, body = consumer.basic_get("jobs")
        assert method is not None and not method.redelivered
        in_flight.append(body)
    pushed = connect(server).channel()
    pushed.basic_qos(prefetch_count=PREFETCH)
    for method, _, body in pushed.consume("jobs", inactivity_timeout=10):
        assert method is not None and not method.redelivered
        in_flight.append(body)
        if len(in_flight) == UNACKED + PREFETCH:
            break

    server.kill()  # SIGKILL: no shutdown, nothing flushed on the way out

    again = sluice_server(tmp_path / "data", "--flush", "sync")
    again.wait_ready()
    channel = connect(again).channel()
    channel.queue_declare("jobs", passive=True)
    channel.exchange_declare("work", passive=True)
    survived = drain(channel)
    bodies = [body for body, _ in survived]
    assert set(bodies) == confirmed, f"{len(confirmed - set(bodies))} confirmed messages lost"
    assert len(bodies) == len(set(bodies)), "a message came back twice"
    assert set(in_flight) <= set(bodies), "an unacknowledged delivery was lost"
    redelivered = {body for body, again in survived if again}
    assert redelivered == set(in_flight), "only the unacknowledged deliveries are redelivered"
    channel.basic_publish("work", "job", b"after the restart")
    assert drain(channel) == [(b"after the restart", False)], "the binding did not survive"
