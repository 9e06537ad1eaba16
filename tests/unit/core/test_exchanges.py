"""Exchanges and bindings route as RabbitMQ does: the queues a message reaches from each exchange
type, exchange-to-exchange bindings, alternate exchanges, and the refusals AMQP clients see."""
from __future__ import annotations

import pytest

from core.errors import AccessDenied, InvalidArgument, NotFound, PreconditionFailed
from core.exchanges import Destination, ExchangeGraph
from core.headers_index import headers_match

QUEUES = {"q1", "q2", "q3", "orders", "audit", "unrouted"}


@pytest.fixture
def graph() -> ExchangeGraph:
    return ExchangeGraph(QUEUES.__contains__)


def q(name: str) -> Destination:
    return Destination(name)


def ex(name: str) -> Destination:
    return Destination(name, is_exchange=True)


def test_the_default_exchange_routes_to_the_queue_named_by_the_key(graph):
    assert graph.route("", "orders") == {"orders"}
    assert graph.route("", "missing") == set()
    with pytest.raises(AccessDenied):
        graph.bind("", q("orders"), "orders")


def test_direct_exchange_routes_by_equal_key(graph):
    graph.bind("amq.direct", q("q1"), "red")
    graph.bind("amq.direct", q("q2"), "red")
    graph.bind("amq.direct", q("q3"), "blue")
    assert graph.route("amq.direct", "red") == {"q1", "q2"}
    assert graph.route("amq.direct", "green") == set()


def test_fanout_exchange_ignores_the_key(graph):
    graph.bind("amq.fanout", q("q1"), "")
    graph.bind("amq.fanout", q("q2"), "anything")
    assert graph.route("amq.fanout", "whatever") == {"q1", "q2"}


@pytest.mark.parametrize("pattern, key, hit", [
    ("devices.*.telemetry", "devices.d1.telemetry", True),
    ("devices.*.telemetry", "devices.d1.x.telemetry", False),
    ("devices.#", "devices", True),                 # zero words
    ("devices.#", "devices.a.b.c", True),
    ("a.#.b", "a.b", True),                          # '#' in the middle, zero words
    ("a.#.b", "a.x.y.b", True),
    ("a.#.b", "a.x.y.c", False),
    ("#", "", True),
    ("*", "", True),                                 # one empty word
    ("*.*", "a", False),
    ("#.#", "a.b", True),
])
def test_topic_exchange_words(graph, pattern, key, hit):
    graph.bind("amq.topic", q("q1"), pattern)
    assert graph.route("amq.topic", key) == ({"q1"} if hit else set())


def test_headers_exchange_all_any_and_with_x():
    headers = {"format": "pdf", "type": "report", "x-origin": "scanner"}
    assert headers_match({"format": "pdf", "type": "report"}, headers)
    assert not headers_match({"format": "pdf", "type": "log"}, headers)
    assert headers_match({"x-match": "any", "format": "pdf", "type": "log"}, headers)
    assert headers_match({"format": "pdf", "x-origin": "other"}, headers)     # x- ignored
    assert not headers_match({"x-match": "all-with-x", "format": "pdf", "x-origin": "other"},
                             headers)
    assert headers_match({"x-match": "any-with-x", "x-origin": "scanner"}, headers)


def test_headers_bindings_route_and_bad_x_match_is_refused(graph):
    graph.bind("amq.headers", q("q1"), "", {"x-match": "any", "format": "pdf", "type": "log"})
    graph.bind("amq.match", q("q2"), "", {"format": "zip"})
    assert graph.route("amq.headers", "", {"type": "log"}) == {"q1"}
    assert graph.route("amq.match", "", {"format": "zip"}) == {"q2"}
    with pytest.raises(InvalidArgument):
        graph.bind("amq.headers", q("q3"), "", {"x-match": "most"})


def test_exchange_to_exchange_bindings_are_followed_once_each(graph):
    graph.declare("a", "fanout")
    graph.declare("b", "topic")
    graph.bind("a", ex("b"), "")
    graph.bind("b", ex("a"), "#")          # a cycle
    graph.bind("b", q("q1"), "orders.*")
    graph.bind("a", q("q2"), "")
    assert graph.route("a", "orders.new") == {"q1", "q2"}
    assert graph.route("a", "invoices.new") == {"q2"}


def test_an_unroutable_message_goes_on_through_the_alternate_exchange(graph):
    graph.declare("fallback", "fanout")
    graph.bind("fallback", q("unrouted"), "")
    graph.declare("orders", "direct", arguments={"alternate-exchange": "fallback"})
    graph.bind("orders", q("orders"), "new")
    assert graph.route("orders", "new") == {"orders"}
    assert graph.route("orders", "cancelled") == {"unrouted"}


def test_redeclaring_differently_is_a_precondition_failure(graph):
    graph.declare("logs", "fanout")
    assert graph.declare("logs", "fanout").name == "logs"
    with pytest.raises(PreconditionFailed, match="^inequivalent arg 'type' for exchange 'logs' "
                       "in vhost '/': received 'topic' but current is 'fanout'$"):
        graph.declare("logs", "topic")
    with pytest.raises(PreconditionFailed, match="arg 'durable' .* received 'false' but current "
                       "is 'true'$"):
        graph.declare("logs", "fanout", durable=False)
    with pytest.raises(InvalidArgument, match="unknown exchange type"):
        graph.declare("x", "x-consistent-hash")
    with pytest.raises(AccessDenied):
        graph.declare("amq.custom", "direct")
    with pytest.raises(NotFound):
        graph.declare("absent", "direct", passive=True)


def test_internal_exchanges_take_no_client_publishes(graph):
    graph.declare("inner", "fanout", internal=True)
    graph.bind("inner", q("q1"), "")
    with pytest.raises(AccessDenied):
        graph.route("inner", "k")
    graph.declare("outer", "fanout")
    graph.bind("outer", ex("inner"), "")
    assert graph.route("outer", "k") == {"q1"}


def test_deleting_exchanges_and_queues_removes_their_bindings(graph):
    graph.declare("events", "topic")
    graph.bind("events", q("q1"), "#")
    with pytest.raises(PreconditionFailed):
        graph.delete("events", if_unused=True)
    with pytest.raises(AccessDenied):
        graph.delete("amq.topic")
    graph.bind("amq.fanout", ex("events"), "")
    assert graph.delete("events")
    assert graph.route("amq.fanout", "k") == set()
    graph.bind("amq.direct", q("q2"), "k")
    graph.queue_deleted("q2")
    assert graph.route("amq.direct", "k") == set() and graph.bindings() == []


def test_auto_delete_exchange_goes_with_its_last_binding(graph):
    graph.declare("temp", "direct", auto_delete=True)
    graph.bind("temp", q("q1"), "a")
    graph.bind("temp", q("q2"), "b")
    graph.unbind("temp", q("q1"), "a")
    assert "temp" in graph
    graph.queue_deleted("q2")
    assert "temp" not in graph


def test_binding_needs_existing_ends_and_unbinding_keeps_other_arguments(graph):
    with pytest.raises(NotFound):
        graph.bind("amq.direct", q("nope"), "k")
    with pytest.raises(NotFound):
        graph.bind("missing", q("q1"), "k")
    graph.bind("amq.headers", q("q1"), "", {"a": 1})
    graph.bind("amq.headers", q("q1"), "", {"b": 2})
    assert graph.unbind("amq.headers", q("q1"), "", {"a": 1})
    assert graph.route("amq.headers", "", {"b": 2}) == {"q1"}
    assert not graph.unbind("amq.headers", q("q1"), "", {"a": 1})
    assert not graph.unbind("no-such-exchange", q("q1"), "")  # unbind-ok, as in RabbitMQ


def test_a_route_asked_again_follows_every_change_of_bindings_and_exchanges(graph):
    """Routes are remembered between publishes: each change must show in the next one."""
    graph.declare("events", "topic", arguments={"alternate-exchange": "spare"})
    graph.bind("events", q("q1"), "a.*")
    assert graph.route("events", "a.b") == {"q1"}
    graph.bind("events", q("q2"), "#")
    assert graph.route("events", "a.b") == {"q1", "q2"}
    graph.unbind("events", q("q1"), "a.*")
    assert graph.route("events", "a.b") == {"q2"}
    graph.queue_deleted("q2")
    assert graph.route("events", "a.b") == set()
    graph.declare("spare", "fanout")  # the alternate, declared after it was named
    graph.bind("spare", q("q3"), "")
    assert graph.route("events", "a.b") == {"q3"}
    graph.delete("spare")
    assert graph.route("events", "a.b") == set()
    graph.route("events", "a.b").add("changed")  # a caller's set is its own
    assert graph.route("events", "a.b") == set()


def test_routes_through_a_headers_exchange_follow_each_message_headers(graph):
    graph.bind("amq.direct", ex("amq.match"), "k")
    graph.bind("amq.match", q("q1"), "", {"x-match": "all", "kind": "x"})
    assert graph.route("amq.direct", "k", {"kind": "x"}) == {"q1"}
    assert graph.route("amq.direct", "k", {"kind": "y"}) == set()
    assert graph.route("amq.direct", "k", {"kind": "x"}) == {"q1"}
