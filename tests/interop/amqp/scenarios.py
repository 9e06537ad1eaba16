"""AMQP 0-9-1 client scripts run unchanged against RabbitMQ and against Sluice.

Each scenario is a plain function ``(broker) -> observation``: it connects pika, aiormq,
kombu or a Celery worker and client to ``broker.host``/``broker.port`` as guest, does one thing, and
returns what the clients saw as plain comparable data: answers, reply codes and texts, message
properties, redelivered flags, counts. Entity names are fresh per run (``Names``) and are
written back as their stable labels in observations (``Names.rel``), so two runs on two brokers
give equal observations.

Waiting is driven by the protocol: a synchronous method's answer, a publisher confirm, a
delivery awaited with a timeout. Where a scenario shows that something did NOT happen (a
prefetch window full), it asks the broker for counts instead of waiting for silence.
"""
from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import aio_pika
import aio_pika.exceptions
import aiormq
from aio_pika.patterns import RPC, Master
import amqp.exceptions
import pika
import pika.exceptions as pika_errors
from celery import Celery
from kombu import Connection as KombuConnection, Exchange as KombuExchange, Queue as KombuQueue
from pamqp.commands import Basic

from tests.integration.amqp.celery_worker import APP, Worker

WAIT_S = 10.0


class Names:
    """Fresh entity names for one run: ``names("q")`` is ``it-<uuid>-q``; ``rel`` turns them back
    into their labels inside any text."""

    def __init__(self) -> None:
        self.prefix = f"it-{uuid.uuid4().hex[:10]}"
        self._labels: dict[str, str] = {}

    def __call__(self, label: str) -> str:
        name = f"{self.prefix}-{label}"
        self._labels[name] = f"<{label}>"
        return name

    def rel(self, value: Any) -> Any:
        """``value`` (text, bytes, or nested lists/tuples/dicts of them) with names as labels."""
        if isinstance(value, str):
            for name in sorted(self._labels, key=len, reverse=True):
                value = value.replace(name, self._labels[name])
            return value
        if isinstance(value, (list, tuple)):
            return type(value)(self.rel(item) for item in value)
        if isinstance(value, dict):
            return {self.rel(key): self.rel(item) for key, item in value.items()}
        return value


def parameters(broker: Any, **more: Any) -> pika.ConnectionParameters:
    return pika.ConnectionParameters(broker.host, broker.port, "/",
                                     pika.PlainCredentials(broker.user, broker.password),
                                     connection_attempts=1, socket_timeout=WAIT_S, **more)


def connect(broker: Any, **more: Any) -> pika.BlockingConnection:
    return pika.BlockingConnection(parameters(broker, **more))


def attempt(connection: pika.BlockingConnection, action: Callable[[Any], Any]) -> Any:
    """Run ``action(channel)`` on a new channel: "ok" (or what it returned), "nacked" for a
    publish the broker nacked, or the channel or connection close it caused as ("channel" |
    "connection", reply code, reply text)."""
    channel = connection.channel()
    try:
        result = action(channel)
    except pika_errors.ChannelClosedByBroker as closed:
        return ("channel", closed.reply_code, closed.reply_text)
    except pika_errors.ConnectionClosedByBroker as closed:
        return ("connection", closed.reply_code, closed.reply_text)
    except pika_errors.NackError:
        return "nacked"
    if channel.is_open:
        channel.close()
    return "ok" if result is None else result


def drain(channel: Any, queue: str) -> list[tuple[bytes, bool]]:
    """basic.get (auto-ack) until get-empty: (body, redelivered) of each message."""
    got = []
    while True:
        method, _, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            return got
        got.append((body, method.redelivered))


# ---------------------------------------------------------------------------------------------
# Declares and their refusals (pika)


def declare_answers(broker: Any) -> dict[str, Any]:
    """Exchange and queue declares, redeclares, passive declares and deletes, and RabbitMQ's
    refusals: what each answered."""
    n = Names()
    seen: dict[str, Any] = {}
    connection = connect(broker)
    for kind in ("direct", "fanout", "topic", "headers"):
        seen[f"declare {kind}"] = attempt(connection, lambda ch, kind=kind: ch.exchange_declare(
            n(kind), kind, durable=kind == "topic") and None)
    seen["redeclare same"] = attempt(connection, lambda ch: ch.exchange_declare(
        n("topic"), "topic", durable=True) and None)
    seen["redeclare other type"] = attempt(connection, lambda ch: ch.exchange_declare(
        n("topic"), "direct", durable=True))
    seen["redeclare other durable"] = attempt(connection, lambda ch: ch.exchange_declare(
        n("direct"), "direct", durable=True))
    seen["passive missing exchange"] = attempt(connection, lambda ch: ch.exchange_declare(
        n("nowhere"), "direct", passive=True))
    seen["passive existing exchange"] = attempt(connection, lambda ch: ch.exchange_declare(
        n("fanout"), passive=True) and None)
    seen["passive amq.topic"] = attempt(connection, lambda ch: ch.exchange_declare(
        "amq.topic", passive=True) and None)
    seen["reserved exchange name"] = attempt(connection, lambda ch: ch.exchange_declare(
        "amq." + n("mine"), "direct"))
    seen["redeclare amq.direct as fanout"] = attempt(connection, lambda ch: ch.exchange_declare(
        "amq.direct", "fanout", durable=True))

    def queue_ok(channel: Any, name: str, **options: Any) -> tuple[str, int, int]:
        ok = channel.queue_declare(name, **options).method
        return (ok.queue, ok.message_count, ok.consumer_count)
    seen["declare queue"] = attempt(connection, lambda ch: queue_ok(ch, n("q"), durable=True))
    seen["redeclare queue same"] = attempt(connection, lambda ch: queue_ok(ch, n("q"),
                                                                           durable=True))
    seen["redeclare queue other durable"] = attempt(connection, lambda ch: queue_ok(
        ch, n("q"), durable=False))
    seen["redeclare queue other arguments"] = attempt(connection, lambda ch: queue_ok(
        ch, n("q"), durable=True, arguments={"x-max-length": 5}))
    seen["passive missing queue"] = attempt(connection, lambda ch: queue_ok(ch, n("none"),
                                                                            passive=True))
    seen["reserved queue name"] = attempt(connection, lambda ch: queue_ok(ch, "amq." + n("q2")))

    def server_named(channel: Any) -> tuple[str, int, int]:
        name, ready, consumers = queue_ok(channel, "", exclusive=True)
        return (name[:8], len(name) > 8, ready, consumers)
    seen["server-named queue"] = attempt(connection, server_named)

    def bind_and_count(channel: Any) -> tuple[int, int]:
        channel.confirm_delivery()  # RabbitMQ counts a queue's messages once they are in it
        channel.queue_bind(n("q"), n("direct"), "k")
        channel.basic_publish(n("direct"), "k", b"one")
        channel.basic_publish(n("direct"), "k", b"two")
        channel.basic_publish("", n("q"), b"three")
        ok = channel.queue_declare(n("q"), passive=True).method
        return (ok.message_count, ok.consumer_count)
    seen["bind and count"] = attempt(connection, bind_and_count)
    seen["bind to missing exchange"] = attempt(connection, lambda ch: ch.queue_bind(
        n("q"), n("nowhere"), "k"))
    seen["bind missing queue"] = attempt(connection, lambda ch: ch.queue_bind(
        n("none"), n("direct"), "k"))
    seen["unbind never bound"] = attempt(connection, lambda ch: ch.queue_unbind(
        n("q"), n("fanout"), "never") and None)
    seen["unbind from missing exchange"] = attempt(connection, lambda ch: ch.queue_unbind(
        n("q"), n("nowhere"), "k") and None)
    seen["unbind missing queue"] = attempt(connection, lambda ch: ch.queue_unbind(
        n("none"), n("direct"), "k") and None)
    seen["exchange unbind missing"] = attempt(connection, lambda ch: ch.exchange_unbind(
        n("none"), n("direct"), "k") and None)
    seen["delete queue if empty"] = attempt(connection, lambda ch: ch.queue_delete(
        n("q"), if_empty=True))
    seen["delete exchange if unused"] = attempt(connection, lambda ch: ch.exchange_delete(
        n("direct"), if_unused=True))
    seen["delete queue"] = attempt(connection, lambda ch: ch.queue_delete(
        n("q")).method.message_count)
    seen["delete missing queue"] = attempt(connection, lambda ch: ch.queue_delete(
        n("none")).method.message_count)
    seen["delete missing exchange"] = attempt(connection, lambda ch: ch.exchange_delete(
        n("nowhere")) and None)
    for kind in ("direct", "fanout", "topic", "headers"):
        seen[f"delete {kind}"] = attempt(connection, lambda ch, kind=kind: ch.exchange_delete(
            n(kind)) and None)
    connection.close()
    return n.rel(seen)


def unknown_exchange_type(broker: Any) -> Any:
    """Declaring an exchange of a type the broker does not know."""
    n = Names()
    connection = connect(broker)
    seen = attempt(connection, lambda ch: ch.exchange_declare(n("x"), "x-no-such-type"))
    if connection.is_open:
        connection.close()
    return n.rel(seen)


# ---------------------------------------------------------------------------------------------
# Messages (pika blocking)

PROPERTIES = dict(
    content_type="application/json", content_encoding="utf-8",
    headers={"tenant": "acme", "n": 3, "big": 2**40, "ok": True, "price": Decimal("9.99"),
             "list": [1, "two", b"three"], "nested": {"a": {"b": 1}}, "raw": b"\xff\x00"},
    delivery_mode=2, priority=5, correlation_id="corr-1", reply_to="replies",
    expiration="60000", message_id="id-1", timestamp=1_700_000_000, type="order.created",
    user_id="guest", app_id="shop")


def properties_round_trip(broker: Any) -> dict[str, Any]:
    """Every basic property and a header table of each type, published and got back."""
    n = Names()
    connection = connect(broker)
    channel = connection.channel()
    channel.queue_declare(n("q"))
    channel.basic_publish("", n("q"), b'{"id": 1}', pika.BasicProperties(**PROPERTIES))
    channel.basic_publish("", n("q"), b"", pika.BasicProperties())
    first, props, body = channel.basic_get(n("q"))
    second, bare, empty = channel.basic_get(n("q"), auto_ack=True)
    seen = {
        "body": body, "properties": vars(props),
        "get-ok": (first.delivery_tag, first.redelivered, first.exchange, first.routing_key,
                   first.message_count),
        "bare": (empty, vars(bare), second.delivery_tag, second.message_count),
        "get-empty": channel.basic_get(n("q")),
    }
    channel.basic_ack(first.delivery_tag)
    channel.queue_delete(n("q"))
    connection.close()
    return n.rel(seen)


def confirms_and_returns(broker: Any) -> dict[str, Any]:
    """Publisher confirms with routed, unroutable and mandatory-unroutable publishes, and a
    publish to a missing exchange."""
    n = Names()
    connection = connect(broker)
    channel = connection.channel()
    channel.confirm_delivery()
    channel.queue_declare(n("q"), auto_delete=False)
    seen: dict[str, Any] = {}
    channel.basic_publish("", n("q"), b"routed")
    seen["routed"] = "confirmed"
    channel.basic_publish("amq.direct", n("nobody"), b"dropped")
    seen["unroutable"] = "confirmed"
    try:
        channel.basic_publish("amq.direct", n("nobody"), b"returned", mandatory=True,
                              properties=pika.BasicProperties(message_id="m-r"))
        seen["mandatory unroutable"] = "confirmed"
    except pika_errors.UnroutableError as unroutable:
        seen["mandatory unroutable"] = [
            (r.method.reply_code, r.method.reply_text, r.method.exchange, r.method.routing_key,
             r.properties.message_id, r.body) for r in unroutable.messages]
    channel.basic_publish("", n("q"), b"mandatory and routed", mandatory=True)
    seen["mandatory routed"] = "confirmed"
    seen["queue holds"] = drain(channel, n("q"))
    seen["missing exchange"] = attempt(connection, lambda ch: (
        ch.confirm_delivery(), ch.basic_publish(n("nowhere"), "k", b"x")))
    connection.channel().queue_delete(n("q"))
    connection.close()
    return n.rel(seen)


def requeue_on_close_and_recover(broker: Any) -> dict[str, Any]:
    """Unacked deliveries return, redelivered and in their order, when their channel closes,
    on basic.recover, and on basic.reject/nack with requeue."""
    n = Names()
    connection = connect(broker)
    channel = connection.channel()
    channel.queue_declare(n("q"))
    for body in (b"a", b"b", b"c", b"d"):
        channel.basic_publish("", n("q"), body)
    seen: dict[str, Any] = {}
    held = connection.channel()
    seen["held"] = [held.basic_get(n("q"))[2] for _ in range(2)]
    seen["ready while held"] = channel.queue_declare(n("q"), passive=True).method.message_count
    held.close()
    seen["after close"] = drain_unacked(channel, n("q"))
    channel.basic_recover(requeue=True)
    seen["after recover"] = drain_unacked(channel, n("q"))
    channel.basic_nack(0, multiple=True, requeue=True)
    method, _, body = channel.basic_get(n("q"))
    channel.basic_reject(method.delivery_tag, requeue=True)
    seen["rejected with requeue"] = body
    seen["after reject"] = drain_unacked(channel, n("q"))
    channel.basic_nack(0, multiple=True, requeue=False)
    seen["after nack without requeue"] = drain(channel, n("q"))
    seen["unknown delivery tag"] = attempt(connection, lambda ch: (
        ch.basic_ack(99), ch.queue_declare(n("q"), passive=True)) and None)
    channel.queue_delete(n("q"))
    connection.close()
    return n.rel(seen)


def drain_unacked(channel: Any, queue: str) -> list[tuple[bytes, bool]]:
    """basic.get without ack until get-empty: (body, redelivered) of each."""
    got = []
    while True:
        method, _, body = channel.basic_get(queue)
        if method is None:
            return got
        got.append((body, method.redelivered))


def routing(broker: Any) -> dict[str, Any]:
    """Which queues direct, fanout, topic, headers exchanges, an exchange-to-exchange binding
    and an alternate exchange route each message to."""
    n = Names()
    connection = connect(broker)
    channel = connection.channel()
    channel.exchange_declare(n("direct"), "direct", auto_delete=False)
    channel.exchange_declare(n("fanout"), "fanout")
    channel.exchange_declare(n("topic"), "topic")
    channel.exchange_declare(n("headers"), "headers")
    channel.exchange_declare(n("ae"), "fanout")
    channel.exchange_declare(n("with-ae"), "direct", arguments={"alternate-exchange": n("ae")})
    bindings = {
        "d-k": (n("direct"), "k", None), "d-k2": (n("direct"), "k2", None),
        "f": (n("fanout"), "ignored", None),
        "t-a.*": (n("topic"), "a.*", None), "t-a.#": (n("topic"), "a.#", None),
        "t-#": (n("topic"), "#", None), "t-*.b": (n("topic"), "*.b", None),
        "t-a.*.c": (n("topic"), "a.*.c", None), "t-#.c": (n("topic"), "#.c", None),
        "h-all": (n("headers"), "", {"x-match": "all", "kind": "order", "region": "eu"}),
        "h-any": (n("headers"), "", {"x-match": "any", "kind": "order", "region": "eu"}),
        "h-default": (n("headers"), "", {"kind": "invoice"}),
        "ae": (n("ae"), "", None), "with-ae-k": (n("with-ae"), "k", None),
    }
    for label, (exchange, key, arguments) in bindings.items():
        channel.queue_declare(n(label))
        channel.queue_bind(n(label), exchange, key, arguments)
    channel.exchange_bind(n("topic"), n("fanout"))  # the fanout also feeds the topic
    channel.confirm_delivery()
    for exchange, key, headers in [
            ("direct", "k", None), ("direct", "k2", None), ("direct", "nope", None),
            ("fanout", "x.y", None),
            ("topic", "a", None), ("topic", "a.b", None), ("topic", "a.b.c", None),
            ("topic", "x.b", None), ("topic", "c", None), ("topic", "a..c", None),
            ("headers", "", {"kind": "order", "region": "eu"}),
            ("headers", "", {"kind": "order", "region": "us"}),
            ("headers", "", {"kind": "invoice", "region": "eu"}),
            ("with-ae", "k", None), ("with-ae", "other", None)]:
        channel.basic_publish(n(exchange), key, f"{exchange}:{key}:{headers}".encode(),
                              pika.BasicProperties(headers=headers))
    seen = {label: sorted(body.decode() for body, _ in drain(channel, n(label)))
            for label in bindings}
    for label in bindings:
        channel.queue_delete(n(label))
    for exchange in ("fanout", "direct", "topic", "headers", "with-ae", "ae"):
        channel.exchange_delete(n(exchange))
    connection.close()
    return n.rel(seen)


def refusals(broker: Any) -> dict[str, Any]:
    """What RabbitMQ refuses, with which reply code and text, and whether the channel or the
    connection closes."""
    n = Names()
    seen: dict[str, Any] = {}
    owner = connect(broker)
    owner.channel().queue_declare(n("exclusive"), exclusive=True)
    owner.channel().queue_declare(n("shared"))
    consumer = owner.channel()
    consumer.basic_consume(n("shared"), lambda *args: None, exclusive=True)
    other = connect(broker)
    seen["exclusive queue of another connection"] = attempt(other, lambda ch: ch.queue_declare(
        n("exclusive"), passive=True))
    seen["consume from another's exclusive queue"] = attempt(other, lambda ch: ch.basic_consume(
        n("exclusive"), lambda *args: None))
    seen["consume where an exclusive consumer is"] = attempt(other, lambda ch: ch.basic_consume(
        n("shared"), lambda *args: None))
    seen["spoofed user_id"] = attempt(other, lambda ch: (ch.confirm_delivery(), ch.basic_publish(
        "", n("shared"), b"x", pika.BasicProperties(user_id="someone-else"))))
    seen["get from missing queue"] = attempt(other, lambda ch: ch.basic_get(n("none")))
    seen["consume from missing queue"] = attempt(other, lambda ch: ch.basic_consume(
        n("none"), lambda *args: None))
    def reuse_tag(channel: Any) -> None:  # pika itself refuses a tag it knows: sent raw
        channel.queue_declare(n("tagged"))
        for _ in range(2):
            channel._impl._send_method(pika.spec.Basic.Consume(queue=n("tagged"), consumer_tag="same"))
        channel.queue_declare(n("tagged"), passive=True)
    seen["consumer tag reused"] = attempt(other, reuse_tag)
    other = connect(broker) if not other.is_open else other
    seen["immediate"] = attempt(other, lambda ch: ch._impl._send_method(pika.spec.Basic.Publish(
        routing_key=n("shared"), immediate=True), (pika.BasicProperties(), b"x"))
        or ch.queue_declare(n("shared"), passive=True))
    for label, options in [("wrong password", {"credentials": pika.PlainCredentials(
            "guest", "wrong")}), ("unknown vhost", {"virtual_host": n("vhost")})]:
        try:
            pika.BlockingConnection(pika.ConnectionParameters(
                broker.host, broker.port, **{"connection_attempts": 1,
                                             "credentials": pika.PlainCredentials(
                                                 broker.user, broker.password), **options}))
            seen[label] = "connected"
        except pika_errors.AMQPConnectionError as refused:
            seen[label] = (type(refused).__name__, str(refused))
    owner.channel().queue_delete(n("shared"))
    if other.is_open:
        other.close()
    owner.close()
    return n.rel(seen)


def auto_delete_and_exclusive(broker: Any) -> dict[str, Any]:
    """An auto-delete queue goes with its last consumer (not before it had one); an exclusive
    queue goes with its connection."""
    n = Names()
    seen: dict[str, Any] = {}
    connection = connect(broker)
    channel = connection.channel()
    channel.queue_declare(n("auto"), auto_delete=True)
    seen["auto-delete before any consumer"] = attempt(connection, lambda ch: ch.queue_declare(
        n("auto"), passive=True).method.consumer_count)
    first = channel.basic_consume(n("auto"), lambda *args: None)
    second = channel.basic_consume(n("auto"), lambda *args: None)
    seen["consumers"] = channel.queue_declare(n("auto"), passive=True).method.consumer_count
    channel.basic_cancel(first)
    seen["after one cancel"] = attempt(connection, lambda ch: ch.queue_declare(
        n("auto"), passive=True).method.consumer_count)
    channel.basic_cancel(second)
    seen["after the last cancel"] = attempt(connection, lambda ch: ch.queue_declare(
        n("auto"), passive=True).method.consumer_count)
    consuming = connection.channel()
    consuming.queue_declare(n("doomed"))
    cancelled: list[str] = []
    consuming.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
    consuming.basic_consume(n("doomed"), lambda *args: None, consumer_tag="watcher")
    deleter = connect(broker)
    deleter.channel().queue_delete(n("doomed"))
    deleter.close()
    deadline = time.monotonic() + WAIT_S
    while not cancelled and time.monotonic() < deadline:
        connection.process_data_events(time_limit=0.05)
    seen["basic.cancel when the queue is deleted"] = cancelled
    owner = connect(broker)
    owner.channel().queue_declare(n("exclusive"), exclusive=True)
    seen["exclusive while open"] = attempt(owner, lambda ch: ch.queue_declare(
        n("exclusive"), passive=True).method.queue)
    owner.close()
    seen["exclusive after close"] = attempt(connection, lambda ch: ch.queue_declare(
        n("exclusive"), passive=True))
    connection.close()
    return n.rel(seen)


# ---------------------------------------------------------------------------------------------
# aiormq: consumers, prefetch, acks


def consume_with_prefetch(broker: Any) -> dict[str, Any]:
    """aiormq: a consumer with prefetch 2 gets two messages until it acks; nack with requeue
    redelivers first, reject drops; confirms come back for every publish."""
    return asyncio.run(_consume_with_prefetch(broker))


async def _consume_with_prefetch(broker: Any) -> dict[str, Any]:
    n = Names()
    seen: dict[str, Any] = {}
    connection = await aiormq.connect(broker.url)
    channel = await connection.channel()
    await channel.queue_declare(n("q"))
    confirms = [await channel.basic_publish(f"m{i}".encode(), routing_key=n("q"))
                for i in range(6)]
    seen["confirms"] = [(type(c).__name__, c.delivery_tag) for c in confirms]
    await channel.basic_qos(prefetch_count=2)
    deliveries: asyncio.Queue = asyncio.Queue()
    ok = await channel.basic_consume(n("q"), deliveries.put, consumer_tag="c1")
    seen["consume-ok"] = ok.consumer_tag

    async def next_delivery() -> Any:
        return await asyncio.wait_for(deliveries.get(), WAIT_S)
    window = [await next_delivery(), await next_delivery()]
    declared = await channel.queue_declare(n("q"), passive=True)
    seen["while the window is full"] = (declared.message_count, declared.consumer_count,
                                        deliveries.qsize())
    seen["first two"] = [(m.body, m.delivery.redelivered, m.delivery.consumer_tag,
                          m.delivery.delivery_tag, m.delivery.routing_key) for m in window]
    await channel.basic_nack(window[0].delivery.delivery_tag, requeue=True)
    await channel.basic_reject(window[1].delivery.delivery_tag, requeue=False)
    order = []
    while len(order) < 5:
        message = await next_delivery()
        order.append((message.body, message.delivery.redelivered))
        await channel.basic_ack(message.delivery.delivery_tag)
    seen["after nack and reject"] = order
    await channel.basic_cancel("c1")
    declared = await channel.queue_declare(n("q"), passive=True)
    seen["at the end"] = (declared.message_count, declared.consumer_count)
    await channel.queue_delete(n("q"))
    await connection.close()
    return n.rel(seen)


# ---------------------------------------------------------------------------------------------
# kombu


def kombu_simple_queue(broker: Any) -> dict[str, Any]:
    """kombu: SimpleQueue put/get/qsize with acks and requeue, a Producer with confirms into a
    topic exchange, and the exceptions kombu raises for a 404 and a 406."""
    n = Names()
    seen: dict[str, Any] = {}
    with KombuConnection(broker.url, transport_options={"confirm_publish": True}) as conn:
        simple = conn.SimpleQueue(n("simple"))
        for i in range(3):
            simple.put({"i": i}, headers={"i": i})
        seen["qsize"] = simple.qsize()
        first = simple.get(timeout=WAIT_S)
        first.requeue()
        got = [simple.get(timeout=WAIT_S) for _ in range(3)]
        seen["get after requeue"] = [(m.payload, m.headers, m.delivery_info["redelivered"])
                                     for m in got]
        for message in got:
            message.ack()
        seen["qsize at the end"] = simple.qsize()
        simple.close()
        channel = conn.channel()
        exchange = KombuExchange(n("events"), "topic", durable=False)
        queue = KombuQueue(n("bound"), exchange, "order.#", durable=False)
        queue.bind(channel).declare()
        producer = conn.Producer(channel, exchange=exchange)
        for key in ("order.created", "order.eu.paid", "invoice.sent"):
            producer.publish({"key": key}, routing_key=key)
        bound = queue.bind(channel)
        received = []
        while (message := bound.get(no_ack=True)) is not None:
            received.append((message.payload["key"], message.delivery_info["routing_key"],
                             message.content_type))
        seen["topic via producer"] = received
        for label, action in [
                ("passive missing", lambda ch: KombuQueue(n("none")).bind(ch).queue_declare(
                    passive=True)),
                ("exchange type clash", lambda ch: KombuExchange(n("events"), "direct",
                                                                 durable=False).bind(ch).declare())]:
            try:
                action(conn.channel())
                seen[label] = "ok"
            except amqp.exceptions.AMQPError as error:
                seen[label] = (type(error).__name__, error.code, error.message)
        bound.delete()
        KombuExchange(n("events")).bind(conn.channel()).delete()
        KombuQueue(n("simple")).bind(conn.channel()).delete()
    return n.rel(seen)


# ---------------------------------------------------------------------------------------------
# request/reply as RPC clients do it (reply_to, correlation_id, an exclusive reply queue)


def request_reply(broker: Any) -> dict[str, Any]:
    """A server consumes requests and answers on reply_to with the request's correlation_id; the
    client's exclusive auto-delete reply queue is server-named and gone after it disconnects."""
    n = Names()
    server = connect(broker)
    serving = server.channel()
    serving.queue_declare(n("rpc"))

    def answer(channel: Any, method: Any, props: Any, body: bytes) -> None:
        channel.basic_publish("", props.reply_to, body.upper(), pika.BasicProperties(
            correlation_id=props.correlation_id, content_type="text/plain"))
        channel.basic_ack(method.delivery_tag)
    serving.basic_consume(n("rpc"), answer)
    client = connect(broker)
    calling = client.channel()
    reply_queue = calling.queue_declare("", exclusive=True, auto_delete=True).method.queue
    replies: list[tuple[bytes, str, str]] = []
    calling.basic_consume(reply_queue, lambda ch, m, p, body: replies.append(
        (body, p.correlation_id, p.content_type)), auto_ack=True)
    for i in range(3):
        calling.basic_publish("", n("rpc"), f"call {i}".encode(), pika.BasicProperties(
            reply_to=reply_queue, correlation_id=f"c{i}"))
    deadline = time.monotonic() + WAIT_S
    while len(replies) < 3 and time.monotonic() < deadline:
        server.process_data_events(time_limit=0.05)
        client.process_data_events(time_limit=0.05)
    client.close()
    gone = attempt(server, lambda ch: ch.queue_declare(reply_queue, passive=True))
    seen = {"replies": replies, "reply queue": reply_queue[:8],
            "reply queue after disconnect": gone[:2] if isinstance(gone, tuple) else gone}
    server.channel().queue_delete(n("rpc"))
    server.close()
    return n.rel(seen)




# ---------------------------------------------------------------------------------------------
# the handshake, transactions and purge (pika blocking)


def handshake(broker: Any) -> dict[str, Any]:
    """What tune negotiates with pika's defaults and with a heartbeat asked for, and the
    capabilities the server announces."""
    connection = connect(broker)
    impl = connection._impl
    seen: dict[str, Any] = {
        "capabilities": impl.server_properties.get("capabilities"),
        "tuned": (impl.params.channel_max, impl.params.frame_max, impl.params.heartbeat),
    }
    connection.close()
    connection = connect(broker, heartbeat=5, channel_max=16, frame_max=8192)
    impl = connection._impl
    seen["asked"] = (impl.params.channel_max, impl.params.frame_max, impl.params.heartbeat)
    connection.close()
    return seen


def transactions_and_purge(broker: Any) -> dict[str, Any]:
    """tx.select / commit / rollback of publishes and acks, and queue.purge counts."""
    n = Names()
    seen: dict[str, Any] = {}
    connection = connect(broker)
    channel = connection.channel()
    channel.queue_declare(n("q"))
    channel.tx_select()
    channel.basic_publish("", n("q"), b"rolled back")
    channel.tx_rollback()
    channel.basic_publish("", n("q"), b"one")
    channel.basic_publish("", n("q"), b"two")
    seen["before commit"] = channel.queue_declare(n("q"), passive=True).method.message_count
    channel.tx_commit()
    seen["after commit"] = channel.queue_declare(n("q"), passive=True).method.message_count
    method, _, body = channel.basic_get(n("q"))
    channel.basic_ack(method.delivery_tag)
    channel.tx_rollback()  # the ack is dropped: the message stays unacked
    seen["got"] = body
    seen["confirm on a transactional channel"] = attempt(connection, lambda ch: (
        ch.tx_select(), ch.confirm_delivery()))
    seen["purged"] = channel.queue_purge(n("q")).method.message_count
    channel.close()  # the unacked one comes back
    channel = connection.channel()
    seen["after close"] = drain(channel, n("q"))
    channel.queue_delete(n("q"))
    connection.close()
    return n.rel(seen)


def direct_reply_to(broker: Any) -> dict[str, Any]:
    """RabbitMQ's direct reply-to: a client consumes ``amq.rabbitmq.reply-to`` (no-ack) and
    names it as reply_to; the server answers on the rewritten address, with nothing stored."""
    n = Names()
    seen: dict[str, Any] = {}
    server = connect(broker)
    serving = server.channel()
    serving.queue_declare(n("rpc"))
    addresses = []

    def answer(channel: Any, method: Any, props: Any, body: bytes) -> None:
        addresses.append(props.reply_to)
        channel.basic_publish("", props.reply_to, body[::-1], pika.BasicProperties(
            correlation_id=props.correlation_id))
        channel.basic_ack(method.delivery_tag)
    serving.basic_consume(n("rpc"), answer)
    client = connect(broker)
    calling = client.channel()
    replies: list[tuple[bytes, str, str, str, bool]] = []
    calling.basic_consume("amq.rabbitmq.reply-to", lambda ch, m, p, body: replies.append(
        (body, p.correlation_id, m.exchange, m.routing_key == addresses[0], m.redelivered)),
        auto_ack=True)
    for i in range(3):
        calling.basic_publish("", n("rpc"), f"call {i}".encode(), pika.BasicProperties(
            reply_to="amq.rabbitmq.reply-to", correlation_id=f"c{i}"))
    deadline = time.monotonic() + WAIT_S
    while len(replies) < 3 and time.monotonic() < deadline:
        server.process_data_events(time_limit=0.05)
        client.process_data_events(time_limit=0.05)
    seen["replies"] = replies
    seen["address"] = (addresses[0].startswith("amq.rabbitmq.reply-to."),
                       len(set(addresses)), len(addresses))
    seen["without a reply consumer"] = attempt(client, lambda ch: ch.basic_publish(
        "", n("rpc"), b"x", pika.BasicProperties(reply_to="amq.rabbitmq.reply-to")) or
        ch.queue_declare(n("rpc"), passive=True))
    seen["reply consumer with acks"] = attempt(client, lambda ch: ch.basic_consume(
        "amq.rabbitmq.reply-to", lambda *args: None))
    client.close()
    seen["reply to a gone client"] = attempt(server, lambda ch: (ch.confirm_delivery(),
                                                                 ch.basic_publish("", addresses[0],
                                                                                  b"late")))
    server.channel().queue_delete(n("rpc"))
    server.close()
    return n.rel(seen)


def celery(broker: Any) -> dict[str, Any]:
    """A real Celery worker (``--pool solo``, prefetch 1, late acks) and an ``rpc://`` client:
    results, a failure, retries, a task sent while countdown tasks wait, broadcast ping."""
    url = f"amqp://{broker.user}:{broker.password}@{broker.host}:{broker.port}//"
    worker = Worker(url)
    client = Celery("interop-client", broker=url, backend="rpc://")
    client.conf.update(task_serializer="json", result_serializer="json",
                       accept_content=["json"])
    seen: dict[str, Any] = {}
    try:
        worker.wait_for("ready.")
        results = [client.send_task(f"{APP}.add", (n, n)) for n in range(10)]
        seen["results"] = [result.get(timeout=WAIT_S) for result in results]
        failed = client.send_task(f"{APP}.fail", ("no such order",))
        failed.get(timeout=WAIT_S, propagate=False)
        seen["failure"] = (failed.state, type(failed.result).__name__, str(failed.result))
        seen["retried"] = client.send_task(f"{APP}.flaky", (3,)).get(timeout=WAIT_S)
        later = [client.send_task(f"{APP}.add", (n, 0), countdown=4) for n in range(3)]
        now = client.send_task(f"{APP}.add", (1, 1))
        seen["immediate while countdowns wait"] = now.get(timeout=WAIT_S)
        seen["countdowns still waiting then"] = [result.ready() for result in later]
        seen["countdowns"] = [result.get(timeout=WAIT_S) for result in later]
        replies = client.control.inspect(timeout=WAIT_S, limit=1).ping() or {}
        seen["ping"] = sorted(replies.values(), key=str)
    finally:
        client.close()
        seen["worker exit"] = worker.stop()
    return seen


def aio_pika_patterns(broker: Any) -> dict[str, Any]:
    """aio-pika's RPC and Master/Worker patterns: an exclusive reply queue, mandatory calls
    returned when nobody serves them, auto-delete job queues."""
    return asyncio.run(_aio_pika_patterns(broker))


async def _aio_pika_patterns(broker: Any) -> dict[str, Any]:
    n = Names()
    seen: dict[str, Any] = {}
    connection = await aio_pika.connect(broker.url)
    rpc = await RPC.create(await connection.channel())

    async def multiply(*, x: int, y: int) -> int:
        return x * y
    await rpc.register(n("multiply"), multiply, auto_delete=True)
    seen["rpc"] = await asyncio.wait_for(rpc.call(n("multiply"), kwargs={"x": 6, "y": 7}),
                                         WAIT_S)
    try:
        await asyncio.wait_for(rpc.call(n("nobody"), kwargs={}), WAIT_S)
        seen["unserved call"] = "answered"
    except aio_pika.exceptions.MessageProcessError as error:
        seen["unserved call"] = (type(error).__name__, error.args[0])
    done: list[int] = []
    all_done = asyncio.Event()

    async def work(*, job: int) -> None:
        done.append(job)
        if len(done) == 3:
            all_done.set()
    master = Master(await connection.channel())
    await master.create_worker(n("jobs"), work, auto_delete=True)
    for job in range(3):
        await master.create_task(n("jobs"), kwargs={"job": job})
    await asyncio.wait_for(all_done.wait(), WAIT_S)
    seen["jobs"] = done
    await rpc.close()
    await connection.close()
    return n.rel(seen)


def prefetch_scopes(broker: Any) -> dict[str, Any]:
    """aiormq: basic.qos global=true shares one window among a channel's consumers; a
    basic.qos global=false sent while a consumer runs (what kombu does for Celery)."""
    return asyncio.run(_prefetch_scopes(broker))


async def _prefetch_scopes(broker: Any) -> dict[str, Any]:
    n = Names()
    seen: dict[str, Any] = {}
    connection = await aiormq.connect(broker.url)
    channel = await connection.channel()
    for label in ("q1", "q2", "q3"):
        await channel.queue_declare(n(label))
        for i in range(5):
            await channel.basic_publish(f"{label}-{i}".encode(), routing_key=n(label))
    shared = await connection.channel()
    await shared.basic_qos(prefetch_count=3, global_=True)
    got: asyncio.Queue = asyncio.Queue()
    for label in ("q1", "q2"):
        await shared.basic_consume(n(label), got.put)
    for _ in range(3):
        await asyncio.wait_for(got.get(), WAIT_S)
    ready = [(await channel.queue_declare(n(label), passive=True)).message_count
             for label in ("q1", "q2")]
    seen["global window of 3 over two queues: ready left"] = sum(ready)
    single = await connection.channel()
    await single.basic_qos(prefetch_count=1)
    later: asyncio.Queue = asyncio.Queue()
    await single.basic_consume(n("q3"), later.put)
    await asyncio.wait_for(later.get(), WAIT_S)
    await single.basic_qos(prefetch_count=3)
    seen["qos raised while consuming: ready left"] = (
        await channel.queue_declare(n("q3"), passive=True)).message_count
    await shared.close()
    await single.close()
    for label in ("q1", "q2", "q3"):
        await channel.queue_delete(n(label))
    await connection.close()
    return n.rel(seen)


def sender_selected(broker: Any) -> dict[str, Any]:
    """A publish with ``CC`` and ``BCC`` headers: which queues get it, with which routing key
    and headers (a key listed twice routes once; ``BCC`` never reaches a consumer)."""
    n = Names()
    connection = connect(broker)
    channel = connection.channel()
    channel.exchange_declare(n("direct"), "direct")
    for label in ("to", "cc", "bcc", "other"):
        channel.queue_declare(n(label))
        channel.queue_bind(n(label), n("direct"), label)
    channel.confirm_delivery()
    channel.basic_publish(n("direct"), "to", b"memo", pika.BasicProperties(
        headers={"CC": ["cc", "to"], "BCC": ["bcc"], "x": 1}))
    channel.basic_publish(n("direct"), "to", b"odd items", pika.BasicProperties(
        headers={"CC": [1, "cc"]}))

    def cc_not_an_array(confirming: Any) -> None:
        confirming.confirm_delivery()
        confirming.basic_publish(n("direct"), "to", b"not a list",
                                 pika.BasicProperties(headers={"CC": "cc"}))
    seen: dict[str, Any] = {"CC not an array": attempt(connection, cc_not_an_array)}
    for label in ("to", "cc", "bcc", "other"):
        got = []
        while True:
            method, properties, body = channel.basic_get(n(label), auto_ack=True)
            if method is None:
                break
            got.append((body.decode(), method.routing_key, properties.headers))
        seen[label] = got
        channel.queue_delete(n(label))
    channel.exchange_delete(n("direct"))
    connection.close()
    return n.rel(seen)


# ---------------------------------------------------------------------------------------------
# publishes just before a close (pika blocking, and RabbitMQ's tutorial send.py as written)

TUTORIAL = Path(__file__).parent / "tutorial"
AS_WRITTEN = ("import runpy, sys, pika.connection; "
              "pika.connection.Parameters.DEFAULT_PORT = int(sys.argv[2]); "
              "runpy.run_path(sys.argv[1], run_name='__main__')")
"""Runs a tutorial script unchanged, with pika's default port (5672) pointed at the broker."""


def consumed(channel: Any, queue: str, count: int) -> tuple[list[bytes], int]:
    """Consume ``count`` messages of ``queue`` (each awaited up to ``WAIT_S``) and ack them;
    (their bodies in order, messages left in the queue after them)."""
    bodies: list[bytes] = []
    for method, _, body in channel.consume(queue, inactivity_timeout=WAIT_S) if count else ():
        if method is None:
            break
        channel.basic_ack(method.delivery_tag)
        bodies.append(body)
        if len(bodies) == count:
            break
    if count:
        channel.cancel()
    return bodies, channel.queue_declare(queue, passive=True).method.message_count


def tutorial_send(broker: Any) -> dict[str, Any]:
    """RabbitMQ's tutorial send.py run five times, each a process of its own (publish one
    message without confirms, then connection.close()); then a consumer gets every message."""
    setup = connect(broker)
    channel = setup.channel()
    channel.queue_declare("hello")
    channel.queue_purge("hello")
    printed = []
    for _ in range(5):
        run = subprocess.run([sys.executable, "-c", AS_WRITTEN, str(TUTORIAL / "send.py"),
                              str(broker.port)], capture_output=True, text=True, timeout=60)
        printed.append((run.returncode, run.stdout, run.stderr))
    bodies, left = consumed(channel, "hello", 5)
    channel.queue_delete("hello")
    setup.close()
    return {"send.py": printed, "consumed": bodies, "left": left}


CLOSE_VARIANTS = {"channel.close": 15, "connection.close": 15, "closed channel": 5,
                  "other channel": 5, "committed": 5, "uncommitted": 0}
"""Queue of each variant of ``publishes_then_close`` -> the messages RabbitMQ keeps in it."""


def publishes_then_close(broker: Any) -> dict[str, Any]:
    """Publishes without confirms right before a close: five then channel.close(), five then
    connection.close() (three connections each); five on a channel, its close, five on another
    channel, connection.close(); a transaction committed, then five publishes left uncommitted
    at the channel's close. What a consumer gets afterwards, in order."""
    n = Names()
    setup = connect(broker)
    reader = setup.channel()
    for label in CLOSE_VARIANTS:
        reader.queue_declare(n(label))

    def five(channel: Any, label: str, run: int = 0) -> None:
        for i in range(5):
            channel.basic_publish("", n(label), f"{label} {run}.{i}".encode())
    for run in range(3):
        connection = connect(broker)
        channel = connection.channel()
        five(channel, "channel.close", run)
        channel.close()
        connection.close()
        connection = connect(broker)
        five(connection.channel(), "connection.close", run)
        connection.close()
    connection = connect(broker)
    channel = connection.channel()
    five(channel, "closed channel")
    channel.close()
    five(connection.channel(), "other channel")
    connection.close()
    connection = connect(broker)
    channel = connection.channel()
    channel.tx_select()
    five(channel, "committed")
    channel.tx_commit()
    five(channel, "uncommitted")
    channel.close()
    connection.close()
    seen = {label: consumed(reader, n(label), count) for label, count in CLOSE_VARIANTS.items()}
    for label in CLOSE_VARIANTS:
        reader.queue_delete(n(label))
    setup.close()
    return n.rel(seen)


# ---------------------------------------------------------------------------------------------
# what RabbitMQ's client suites check: exclusive consumers, reserved exchanges, limits (pika)

def nothing(*delivery: Any) -> None:
    """A consumer callback for consumers that only have to exist."""


def conformance(broker: Any) -> dict[str, Any]:
    """Exclusive consumers (a single-active-consumer queue takes none), the default exchange
    (nothing but a publish may name it) and the ``amq.*`` ones (never deleted), channel_max
    counting open channels, and RabbitMQ 4's largest message (16 MiB, configured on the
    RabbitMQ node since Debian's 3.10 allows 128 MiB)."""
    n = Names()
    seen: dict[str, Any] = {}
    connection = connect(broker)
    setup = connection.channel()
    setup.queue_declare(n("q"))
    setup.queue_declare(n("single"), arguments={"x-single-active-consumer": True})
    for label, first, second in [("exclusive consume where a consumer is", False, True),
                                 ("exclusive consume where an exclusive one is", True, True),
                                 ("consume where an exclusive one is", True, False)]:
        seen[label] = attempt(connection, lambda ch, first=first, second=second: (
            ch.basic_consume(n("q"), nothing, exclusive=first),
            ch.basic_consume(n("q"), nothing, exclusive=second)) and None)
    seen["exclusive consume of a single-active-consumer queue"] = attempt(
        connection, lambda ch: ch.basic_consume(n("single"), nothing, exclusive=True))
    seen["consume of a single-active-consumer queue"] = attempt(
        connection, lambda ch: ch.basic_consume(n("single"), nothing) and None)
    for label, action in [
            ("passive declare of the default exchange",
             lambda ch: ch.exchange_declare("", passive=True)),
            ("declare of the default exchange",
             lambda ch: ch.exchange_declare("", "direct", durable=True)),
            ("delete of the default exchange", lambda ch: ch.exchange_delete("")),
            ("delete of amq.direct", lambda ch: ch.exchange_delete("amq.direct")),
            ("delete of a missing amq. exchange",
             lambda ch: ch.exchange_delete("amq." + n("x"))),
            ("queue bound to the default exchange", lambda ch: ch.queue_bind(n("q"), "", "k")),
            ("queue unbound from the default exchange",
             lambda ch: ch.queue_unbind(n("q"), "", "k")),
            ("default exchange bound to amq.direct",
             lambda ch: ch.exchange_bind("", "amq.direct", "k"))]:
        seen[label] = attempt(connection, lambda ch, action=action: action(ch) and None)
    for label, size in [("16 MiB message", 16 << 20), ("22 MB message", 22_000_000)]:
        seen[label] = attempt(connection, lambda ch, size=size: (
            ch.confirm_delivery(), ch.basic_publish("", n("q"), b"x" * size)) and "confirmed")
    connection.channel().queue_delete(n("q"))
    connection.channel().queue_delete(n("single"))
    connection.close()
    seen.update(channel_limit(broker))
    return n.rel(seen)


def channel_limit(broker: Any) -> dict[str, Any]:
    """channel_max 8: a channel numbered 30 opens while fewer are open; a ninth open channel
    closes the connection."""
    seen: dict[str, Any] = {}
    connection = connect(broker, channel_max=8)
    seen["channel_max"] = connection._impl.params.channel_max
    seen["channel numbered above channel_max"] = connection.channel(channel_number=30).is_open
    try:
        for number in range(1, 9):
            connection.channel(channel_number=number)
        seen["one channel more than channel_max"] = "opened"
    except pika_errors.ConnectionClosedByBroker as closed:
        seen["one channel more than channel_max"] = (closed.reply_code, closed.reply_text)
    if connection.is_open:
        connection.close()
    return seen


SCENARIOS = [declare_answers, unknown_exchange_type, properties_round_trip, confirms_and_returns,
             requeue_on_close_and_recover, routing, refusals, auto_delete_and_exclusive,
             consume_with_prefetch, kombu_simple_queue, request_reply, handshake,
             transactions_and_purge, direct_reply_to, celery, aio_pika_patterns,
             prefetch_scopes, sender_selected, tutorial_send, publishes_then_close, conformance]
