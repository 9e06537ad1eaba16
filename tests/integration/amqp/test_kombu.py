"""kombu (py-amqp transport) against a real `sluice serve`: entity declares, confirmed publishes
through a Producer, a Consumer acking, requeueing and rejecting, SimpleQueue get, and the
errors kombu raises for RabbitMQ's refusals."""
from __future__ import annotations

import socket
import uuid

import amqp.exceptions
import pytest
from kombu import Connection, Consumer, Exchange, Producer, Queue

WAIT_S = 10


def name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def connection(server, **options) -> Connection:
    """A kombu connection with publisher confirms, as Celery users turn them on."""
    return Connection(f"amqp://guest:guest@{server.amqp}//", heartbeat=10,
                      transport_options={"confirm_publish": True}, **options)


def drain_until(conn: Connection, received: list, count: int) -> None:
    """Drain events until ``received`` holds ``count`` messages; fail after WAIT_S of silence."""
    while len(received) < count:
        try:
            conn.drain_events(timeout=WAIT_S)
        except socket.timeout:
            pytest.fail(f"only {len(received)} of {count} messages arrived")


def test_declares_bind_and_a_confirmed_round_trip_with_properties(amqp_server):
    with connection(amqp_server) as conn:
        exchange = Exchange(name("kombu-topic"), "topic", durable=True)
        queue = Queue(name("kombu-q"), exchange, "order.*", durable=True,
                      queue_arguments={"x-queue-type": "classic"})
        producer = Producer(conn.channel(), exchange=exchange)
        queue.declare(channel=producer.channel)
        assert queue.queue_declare(passive=True, channel=producer.channel).message_count == 0
        producer.publish({"id": 1}, routing_key="order.created", serializer="json",
                         headers={"tenant": "acme"}, correlation_id="c-1", reply_to="replies",
                         priority=3, delivery_mode=2, expiration=60)
        producer.publish("lost", routing_key="invoice.sent")  # bound to nothing: dropped
        received = []
        with Consumer(conn, [queue], callbacks=[lambda body, message: received.append((body, message))]):
            drain_until(conn, received, 1)
        [(body, message)] = received
        assert body == {"id": 1} and message.content_type == "application/json"
        assert message.headers == {"tenant": "acme"} and not message.delivery_info["redelivered"]
        assert message.properties["correlation_id"] == "c-1"
        assert message.properties["reply_to"] == "replies"
        assert message.properties["priority"] == 3 and message.properties["expiration"] == "60000"
        assert message.delivery_info["routing_key"] == "order.created"
        assert message.delivery_info["exchange"] == exchange.name
        message.ack()
        assert queue.queue_declare(passive=True, channel=producer.channel).message_count == 0
        queue.bind(producer.channel).delete()
        exchange.bind(producer.channel).delete()


def test_requeue_redelivers_reject_drops_and_unacked_come_back_after_close(amqp_server):
    queue_name = name("kombu-work")
    with connection(amqp_server) as conn:
        queue = Queue(queue_name, Exchange(""), queue_name)
        producer = Producer(conn.channel())
        queue.declare(channel=producer.channel)
        for n in range(3):
            producer.publish({"n": n}, routing_key=queue_name)
        received = []
        with Consumer(conn, [queue], prefetch_count=3,
                      callbacks=[lambda body, message: received.append(message)]):
            drain_until(conn, received, 3)
            received[0].requeue()
            received[1].reject()
            drain_until(conn, received, 4)
            assert received[3].payload == {"n": 0} and received[3].delivery_info["redelivered"]
            received[3].ack()
        # message 2 is still unacknowledged: closing the connection puts it back
    with connection(amqp_server) as conn:
        simple = conn.SimpleQueue(queue_name)
        message = simple.get(timeout=WAIT_S)
        assert message.payload == {"n": 2} and message.delivery_info["redelivered"]
        message.ack()
        with pytest.raises(simple.Empty):
            simple.get(block=False)
        assert simple.qsize() == 0
        simple.close()


def test_simple_queue_put_get_and_qsize(amqp_server):
    with connection(amqp_server) as conn:
        queue_name = name("kombu-simple")
        simple = conn.SimpleQueue(queue_name)
        for n in range(5):
            simple.put({"n": n})
        assert simple.qsize() == 5
        got = [simple.get(timeout=WAIT_S) for _ in range(5)]
        assert [m.payload["n"] for m in got] == list(range(5))
        for message in got:
            message.ack()
        assert simple.qsize() == 0
        simple.close()
        assert Queue(queue_name).bind(conn.channel()).delete() == 0


def test_refusals_are_kombu_channel_errors_and_the_connection_goes_on(amqp_server):
    with connection(amqp_server) as conn:
        channel = conn.channel()
        with pytest.raises(amqp.exceptions.NotFound) as missing:
            Queue(name("nowhere"), no_declare=True).queue_declare(passive=True, channel=channel)
        assert missing.value.code == 404 and "NOT_FOUND" in missing.value.message
        channel = conn.channel()
        exchange_name = name("kombu-ex")
        Exchange(exchange_name, "fanout").declare(channel=channel)
        with pytest.raises(amqp.exceptions.PreconditionFailed) as clash:
            Exchange(exchange_name, "direct").declare(channel=channel)
        assert clash.value.code == 406
        channel = conn.channel()
        with pytest.raises(amqp.exceptions.NotFound):
            Producer(channel).publish("x", exchange=name("no-such-exchange"), routing_key="k")
        simple = conn.SimpleQueue(name("kombu-after"))  # the connection itself is fine
        simple.put("still here")
        message = simple.get(timeout=WAIT_S)
        assert message.payload == "still here"
        message.ack()
        simple.close()
