"""Interop: the same AMQP 0-9-1 client scripts (``scenarios.py``) against RabbitMQ and Sluice.

Each ``test_<scenario>`` runs once per broker (``amqp_broker``) and asserts the observation
equals what RabbitMQ answers, written out here: reply codes and texts, message properties,
redelivered flags, counts, routing. ``test_same_observation`` then checks that both brokers
gave equal observations for every scenario, outside the differences listed in ``KNOWN`` (each
with its reason; docs/amqp.md, "Differences from RabbitMQ", lists them too). It reuses this
run's observations when the per-broker tests made them, else runs the scenario on both brokers.
"""
from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest

from tests.interop.amqp import scenarios as s

OBSERVED: dict[tuple[str, str], Any] = {}
"""(scenario, broker kind) -> observation, filled by the per-broker tests."""

KNOWN: dict[tuple[str, str], tuple[Callable[[str], Any], str]] = {
    ("unknown_exchange_type", ""): (
        lambda kind: ("connection", 503, "COMMAND_INVALID - unknown exchange type "
                      "'x-no-such-type'") if kind == "rabbitmq" else (
            "channel", 406, "PRECONDITION_FAILED - unknown exchange type 'x-no-such-type'; "
            "Sluice has direct, fanout, topic, headers and x-delayed-message"),
        "RabbitMQ before 3.13 (Debian ships 3.10) closes the connection with 503; 3.13 and 4 "
        "close the channel with 406, as Sluice does"),
    ("prefetch_scopes", "qos raised while consuming: ready left"): (
        lambda kind: 4 if kind == "rabbitmq" else 2,
        "RabbitMQ applies basic.qos global=false to later consumers only; Sluice to the "
        "running ones too, as kombu (Celery) expects of a server that is not RabbitMQ 3.x"),
}
"""(scenario, observation key or "" for the whole) -> (expected by broker kind, reason)."""


def observe(scenario: Callable[[Any], Any], broker: Any) -> Any:
    observed = scenario(broker)
    OBSERVED[(scenario.__name__, broker.kind)] = observed
    return observed


def known(scenario: str, key: str, kind: str) -> Any:
    return KNOWN[(scenario, key)][0](kind)


def closed(code: int, text: str, scope: str = "channel") -> tuple[str, int, str]:
    names = {403: "ACCESS_REFUSED", 404: "NOT_FOUND", 405: "RESOURCE_LOCKED",
             406: "PRECONDITION_FAILED", 530: "NOT_ALLOWED", 540: "NOT_IMPLEMENTED"}
    return (scope, code, f"{names[code]} - {text}")


def inequivalent(arg: str, kind: str, name: str, received: str, current: str) -> tuple:
    return closed(406, f"inequivalent arg '{arg}' for {kind} '{name}' in vhost '/': received "
                       f"'{received}' but current is '{current}'")


def no_queue(label: str) -> tuple[str, int, str]:
    return closed(404, f"no queue '<{label}>' in vhost '/'")


def no_exchange(label: str) -> tuple[str, int, str]:
    return closed(404, f"no exchange '<{label}>' in vhost '/'")


LOCKED = ("cannot obtain exclusive access to locked queue '<exclusive>' in vhost '/'. It could "
          "be originally declared on another connection or the exclusive property value does "
          "not match that of the original declaration.")


def test_declare_answers(amqp_broker):
    """Declare-ok answers and counts; a redeclaration names the first inequivalent setting;
    `amq.` names are reserved; if-empty / if-unused deletes are refused; deleting what is not
    there is fine."""
    assert observe(s.declare_answers, amqp_broker) == {
        "declare direct": "ok", "declare fanout": "ok", "declare topic": "ok",
        "declare headers": "ok", "redeclare same": "ok",
        "redeclare other type": inequivalent("type", "exchange", "<topic>", "direct", "topic"),
        "redeclare other durable": inequivalent("durable", "exchange", "<direct>", "true",
                                                "false"),
        "passive missing exchange": no_exchange("nowhere"),
        "passive existing exchange": "ok", "passive amq.topic": "ok",
        "reserved exchange name": closed(403, "exchange name 'amq.<mine>' contains reserved "
                                              "prefix 'amq.*'"),
        "redeclare amq.direct as fanout": inequivalent("type", "exchange", "amq.direct",
                                                       "fanout", "direct"),
        "declare queue": ("<q>", 0, 0), "redeclare queue same": ("<q>", 0, 0),
        "redeclare queue other durable": inequivalent("durable", "queue", "<q>", "false",
                                                      "true"),
        "redeclare queue other arguments": closed(
            406, "inequivalent arg 'x-max-length' for queue '<q>' in vhost '/': received the "
                 "value '5' of type 'signedint' but current is none"),
        "passive missing queue": no_queue("none"),
        "reserved queue name": closed(403, "queue name 'amq.<q2>' contains reserved prefix "
                                           "'amq.*'"),
        "server-named queue": ("amq.gen-", True, 0, 0),
        "bind and count": (3, 0),
        "bind to missing exchange": no_exchange("nowhere"),
        "bind missing queue": no_queue("none"),
        "unbind never bound": "ok", "unbind from missing exchange": "ok",
        "unbind missing queue": "ok", "exchange unbind missing": "ok",
        "delete queue if empty": closed(406, "queue '<q>' in vhost '/' not empty"),
        "delete exchange if unused": closed(406, "exchange '<direct>' in vhost '/' in use"),
        "delete queue": 3, "delete missing queue": 0, "delete missing exchange": "ok",
        "delete direct": "ok", "delete fanout": "ok", "delete topic": "ok",
        "delete headers": "ok",
    }


def test_unknown_exchange_type(amqp_broker):
    assert observe(s.unknown_exchange_type, amqp_broker) == known(
        "unknown_exchange_type", "", amqp_broker.kind)


def test_properties_round_trip(amqp_broker):
    """Every basic property and every field-table value type come back as they were sent."""
    empty = dict.fromkeys(["content_type", "content_encoding", "headers", "delivery_mode",
                           "priority", "correlation_id", "reply_to", "expiration", "message_id",
                           "timestamp", "type", "user_id", "app_id", "cluster_id"])
    assert observe(s.properties_round_trip, amqp_broker) == {
        "body": b'{"id": 1}',
        "properties": {**s.PROPERTIES, "cluster_id": None, "headers": {
            "tenant": "acme", "n": 3, "big": 2**40, "ok": True, "price": Decimal("9.99"),
            "list": [1, "two", b"three"], "nested": {"a": {"b": 1}}, "raw": b"\xff\x00"}},
        "get-ok": (1, False, "", "<q>", 1),
        "bare": (b"", empty, 2, 0),
        "get-empty": (None, None, None),
    }


def test_confirms_and_returns(amqp_broker):
    """Every publish is confirmed; an unroutable mandatory one is returned first (312)."""
    assert observe(s.confirms_and_returns, amqp_broker) == {
        "routed": "confirmed", "unroutable": "confirmed",
        "mandatory unroutable": [(312, "NO_ROUTE", "amq.direct", "<nobody>", "m-r",
                                  b"returned")],
        "mandatory routed": "confirmed",
        "queue holds": [(b"routed", False), (b"mandatory and routed", False)],
        "missing exchange": no_exchange("nowhere"),
    }


def test_requeue_on_close_and_recover(amqp_broker):
    """Requeued messages come back redelivered and in queue order, whatever order they were
    requeued in."""
    assert observe(s.requeue_on_close_and_recover, amqp_broker) == {
        "held": [b"a", b"b"], "ready while held": 2,
        "after close": [(b"a", True), (b"b", True), (b"c", False), (b"d", False)],
        "after recover": [(b"a", True), (b"b", True), (b"c", True), (b"d", True)],
        "rejected with requeue": b"a",
        "after reject": [(b"a", True), (b"b", True), (b"c", True), (b"d", True)],
        "after nack without requeue": [],
        "unknown delivery tag": closed(406, "unknown delivery tag 99"),
    }


def test_routing(amqp_broker):
    """Direct, fanout, topic (``*`` one word, ``#`` zero or more, empty words), headers
    (x-match all/any, all by default), exchange-to-exchange, alternate exchange."""
    assert observe(s.routing, amqp_broker) == {
        "d-k": ["direct:k:None"], "d-k2": ["direct:k2:None"], "f": ["fanout:x.y:None"],
        "t-a.*": ["topic:a.b:None"],
        "t-a.#": ["topic:a..c:None", "topic:a.b.c:None", "topic:a.b:None", "topic:a:None"],
        "t-#": ["fanout:x.y:None", "topic:a..c:None", "topic:a.b.c:None", "topic:a.b:None",
                "topic:a:None", "topic:c:None", "topic:x.b:None"],
        "t-*.b": ["topic:a.b:None", "topic:x.b:None"],
        "t-a.*.c": ["topic:a..c:None", "topic:a.b.c:None"],
        "t-#.c": ["topic:a..c:None", "topic:a.b.c:None", "topic:c:None"],
        "h-all": ["headers::{'kind': 'order', 'region': 'eu'}"],
        "h-any": ["headers::{'kind': 'invoice', 'region': 'eu'}",
                  "headers::{'kind': 'order', 'region': 'eu'}",
                  "headers::{'kind': 'order', 'region': 'us'}"],
        "h-default": ["headers::{'kind': 'invoice', 'region': 'eu'}"],
        "ae": ["with-ae:other:None"], "with-ae-k": ["with-ae:k:None"],
    }


def test_refusals(amqp_broker):
    """Soft errors close the channel (403, 404, 405, 406); a reused consumer tag (530) and
    immediate (540) close the connection; a wrong password and an unknown vhost are refused."""
    assert observe(s.refusals, amqp_broker) == {
        "exclusive queue of another connection": closed(405, LOCKED),
        "consume from another's exclusive queue": closed(405, LOCKED),
        "consume where an exclusive consumer is": closed(403, "queue '<shared>' in vhost '/' "
                                                              "in exclusive use"),
        "spoofed user_id": closed(406, "user_id property set to 'someone-else' but "
                                       "authenticated user was 'guest'"),
        "get from missing queue": no_queue("none"),
        "consume from missing queue": no_queue("none"),
        "consumer tag reused": closed(530, "attempt to reuse consumer tag 'same'", "connection"),
        "immediate": closed(540, "immediate=true", "connection"),
        "wrong password": ("ProbableAuthenticationError", "ConnectionClosedByBroker: (403) "
                           "'ACCESS_REFUSED - Login was refused using authentication mechanism "
                           "PLAIN. For details see the broker logfile.'"),
        "unknown vhost": ("ProbableAccessDeniedError", "ConnectionClosedByBroker: (530) "
                          "'NOT_ALLOWED - vhost <vhost> not found'"),
    }


def test_auto_delete_and_exclusive(amqp_broker):
    assert observe(s.auto_delete_and_exclusive, amqp_broker) == {
        "auto-delete before any consumer": 0, "consumers": 2, "after one cancel": 1,
        "after the last cancel": no_queue("auto"),
        "basic.cancel when the queue is deleted": ["watcher"],
        "exclusive while open": "<exclusive>", "exclusive after close": no_queue("exclusive"),
    }


def test_consume_with_prefetch(amqp_broker):
    """aiormq: confirms 1..6; prefetch 2 holds the rest back (4 ready); a nack with requeue
    comes back first and redelivered; a reject drops."""
    assert observe(s.consume_with_prefetch, amqp_broker) == {
        "confirms": [("Ack", tag) for tag in range(1, 7)],
        "consume-ok": "c1",
        "while the window is full": (4, 1, 0),
        "first two": [(b"m0", False, "c1", 1, "<q>"), (b"m1", False, "c1", 2, "<q>")],
        "after nack and reject": [(b"m0", True), (b"m2", False), (b"m3", False),
                                  (b"m4", False), (b"m5", False)],
        "at the end": (0, 0),
    }


def test_kombu_simple_queue(amqp_broker):
    assert observe(s.kombu_simple_queue, amqp_broker) == {
        "qsize": 3,
        "get after requeue": [({"i": 1}, {"i": 1}, False), ({"i": 2}, {"i": 2}, False),
                              ({"i": 0}, {"i": 0}, True)],
        "qsize at the end": 0,
        "topic via producer": [("order.created", "order.created", "application/json"),
                               ("order.eu.paid", "order.eu.paid", "application/json")],
        "passive missing": ("NotFound",) + no_queue("none")[1:],
        "exchange type clash": ("PreconditionFailed",) + inequivalent(
            "type", "exchange", "<events>", "direct", "topic")[1:],
    }


def test_request_reply(amqp_broker):
    assert observe(s.request_reply, amqp_broker) == {
        "replies": [(f"CALL {i}".encode(), f"c{i}", "text/plain") for i in range(3)],
        "reply queue": "amq.gen-", "reply queue after disconnect": ("channel", 404),
    }


def test_handshake(amqp_broker):
    """The capabilities RabbitMQ announces, its tune defaults, and what a client asks for."""
    assert observe(s.handshake, amqp_broker) == {
        "capabilities": dict.fromkeys([
            "publisher_confirms", "exchange_exchange_bindings", "basic.nack",
            "consumer_cancel_notify", "connection.blocked", "consumer_priorities",
            "authentication_failure_close", "per_consumer_qos", "direct_reply_to"], True),
        "tuned": (2047, 131072, 60), "asked": (16, 8192, 5),
    }


def test_transactions_and_purge(amqp_broker):
    assert observe(s.transactions_and_purge, amqp_broker) == {
        "before commit": 0, "after commit": 2, "got": b"one",
        "confirm on a transactional channel": closed(406, "cannot switch from tx to confirm "
                                                          "mode"),
        "purged": 1, "after close": [(b"one", True)],
    }


def test_direct_reply_to(amqp_broker):
    """Replies reach the requesting channel's reply consumer by the rewritten address; asking
    for it without a reply consumer, or acking replies, is 406; a late reply is dropped."""
    assert observe(s.direct_reply_to, amqp_broker) == {
        "replies": [(f"{i} llac".encode(), f"c{i}", "", True, False) for i in range(3)],
        "address": (True, 1, 3),
        "without a reply consumer": closed(406, "fast reply consumer does not exist"),
        "reply consumer with acks": closed(406, "reply consumer cannot acknowledge"),
        "reply to a gone client": (None, None),
    }


def test_aio_pika_patterns(amqp_broker):
    """aio-pika's RPC (closing it unbinds from the auto-deleted rpc.dlx: unbind-ok) and
    Master/Worker patterns."""
    assert observe(s.aio_pika_patterns, amqp_broker) == {
        "rpc": 42, "unserved call": ("MessageProcessError", "Message has been returned"),
        "jobs": [0, 1, 2],
    }


def test_prefetch_scopes(amqp_broker):
    """global=true: one window of 3 over the channel's two consumers (7 of 10 left ready)."""
    key = "qos raised while consuming: ready left"
    assert observe(s.prefetch_scopes, amqp_broker) == {
        "global window of 3 over two queues: ready left": 7,
        key: known("prefetch_scopes", key, amqp_broker.kind),
    }


def test_celery(amqp_broker):
    """A Celery worker and client as RabbitMQ users run them: results and failures over
    rpc://, retries, a task done while the worker holds countdown tasks (they were not ready
    yet), broadcast ping, a clean warm shutdown."""
    assert observe(s.celery, amqp_broker) == {
        "results": [2 * n for n in range(10)],
        "failure": ("FAILURE", "ValueError", "no such order"),
        "retried": 2,
        "immediate while countdowns wait": 2,
        "countdowns still waiting then": [False, False, False],
        "countdowns": [0, 1, 2],
        "ping": [{"ok": "pong"}],
        "worker exit": 0,
    }


def test_sender_selected(amqp_broker):
    """CC and BCC headers route one publish with more keys (each queue once, items that are
    not strings skipped); BCC is removed before delivery; a CC that is not an array is 406."""
    memo = ("memo", "to", {"CC": ["cc", "to"], "x": 1})
    odd = ("odd items", "to", {"CC": [1, "cc"]})
    assert observe(s.sender_selected, amqp_broker) == {
        "CC not an array": closed(406, 'invalid message: {unacceptable_type_in_header,"CC",'
                                       'longstr}'),
        "to": [memo, odd], "cc": [memo, odd], "bcc": [memo], "other": [],
    }


def test_tutorial_send(amqp_broker):
    """RabbitMQ's tutorial send.py, run as written five times: each message published right
    before connection.close() is stored and reaches the consumer."""
    assert observe(s.tutorial_send, amqp_broker) == {
        "send.py": [(0, " [x] Sent 'Hello World!'\n", "")] * 5,
        "consumed": [b"Hello World!"] * 5, "left": 0,
    }


def test_publishes_then_close(amqp_broker):
    """Every publish sent before a channel.close() or connection.close() is kept, in order,
    whatever channel follows; a transaction's uncommitted publishes are rolled back."""
    def sent(label: str, runs: int = 1) -> tuple[list[bytes], int]:
        return [f"{label} {run}.{i}".encode() for run in range(runs) for i in range(5)], 0
    assert observe(s.publishes_then_close, amqp_broker) == {
        "channel.close": sent("channel.close", 3), "connection.close": sent("connection.close", 3),
        "closed channel": sent("closed channel"), "other channel": sent("other channel"),
        "committed": sent("committed"), "uncommitted": ([], 0),
    }


DEFAULT_EXCHANGE_REFUSED = closed(403, "operation not permitted on the default exchange")


def test_conformance(amqp_broker):
    """What RabbitMQ's client suites check: a second exclusive consumer, or any on a queue with
    a single active consumer, is 403; nothing but a publish may name the default exchange
    (403), `amq.*` exchanges are never deleted (403); channel_max counts open channels (530);
    a message above RabbitMQ 4's 16 MiB is 406 on its channel."""
    in_exclusive_use = closed(403, "queue '<q>' in vhost '/' in exclusive use")
    assert observe(s.conformance, amqp_broker) == {
        "exclusive consume where a consumer is": in_exclusive_use,
        "exclusive consume where an exclusive one is": in_exclusive_use,
        "consume where an exclusive one is": in_exclusive_use,
        "exclusive consume of a single-active-consumer queue": closed(
            403, "queue '<single>' in vhost '/' in exclusive use"),
        "consume of a single-active-consumer queue": "ok",
        "passive declare of the default exchange": DEFAULT_EXCHANGE_REFUSED,
        "declare of the default exchange": DEFAULT_EXCHANGE_REFUSED,
        "delete of the default exchange": DEFAULT_EXCHANGE_REFUSED,
        "delete of amq.direct": closed(403, "deletion of system exchange 'amq.direct' in vhost "
                                            "'/' not allowed"),
        "delete of a missing amq. exchange": closed(403, "deletion of system exchange "
                                                         "'amq.<x>' in vhost '/' not allowed"),
        "queue bound to the default exchange": DEFAULT_EXCHANGE_REFUSED,
        "queue unbound from the default exchange": DEFAULT_EXCHANGE_REFUSED,
        "default exchange bound to amq.direct": DEFAULT_EXCHANGE_REFUSED,
        "16 MiB message": "confirmed",
        "22 MB message": closed(406, "message size 22000000 is larger than configured max "
                                     "size 16777216"),
        "channel_max": 8, "channel numbered above channel_max": True,
        "one channel more than channel_max": (530, "NOT_ALLOWED - number of channels opened (8) "
                                                   "has reached the negotiated channel_max (8)"),
    }


def without_known(scenario: str, observed: Any) -> Any:
    """``observed`` with the keys ``KNOWN`` lists for ``scenario`` left out."""
    if (scenario, "") in KNOWN:
        return None
    if not isinstance(observed, dict):
        return observed
    return {key: value for key, value in observed.items() if (scenario, key) not in KNOWN}


@pytest.mark.parametrize("scenario", s.SCENARIOS, ids=lambda scenario: scenario.__name__)
def test_same_observation(scenario, rabbitmq, sluice_amqp):
    """Both brokers gave the same observation, outside the listed differences."""
    seen = {}
    for broker in (rabbitmq, sluice_amqp):
        key = (scenario.__name__, broker.kind)
        seen[broker.kind] = OBSERVED[key] if key in OBSERVED else observe(scenario, broker)
    assert without_known(scenario.__name__, seen["sluice"]) == without_known(
        scenario.__name__, seen["rabbitmq"])
