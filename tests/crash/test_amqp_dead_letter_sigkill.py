"""SIGKILL `sluice serve` (sync flush) with dead-lettering under way: messages already expired
or rejected into a durable dead-letter queue are still there after the restart, messages whose
TTL runs out while the broker is down or restarting are dead-lettered once it is back, each
with its x-death reason, and the source queues keep their arguments.

Dead-lettering is at least once across a crash (a copy is stored before its source entry is
settled, and settles are saved with the offsets every commit interval, as acks are), so a
message may reach the dead-letter queue twice and a rejected one may come back to its queue
redelivered; none may be lost. The kill happens on events (the dead letters received, the
publishes confirmed), never after a sleep.
"""
from __future__ import annotations

import pika
import pytest

from tests.integration.amqp.conftest import connect

pytestmark = pytest.mark.crash

EXPIRED_BEFORE = 20
REJECTED = 5
EXPIRE_AFTER = 10


def declare(channel) -> None:
    """The durable topology (declared again after the restart: it must match)."""
    channel.exchange_declare("dlx", "fanout", durable=True)
    channel.queue_declare("dead", durable=True)
    channel.queue_bind("dead", "dlx")
    for queue, ttl in (("short", 50), ("long", 1500), ("checked", None)):
        arguments = {"x-dead-letter-exchange": "dlx"}
        if ttl is not None:
            arguments["x-message-ttl"] = ttl
        channel.queue_declare(queue, durable=True, arguments=arguments)


def receive(channel, count: int) -> dict[bytes, str]:
    """``count`` distinct dead letters consumed from ``dead``, unacknowledged: body -> the
    queue and reason of its latest death."""
    got: dict[bytes, str] = {}
    for method, properties, body in channel.consume("dead", inactivity_timeout=15):
        assert method is not None, f"only {len(got)} of {count} dead letters arrived"
        death = properties.headers["x-death"][0]
        got[body] = f"{death['queue']}:{death['reason']}"
        if len(got) == count:
            return got
    raise AssertionError("unreachable")


def test_dead_letters_and_ttls_survive_sigkill(sluice_server, tmp_path):
    server = sluice_server(tmp_path / "data", "--flush", "sync")
    server.wait_ready()
    channel = connect(server).channel()
    channel.confirm_delivery()
    declare(channel)
    persistent = pika.BasicProperties(delivery_mode=2)
    expected: dict[bytes, str] = {}
    for n in range(EXPIRED_BEFORE):
        channel.basic_publish("", "short", b"short %d" % n, persistent)
        expected[b"short %d" % n] = "short:expired"
    for n in range(REJECTED):
        channel.basic_publish("", "checked", b"bad %d" % n, persistent)
        method, _, _ = channel.basic_get("checked")
        channel.basic_reject(method.delivery_tag, requeue=False)
        expected[b"bad %d" % n] = "checked:rejected"
    watcher = connect(server).channel()
    watcher.basic_qos(prefetch_count=100)
    assert receive(watcher, len(expected)) == expected
    for n in range(EXPIRE_AFTER):  # confirmed, not yet expired when the broker dies
        channel.basic_publish("", "long", b"long %d" % n, persistent)
        expected[b"long %d" % n] = "long:expired"

    server.kill()  # SIGKILL: no shutdown, nothing flushed on the way out

    again = sluice_server(tmp_path / "data", "--flush", "sync")
    again.wait_ready()
    channel = connect(again).channel()
    declare(channel)  # same arguments: accepted
    channel.basic_qos(prefetch_count=100)
    assert receive(channel, len(expected)) == expected, "a dead letter was lost"
    for queue in ("short", "long"):
        assert channel.basic_get(queue) == (None, None, None), f"{queue} kept a message"
    while (got := channel.basic_get("checked", auto_ack=True))[0] is not None:
        method, _, body = got
        assert method.redelivered and expected[body] == "checked:rejected"
