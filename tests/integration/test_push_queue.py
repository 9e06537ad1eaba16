"""Push subscriptions reading an AMQP queue: a real broker POSTs what pika publishes to a queue
the test declared and bound, to real aiohttp receivers, settling each message in the queue
once the receiver took it; the push subscription competes with the queue's AMQP consumers
(each message goes to one of them), retries and dead-letters as it does for topics, and
creating one needs the owner's read permission on the queue."""
from __future__ import annotations

import threading

import pika
import pytest
from aiohttp import web

from tests.integration.test_admin_api import BrokerThread, Http
from tests.integration.test_push_delivery import (  # noqa: F401 - receivers is a fixture
    WAIT_S, consume, event_of, fresh, receivers, stats, verify)
from tests.waiting import wait_for

EXCHANGE = "amq.direct"


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    thread = BrokerThread(str(tmp_path_factory.mktemp("push-queue") / "data"),
                          **{"push.allowed_sinks": "127.0.0.0/8"})
    yield thread
    thread.stop()


@pytest.fixture(scope="module")
def http(broker):
    return Http(broker.running.admin_url)


def connect(broker: BrokerThread, user: str = "sluice", password: str = "sluice"):
    return pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", broker.running.amqp_listener.port, "/",
        pika.PlainCredentials(user, password), connection_attempts=1, socket_timeout=10))


def declare(broker: BrokerThread) -> str:
    """A durable queue bound to amq.direct with its own name as the routing key."""
    queue = fresh("orders")
    connection = connect(broker)
    try:
        channel = connection.channel()
        channel.queue_declare(queue, durable=True)
        channel.queue_bind(queue, EXCHANGE, routing_key=queue)
    finally:
        connection.close()
    return queue


def publish(broker: BrokerThread, queue: str, bodies: list[bytes], headers=None) -> None:
    connection = connect(broker)
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        for body in bodies:
            channel.basic_publish(EXCHANGE, queue, body, pika.BasicProperties(
                headers=headers, delivery_mode=2,
                content_type="application/json" if headers else None))
    finally:
        connection.close()


def depth(broker: BrokerThread, queue: str) -> int:
    """Messages ready in ``queue``, as a pika passive declare sees them."""
    connection = connect(broker)
    try:
        return connection.channel().queue_declare(queue, passive=True).method.message_count
    finally:
        connection.close()


def unacked(http: Http, queue: str) -> int:
    status, body, _ = http("GET", f"/queues/%2F/{queue}")
    assert status == 200, body
    return body["messages_unacknowledged"]


def subscribe_queue(http: Http, queue: str, sink: str, **fields) -> tuple[int, dict]:
    status, body, _ = http("POST", "/push-subscriptions", {
        "name": fresh("pq"), "vhost": "/", "queue": queue, "sink": sink, **fields})
    return status, body


def drained(broker: BrokerThread, http: Http, queue: str) -> bool:
    return depth(broker, queue) == 0 and unacked(http, queue) == 0


def test_an_amqp_message_is_pushed_and_leaves_the_queue(broker, http, receivers):
    receiver = receivers()
    queue = declare(broker)
    publish(broker, queue, [b'{"order": 1}'], {
        "ce-specversion": "1.0", "ce-id": "order-1", "ce-source": "/shop",
        "ce-type": "com.example.order"})
    assert depth(broker, queue) == 1
    status, created = subscribe_queue(http, queue, receiver.url)
    assert status == 201, created
    assert (created["vhost"], created["queue"], created["topic"]) == ("/", queue, "")
    seen = receiver.wait(1)[0]
    verify(created["secret"], seen)
    event = event_of(seen)
    assert (event.get_id(), event.get_source(), event.get_type()) == (
        "order-1", "/shop", "com.example.order")
    assert event.get_data() == {"order": 1}
    wait_for(lambda: drained(broker, http, queue), "the queue empty", WAIT_S,
             lambda: (depth(broker, queue), unacked(http, queue)))
    wait_for(lambda: stats(http, created["name"])["delivered"] == 1, "the delivery counted", WAIT_S)
    assert stats(http, created["name"])["lag"] == 0
    publish(broker, queue, [b"plain"])  # a message that is no event: a synthesized one
    seen = receiver.wait(2)[1]
    event = event_of(seen)
    assert event.get_type() == "sluice.message" and seen.body == b"plain"
    assert event.get_source().startswith("/sluice/topics/")  # the topic it was stored in
    wait_for(lambda: drained(broker, http, queue), "the queue empty again", WAIT_S)


def test_the_push_subscription_competes_with_an_amqp_consumer(broker, http, receivers):
    receiver = receivers()
    queue = declare(broker)
    bodies = [b"m-%d" % n for n in range(40)]
    status, created = subscribe_queue(http, queue, receiver.url, concurrency=2)
    assert status == 201, created
    taken: list[bytes] = []
    connection = connect(broker)
    channel = connection.channel()
    channel.basic_qos(prefetch_count=1)

    def on_message(ch, method, _properties, body):
        taken.append(body)
        ch.basic_ack(method.delivery_tag)
    channel.basic_consume(queue, on_message)
    publisher = threading.Thread(target=publish, args=(broker, queue, bodies))
    publisher.start()
    try:
        wait_for(lambda: connection.process_data_events(0.05)
                 or len(taken) + len(receiver.seen) >= len(bodies),
                 "every message taken by one consumer or the other", WAIT_S,
                 lambda: (len(taken), len(receiver.seen)))
    finally:
        publisher.join(WAIT_S)
        connection.close()
    pushed = [seen.body for seen in receiver.seen]
    assert sorted(taken + pushed) == sorted(bodies)  # each message once, to one of them
    wait_for(lambda: drained(broker, http, queue), "the queue empty", WAIT_S)


def test_a_failing_receiver_gets_the_message_again_then_it_leaves_the_queue(broker, http, receivers):
    receiver = receivers(lambda _, n: web.Response(status=503 if n == 0 else 200))
    queue = declare(broker)
    status, created = subscribe_queue(http, queue, receiver.url, backoff_min_ms=100,
                                      backoff_max_ms=200)
    assert status == 201, created
    publish(broker, queue, [b"again"])
    first, second = receiver.wait(2)
    assert first.headers["webhook-id"] == second.headers["webhook-id"]
    wait_for(lambda: stats(http, created["name"])["delivered"] == 1, "the delivery", WAIT_S)
    assert stats(http, created["name"])["failed"] == 1
    wait_for(lambda: drained(broker, http, queue), "the queue empty", WAIT_S)


def test_a_refused_message_is_dead_lettered_and_leaves_the_queue(broker, http, receivers):
    receiver = receivers(lambda _, __: web.Response(status=400))
    queue = declare(broker)
    status, created = subscribe_queue(http, queue, receiver.url)
    assert status == 201, created
    publish(broker, queue, [b"refused"])
    dead = consume(broker, created["dead_letter_topic"])[0]
    assert dead.body == b"refused" and "answered 400" in dead.properties["sluice.push.last_error"]
    wait_for(lambda: drained(broker, http, queue), "the queue empty", WAIT_S)
    assert len(receiver.seen) == 1


def test_the_queue_s_own_policies_hold_for_push_a_delivery_limit_dead_letters_to_its_dlx(
        broker, http, receivers):
    receiver = receivers(lambda _, __: web.Response(status=503))
    queue, dead_letters = fresh("limited"), fresh("limited-dlq")
    connection = connect(broker)
    try:
        channel = connection.channel()
        channel.queue_declare(dead_letters, durable=True)
        channel.queue_declare(queue, durable=True, arguments={
            "x-queue-type": "quorum", "x-delivery-limit": 1, "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": dead_letters})
        channel.queue_bind(queue, EXCHANGE, routing_key=queue)
    finally:
        connection.close()
    status, created = subscribe_queue(http, queue, receiver.url, max_attempts=10,
                                      backoff_min_ms=100, backoff_max_ms=200)
    assert status == 201, created
    publish(broker, queue, [b"limited"])
    wait_for(lambda: depth(broker, dead_letters) == 1, "the message in the queue's DLX target",
             WAIT_S)
    connection = connect(broker)
    try:
        method, properties, body = connection.channel().basic_get(dead_letters, auto_ack=True)
    finally:
        connection.close()
    assert body == b"limited"
    assert properties.headers["x-death"][0]["reason"] == "delivery_limit"
    assert len(receiver.seen) == 2  # the first attempt and the one redelivery the limit allows
    wait_for(lambda: drained(broker, http, queue), "the queue empty", WAIT_S)


def test_creating_one_needs_the_read_permission_on_the_queue(broker, http, receivers):
    receiver = receivers()
    queue = declare(broker)
    user = fresh("reader")
    assert http("POST", "/users", {"name": user, "password": "pw"})[0] == 201
    as_user = Http(http.url, user, "pw")
    status, body = subscribe_queue(as_user, queue, receiver.url)
    assert status == 403 and "may not read queue" in body["message"], body
    permission = {"configure": "", "write": "", "read": "^nothing-of-theirs$"}
    assert http("PUT", f"/vhosts/%2F/permissions/{user}", permission)[0] == 200
    status, body = subscribe_queue(as_user, queue, receiver.url)
    assert status == 403, body
    permission["read"] = f"^{queue}$"
    assert http("PUT", f"/vhosts/%2F/permissions/{user}", permission)[0] == 200
    status, created = subscribe_queue(as_user, queue, receiver.url)
    assert status == 201 and created["owner"] == user, created
    publish(broker, queue, [b"for the reader"])
    assert receiver.wait(1)[0].body == b"for the reader"
    status, body = subscribe_queue(as_user, fresh("missing"), receiver.url)
    assert status == 403, body  # no right on it: whether it exists is not told
    status, body = subscribe_queue(http, fresh("missing"), receiver.url)
    assert status == 404 and "no queue" in body["message"], body


def test_a_revoked_read_permission_stops_delivery_until_given_back(broker, http, receivers):
    receiver = receivers()
    queue = declare(broker)
    user = fresh("revoked")
    assert http("POST", "/users", {"name": user, "password": "pw"})[0] == 201
    permission = {"configure": "", "write": "", "read": f"^{queue}$"}
    assert http("PUT", f"/vhosts/%2F/permissions/{user}", permission)[0] == 200
    status, created = subscribe_queue(Http(http.url, user, "pw"), queue, receiver.url)
    assert status == 201, created
    assert http("DELETE", f"/vhosts/%2F/permissions/{user}")[0] == 204
    wait_for(lambda: stats(http, created["name"])["state"] == "refused", "the refusal", WAIT_S)
    assert "may no longer read" in stats(http, created["name"])["last_error"]
    publish(broker, queue, [b"while revoked"])
    assert depth(broker, queue) == 1 and receiver.seen == []
    assert http("PUT", f"/vhosts/%2F/permissions/{user}", permission)[0] == 200
    assert receiver.wait(1)[0].body == b"while revoked"
    wait_for(lambda: drained(broker, http, queue), "the queue empty", WAIT_S)
