"""Bindings cost linear work to remove and restore, headers publishes examine a bounded number
of bindings, and the binding limits refuse what would pass them.

Work is counted, never timed: the calls an operation makes (``tests.unit.work``) and the
bindings the graph reports visiting. A queue with 10,000 bindings used to take 51 s to delete
(every binding removed rescanned every other), and a headers exchange with 10,000 bindings
compared every one of them per publish.
"""
from __future__ import annotations

import asyncio
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.errors import PreconditionFailed
from core.exchanges import BindingLimits, Destination, ExchangeGraph
from core.headers_index import headers_match
from core.metadata import MetadataRepository
from core.vhosts import TOPIC_EXCHANGE, QueueSettings, VirtualHosts
from tests.unit.work import count_calls

UNLIMITED = BindingLimits(10**7, 10**7, 10**7)
CALLS_PER_BINDING = 200
"""A generous constant: removing one binding makes about 90 calls."""


def graph_with(bindings: int, queue: str = "q") -> ExchangeGraph:
    """``queue`` bound ``bindings`` times to each of a direct, a topic and a headers exchange,
    beside other queues' bindings."""
    graph = ExchangeGraph(lambda name: True, limits=UNLIMITED)
    for i in range(bindings):
        graph.bind("amq.direct", Destination(queue), f"k{i}")
        graph.bind("amq.topic", Destination(queue), f"orders.{i}.#")
        graph.bind("amq.headers", Destination(queue), "", {"n": i})
        graph.bind("amq.direct", Destination(f"other{i}"), f"k{i}")
    return graph


@pytest.mark.parametrize("bindings", [100, 10_000])
def test_deleting_a_queue_visits_its_own_bindings_only(bindings):
    graph = graph_with(bindings)
    budget = CALLS_PER_BINDING * 3 * bindings
    calls, gone = count_calls(lambda: graph.queue_deleted("q"), budget)
    assert len(gone) == graph.visited == 3 * bindings
    assert calls <= budget
    assert len(graph) == bindings, "the other queues keep theirs"
    assert graph.route("amq.direct", "k1") == {"other1"}
    assert graph.route("amq.topic", "orders.1.x") == set()


def test_removing_bindings_one_by_one_is_linear_in_their_number():
    small, large = 100, 10_000

    def unbind_all(graph: ExchangeGraph, count: int) -> None:
        for i in range(count):
            graph.unbind("amq.direct", Destination("q"), f"k{i}")

    def direct(count: int) -> ExchangeGraph:
        graph = ExchangeGraph(lambda name: True, limits=UNLIMITED)
        for i in range(count):
            graph.bind("amq.direct", Destination("q"), f"k{i}")
        return graph

    graph = direct(small)
    few = count_calls(lambda: unbind_all(graph, small))[0]
    graph = direct(large)
    many = count_calls(lambda: unbind_all(graph, large), budget=few * large // small * 2)[0]
    assert many <= few * large // small * 2


@pytest.mark.parametrize("bindings", [100, 10_000])
def test_a_headers_publish_examines_the_rules_its_headers_name(bindings):
    graph = graph_with(bindings)
    for i in range(bindings):  # an any-rule per queue too, on another header
        graph.bind("amq.headers", Destination(f"other{i}"), "",
                   {"x-match": "any", "region": f"r{i}", "tier": "gold"})
    calls, reached = count_calls(lambda: graph.route("amq.headers", "", {"n": 7, "region": "r3"}))
    assert reached == {"q", "other3"}
    assert graph.visited <= 2
    assert calls <= 100, "the same work for 100 bindings as for 10,000"
    assert graph.route("amq.headers", "", {"tier": "gold"}) == {f"other{i}" for i in range(bindings)}
    assert graph.route("amq.headers", "", {"unrelated": 1}) == set()
    assert graph.visited == 0


def test_a_headers_publish_examines_at_most_the_exchanges_binding_limit():
    """Rules made to share a header with every message and fail it: each publish examines
    them all, which the per-exchange limit bounds."""
    limit = 300
    graph = ExchangeGraph(lambda name: True, limits=BindingLimits(10**6, limit, 10**6))
    bound = 0
    with pytest.raises(PreconditionFailed, match="max_bindings_per_exchange"):
        for i in range(limit + 1):
            graph.bind("amq.headers", Destination(f"q{i}"), "", {"common": 1, "n": i % 2, "m": i})
            bound += 1
    assert bound == limit
    graph.route("amq.headers", "", {"common": 1, "n": 5, "m": -1})
    assert graph.visited <= limit


HEADER_NAMES = st.sampled_from(["a", "b", "x-c"])
VALUES = st.one_of(st.none(), st.integers(0, 2), st.sampled_from(["s", "t"]))
ARGUMENTS = st.dictionaries(HEADER_NAMES, VALUES, max_size=3).flatmap(
    lambda wanted: st.sampled_from([{}, {"x-match": "any"}, {"x-match": "all-with-x"},
                                    {"x-match": "any-with-x"}]).map(lambda m: {**wanted, **m}))
HEADERS = st.dictionaries(HEADER_NAMES, st.one_of(st.integers(0, 2), st.sampled_from(
    ["s", "t"]), st.just(True), st.just([1]), st.just({"k": 1}), st.just(bytearray(b"s"))),
    max_size=3)


@settings(max_examples=150, deadline=None)
@given(st.lists(ARGUMENTS, max_size=8), st.lists(st.integers(0, 7), max_size=4), HEADERS)
def test_the_headers_index_routes_as_comparing_every_binding(rules, unbound, headers):
    graph = ExchangeGraph(lambda name: True)
    for i, arguments in enumerate(rules):
        graph.bind("amq.headers", Destination(f"q{i % 3}"), str(i), arguments)
    for i in unbound:
        if i < len(rules):
            graph.unbind("amq.headers", Destination(f"q{i % 3}"), str(i), rules[i])
    expected = {b.destination.name for b in graph.get("amq.headers").bindings
                if headers_match(dict(b.arguments), headers)}
    assert graph.route("amq.headers", "", headers) == expected


def test_bindings_beyond_each_limit_are_refused_naming_the_setting():
    graph = ExchangeGraph(lambda name: True, "v", BindingLimits(per_queue=2, per_exchange=3,
                                                                per_vhost=5))
    graph.bind("amq.direct", Destination("q"), "a")
    graph.bind("amq.direct", Destination("q"), "b")
    assert not graph.bind("amq.direct", Destination("q"), "b"), "a repeat is no new binding"
    with pytest.raises(PreconditionFailed, match=r"queue 'q' in vhost 'v' is bound 2 times.*"
                                                 r"core\.max_bindings_per_queue\) is 2"):
        graph.bind("amq.direct", Destination("q"), "c")
    graph.bind("amq.direct", Destination("r"), "a")
    with pytest.raises(PreconditionFailed, match=r"exchange 'amq\.direct' .*max_bindings_per_exchange"):
        graph.bind("amq.direct", Destination("s"), "a")
    graph.bind("amq.fanout", Destination("s"), "")
    graph.bind("amq.topic", Destination("s"), "#")
    with pytest.raises(PreconditionFailed, match=r"vhost 'v' has 5 bindings.*max_bindings_per_vhost"):
        graph.bind("amq.headers", Destination("t"), "")
    graph.queue_deleted("s")
    assert graph.bind("amq.headers", Destination("t"), "")


class Mirror:
    """A topic mirror noting the keys it is told are gone."""

    def __init__(self) -> None:
        self.gone: list[str] = []

    def bound(self, vhost: str, queue: str, named: str, routing_key: str) -> None:
        pass

    def unbound(self, vhost: str, queue: str, named: str, routing_key: str) -> None:
        self.gone.append(routing_key)


@pytest.mark.parametrize("bindings", [100, 10_000])
def test_a_queue_deleted_through_its_vhost_costs_linear_work_and_one_metadata_write(
        tmp_path, bindings):
    metadata = MetadataRepository.for_data_dir(str(tmp_path))
    writes: list[int] = []
    forget = metadata.delete_topology_rows
    metadata.delete_topology_rows = lambda *a: writes.append(len(a[2])) or forget(*a)
    hosts, mirror = VirtualHosts(metadata, UNLIMITED), Mirror()
    hosts.mirror_topic_bindings(mirror)

    async def build() -> None:
        await hosts.create("v")
        await hosts.declare_queue("v", QueueSettings("q"))
        await hosts.declare_queue("v", QueueSettings("other"))
        await hosts.bind("v", TOPIC_EXCHANGE, Destination("other"), "#")
        await hosts.bind("v", TOPIC_EXCHANGE, Destination("q"), "stored.#")
        for i in range(bindings):  # transient: no row each, to keep the test short
            hosts.get("v").graph.bind(TOPIC_EXCHANGE, Destination("q"), f"a.{i}")

    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(build())
        budget = CALLS_PER_BINDING * bindings + 10_000  # and the thread hand-offs
        calls = count_calls(lambda: loop.run_until_complete(hosts.delete_queue("v", "q")),
                            budget)[0]
    finally:
        loop.close()
    assert calls <= budget
    assert len(mirror.gone) == bindings + 1
    assert len(hosts.get("v").graph) == 1
    assert writes == [bindings + 1], "one transaction deletes every binding row"
    assert [row[1] for row in metadata.topology()].count("binding") == 1, "other's stays"
    metadata.close()


@pytest.mark.parametrize("bindings", [100, 10_000])
def test_restoring_bindings_at_start_is_linear_and_keeps_those_beyond_the_limits(
        tmp_path, bindings):
    rows = [("/", "vhost", "", "{}"), ("/", "queue", "q", json.dumps(
        {"auto_delete": False, "arguments": {}, "incarnation": "i"}))]
    rows += [("/", "binding", str(i), json.dumps(
        {"source": "amq.topic", "destination": "q", "to_exchange": False,
         "routing_key": f"a.{i}.#", "arguments": {}})) for i in range(bindings)]
    metadata = MetadataRepository.for_data_dir(str(tmp_path))
    hosts = VirtualHosts(metadata, BindingLimits(10, 10, 10))
    calls = count_calls(lambda: hosts.load(rows), CALLS_PER_BINDING * bindings)[0]
    assert calls <= CALLS_PER_BINDING * bindings
    graph = hosts.get("/").graph
    assert len(graph) == bindings
    assert graph.route("amq.topic", "a.7.b") == {"q"}
    with pytest.raises(PreconditionFailed, match="max_bindings"):
        graph.bind("amq.topic", Destination("q"), "more")
    metadata.close()
