"""``VirtualHosts`` keeps a ``TopicMirror`` in step with the queue bindings of ``amq.topic``:
after any sequence of binds (with and without arguments), unbinds, queue deletions and
redeclarations, and virtual host deletion, the mirror holds exactly the (named queue, key)
pairs the exchange graphs have, and a mirror installed later is told of all of them."""
from __future__ import annotations

import asyncio
import itertools
from collections import Counter

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from core.errors import NotFound
from core.exchanges import Destination
from core.metadata import MetadataRepository
from core.vhosts import TOPIC_EXCHANGE, QueueSettings, VirtualHosts

RUNS = itertools.count()
QUEUES = ("q1", "q2")
KEYS = ("a.*", "a.#.b", "#")
OPS = st.lists(st.one_of(
    st.tuples(st.just("bind"), st.sampled_from(QUEUES), st.sampled_from(KEYS), st.booleans()),
    st.tuples(st.just("unbind"), st.sampled_from(QUEUES), st.sampled_from(KEYS), st.booleans()),
    st.tuples(st.just("delete"), st.sampled_from(QUEUES)),
    st.tuples(st.just("declare"), st.sampled_from(QUEUES)),
    st.tuples(st.just("drop vhost"))), max_size=25)


class Recorder:
    """A mirror that counts what it is told; a pair told bound twice counts once."""

    def __init__(self) -> None:
        self.pairs: Counter[tuple[str, str, str]] = Counter()

    def bound(self, vhost: str, queue: str, named: str, routing_key: str) -> None:
        self.pairs[(vhost, named, routing_key)] = 1

    def unbound(self, vhost: str, queue: str, named: str, routing_key: str) -> None:
        assert self.pairs.pop((vhost, named, routing_key), 0) == 1, "unbound what was not bound"


def graph_pairs(hosts: VirtualHosts) -> set[tuple[str, str, str]]:
    pairs = set()
    for vhost in hosts.names():
        host = hosts.get(vhost)
        for binding in host.graph.get(TOPIC_EXCHANGE).bindings:
            if not binding.destination.is_exchange:
                pairs.add((vhost, host.named(binding.destination.name), binding.routing_key))
    return pairs


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(OPS)
@example([("bind", "q1", "a.*", False), ("bind", "q2", "#", False),
          ("unbind", "q1", "a.*", False)])
@example([("bind", "q1", "a.*", False), ("bind", "q1", "a.*", True),
          ("unbind", "q1", "a.*", True), ("delete", "q1")])
@example([("bind", "q1", "a.#.b", False), ("delete", "q1"), ("declare", "q1"),
          ("bind", "q1", "a.#.b", False), ("drop vhost",)])
def test_the_mirror_follows_every_change(tmp_path, ops):
    metadata = MetadataRepository.for_data_dir(str(tmp_path / f"m{next(RUNS)}"))

    async def scenario() -> None:
        hosts = VirtualHosts(metadata)
        mirror = Recorder()
        hosts.mirror_topic_bindings(mirror)
        await hosts.create("v")
        for queue in QUEUES:
            await hosts.declare_queue("v", QueueSettings(queue))
        for op in ops:
            try:
                if op[0] == "bind":
                    await hosts.bind("v", TOPIC_EXCHANGE, Destination(op[1]), op[2],
                                     {"x-n": 1} if op[3] else None)
                elif op[0] == "unbind":
                    await hosts.unbind("v", TOPIC_EXCHANGE, Destination(op[1]), op[2],
                                       {"x-n": 1} if op[3] else None)
                elif op[0] == "delete":
                    await hosts.delete_queue("v", op[1])
                elif op[0] == "declare":
                    await hosts.declare_queue("v", QueueSettings(op[1]))
                else:
                    await hosts.delete("v")
            except NotFound:
                pass  # a queue or the vhost deleted before
            assert set(mirror.pairs) == graph_pairs(hosts)
        later = Recorder()
        hosts.mirror_topic_bindings(later)
        assert set(later.pairs) == graph_pairs(hosts)
    try:
        asyncio.run(scenario())
    finally:
        metadata.close()
