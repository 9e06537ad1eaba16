"""Hostile filters and subjects cost bounded time and stack in core's trie and fan-out.

- A filter or subject deeper than ``MAX_LEVELS`` is refused with InvalidArgument (a 5,000-level
  subject used to raise RecursionError inside a send).
- Matching is iterative: the deepest allowed subject against the deepest allowed filter works.
- A chain of AMQP ``#`` levels is matched in polynomial, not exponential, time.
- The route cache holds a bounded number of bytes whatever subjects senders invent.
- Names of dots only are refused as topic and group names; stored ones still load.
"""
from __future__ import annotations

import tracemalloc

import pytest

from core.assembly import Core
from core.bounded_cache import BoundedCache, IdentityCache
from core.errors import InvalidArgument
from core.fanout import ROUTE_CACHE_BYTES, Fanout
from core.model import SUBJECT_PROPERTY, SYSTEM, GroupConfig, OutgoingMessage, TopicConfig
from core.routing import MAX_LEVELS, TopicTrie
from tests.unit.core.test_broker import SUBJECTS, run_core, topic
from tests.unit.core.test_fanout import Recorder
from tests.unit.core.test_routing import AMQP


def test_filters_and_subjects_deeper_than_the_bound_are_refused():
    trie = TopicTrie(SUBJECTS)
    with pytest.raises(InvalidArgument, match="at most 1024 levels"):
        trie.add(["a"] * 5_000, "s")
    with pytest.raises(InvalidArgument, match="at most 1024 levels"):
        trie.match(["a"] * 5_000)
    assert len(trie) == 0


def test_the_deepest_allowed_subject_matches_without_recursion():
    trie = TopicTrie(SUBJECTS)
    deep = [f"l{i}" for i in range(MAX_LEVELS)]
    trie.add(deep, "exact")
    trie.add(["+"] * (MAX_LEVELS - 1) + ["#"], "wild")
    trie.add(deep[:-1] + ["#"], "prefix")
    assert trie.match(deep) == {"exact", "wild", "prefix"}


def test_a_chain_of_amqp_hashes_is_not_exponential():
    """``#.#.#...`` against a long key: each (node, depth) is walked once, so the visits stay
    below nodes x depth instead of growing as depth ** hashes."""
    trie = TopicTrie(AMQP)
    trie.add(["#"] * 12 + ["end"], "q")
    key = ["w"] * 200 + ["end"]
    assert trie.match(key) == {"q"}
    assert trie.visited <= 14 * (len(key) + 1) * 2
    assert trie.match(["w"] * 200) == set()


def test_sends_with_a_too_deep_subject_are_refused_and_binds_too(tmp_path):
    async def scenario(core: Core) -> None:
        broker = core.broker
        await topic(broker, "devices")
        listener = Recorder()
        core.queues.add_listener("devices/#", listener)
        with pytest.raises(InvalidArgument):
            core.queues.bind("/".join(["x"] * 5_000), "session-deep")
        deep = "devices/" + "/".join(["x"] * 5_000)
        with pytest.raises(InvalidArgument, match="levels"):
            await broker.send(SYSTEM, [OutgoingMessage("devices", b"deep",
                                                       properties={SUBJECT_PROPERTY: deep})])
        await broker.send(SYSTEM, [OutgoingMessage("devices", b"ok",
                                                   properties={SUBJECT_PROPERTY: "devices/d1"})])
        assert listener.got == [b"ok"]
    run_core(tmp_path, scenario)


def test_the_route_cache_stays_within_its_byte_budget():
    """Routing 1,000 distinct 60 KB subjects (60 MB of names) and 2,000 distinct 1 KB ones
    leaves the fan-out holding a few MB at most: long subjects are never cached and the rest
    is bounded in bytes."""
    fanout = Fanout(SUBJECTS)
    fanout.bind("devices/#", "listener")
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(1_000):
            assert fanout.route(f"devices/{i}/" + "y" * 60_000).listeners == ("listener",)
        for i in range(2_000):
            fanout.route(f"devices/{i:05d}/" + "x" * 1_000)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert held < ROUTE_CACHE_BYTES and held < 4 << 20, f"the fan-out holds {held} bytes"


def test_bounded_cache_evicts_oldest_and_skips_long_keys():
    cache: BoundedCache[int] = BoundedCache(budget_bytes=1_000, max_key_chars=100)
    cache.put("x" * 101, 1)
    assert cache.get("x" * 101) is None and len(cache) == 0
    for i in range(100):
        cache.put(f"key-{i}", i)
    assert cache.size <= 1_000 and cache.get("key-99") == 99 and cache.get("key-0") is None
    cache.clear()
    assert cache.size == 0 and cache.get("key-99") is None


def test_identity_cache_answers_only_for_the_same_object_and_stays_in_its_budget():
    cache: IdentityCache[dict, int] = IdentityCache(budget_bytes=2_000)
    first = {"subject": "devices/1/telemetry"}
    cache.put(first, 1, 100)
    assert cache.get(first) == 1
    assert cache.get(dict(first)) is None, "an equal object is not the same one"
    kept = [{"subject": f"devices/{i}/telemetry"} for i in range(100)]
    for i, properties in enumerate(kept):
        cache.put(properties, i, 100)
    assert cache.size <= 2_000 and cache.get(kept[-1]) == 99
    assert cache.get(first) is None and cache.get(kept[0]) is None, "the oldest went first"
    cache.put(first, 1, 10_000)
    assert cache.get(first) is None, "an entry larger than the budget is not kept"


@pytest.mark.parametrize("name", [".", "..", "...", "." * 127])
def test_names_of_dots_only_are_refused(name):
    with pytest.raises(InvalidArgument, match="not dots only"):
        TopicConfig(name)
    with pytest.raises(InvalidArgument, match="not dots only"):
        GroupConfig(name)
    assert TopicConfig(name, stored=True).name == name  # what an older version stored loads


def test_a_refused_name_is_clipped_in_the_error():
    with pytest.raises(InvalidArgument) as refused:
        TopicConfig("x" * 60_000)
    assert len(str(refused.value)) < 400


@pytest.mark.parametrize("store", ["memory", "file"])
def test_state_keys_too_long_for_the_store_are_refused(tmp_path, store):
    """A 65,535-byte client id as a session key used to fail inside the store."""
    async def scenario(core: Core) -> None:
        await core.state.ensure_compacted("%SYS%state")
        with pytest.raises(InvalidArgument, match="keys exceed"):
            await core.state.put("%SYS%state", "s/" + "c" * 65_535, b"{}")
        with pytest.raises(InvalidArgument, match="keys exceed"):
            await core.state.put("%SYS%state", "s/" + "é" * 20_000, b"{}")
        await core.state.put("%SYS%state", "s/" + "c" * 256, b"{}")
        assert [m.keys[0] for m in core.state.load("%SYS%state")] == ["s/" + "c" * 256]
    run_core(tmp_path, scenario, store=store)
