"""The topic trie: MQTT and AMQP wildcard semantics, and matching cost independent of unrelated filters."""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.errors import InvalidArgument
from core.routing import TopicTrie


def mqtt() -> TopicTrie:
    return TopicTrie("+", "#", protect_dollar=True)


def amqp() -> TopicTrie:
    return TopicTrie("*", "#", multi_anywhere=True)


@pytest.mark.parametrize("filter_, subject, matches", [
    ("a/b/c", "a/b/c", True), ("a/+/c", "a/x/c", True), ("a/+/c", "a/x/y/c", False),
    ("a/#", "a", True), ("a/#", "a/b/c", True), ("#", "a/b", True), ("+", "a/b", False),
    ("+/+", "a/b", True), ("a/b", "a/b/c", False), ("#", "$SYS/x", False), ("+/x", "$SYS/x", False),
    ("$SYS/#", "$SYS/x", True), ("a//b", "a//b", True), ("a/+/b", "a//b", True),
])
def test_mqtt_filters(filter_, subject, matches):
    trie = mqtt()
    trie.add(filter_.split("/"), "s")
    assert (trie.match(subject.split("/")) == {"s"}) is matches


@pytest.mark.parametrize("binding, key, matches", [
    ("a.*.c", "a.b.c", True), ("a.#", "a", True), ("#.c", "a.b.c", True), ("a.#.c", "a.c", True),
    ("a.#.c", "a.x.y.c", True), ("a.#.c", "a.x.y", False), ("*.b", "a.b.c", False), ("#", "", True),
])
def test_amqp_bindings(binding, key, matches):
    trie = amqp()
    trie.add(binding.split("."), "q")
    assert (trie.match(key.split(".")) == {"q"}) is matches


def test_bad_filters_are_refused():
    with pytest.raises(InvalidArgument):
        mqtt().add(["a", "#", "b"], "s")
    with pytest.raises(InvalidArgument):
        mqtt().add(["a+"], "s")


def test_remove_prunes_and_keeps_other_subscribers():
    trie = mqtt()
    trie.add(["a", "+"], 1)
    trie.add(["a", "+"], 2)
    assert trie.remove(["a", "+"], 1) and not trie.remove(["a", "+"], 1)
    assert trie.match(["a", "b"]) == {2} and len(trie) == 1
    trie.remove(["a", "+"], 2)
    assert list(trie.filters()) == [] and len(trie) == 0


def test_matching_cost_does_not_grow_with_unrelated_subscriptions():
    trie = mqtt()
    trie.add(["devices", "+", "telemetry"], "dashboard")
    trie.match(["devices", "d1", "telemetry"])
    few = trie.visited
    for i in range(20_000):
        trie.add(["fleet", str(i), "status"], i)
        trie.add(["devices", f"d{i}", "config"], i)
    assert trie.match(["devices", "d1", "telemetry"]) == {"dashboard"}
    assert trie.visited <= few + 1


LEVEL = st.sampled_from(["a", "b", "c", ""])


@given(st.lists(st.lists(st.sampled_from(["a", "b", "+", "#"]), min_size=1, max_size=4), max_size=8),
       st.lists(LEVEL, min_size=1, max_size=5))
def test_match_agrees_with_a_linear_scan(filters, subject):
    trie = mqtt()
    valid = []
    for f in filters:
        if "#" in f[:-1]:
            continue
        trie.add(f, tuple(f))
        valid.append(f)

    def matches(f: list[str]) -> bool:
        for i, level in enumerate(f):
            if level == "#":
                return True
            if i >= len(subject) or (level != "+" and level != subject[i]):
                return False
        return len(f) == len(subject)
    assert trie.match(subject) == {tuple(f) for f in valid if matches(f)}
