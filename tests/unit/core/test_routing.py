"""The topic trie in MQTT's and AMQP's syntax: wildcards, `$` topics, validation, and matching
cost independent of unrelated filters."""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.errors import InvalidArgument
from core.routing import TopicSyntax, TopicTrie

MQTT = TopicSyntax("/", "+", "#", multi_last=True, dollar_hidden=True)
AMQP = TopicSyntax(".", "*", "#")
"""An AMQP topic exchange: words split on ``.``, ``*`` one word, ``#`` zero or more anywhere."""


def trie_with(syntax: TopicSyntax, filter_: str) -> TopicTrie:
    trie = TopicTrie(syntax)
    trie.add(syntax.levels(filter_), "s")
    return trie


@pytest.mark.parametrize("filter_, subject, matches", [
    ("a/b/c", "a/b/c", True), ("a/+/c", "a/x/c", True), ("a/+/c", "a/x/y/c", False),
    ("a/#", "a", True), ("a/#", "a/b/c", True), ("#", "a/b", True), ("+", "a/b", False),
    ("+/+", "a/b", True), ("a/b", "a/b/c", False), ("#", "$SYS/x", False), ("+/x", "$SYS/x", False),
    ("$SYS/#", "$SYS/x", True), ("a//b", "a//b", True), ("a/+/b", "a//b", True),
    ("a/#", "$a/b", False), ("a/+", "a/$b", True),
])
def test_mqtt_filters(filter_, subject, matches):
    assert (trie_with(MQTT, filter_).match(MQTT.levels(subject)) == {"s"}) is matches
    assert MQTT.matches(filter_, subject) is matches


@pytest.mark.parametrize("binding, key, matches", [
    ("a.*.c", "a.b.c", True), ("a.*.c", "a.c", False), ("a.*.c", "a.b.x.c", False),
    ("*", "a", True), ("*", "a.b", False), ("*.b", "a.b.c", False), ("*.*", "a.b", True),
    ("a.#", "a", True), ("a.#", "a.b.c", True), ("#.c", "a.b.c", True), ("#.c", "c", True),
    ("a.#.c", "a.c", True), ("a.#.c", "a.x.y.c", True), ("a.#.c", "a.x.y", False),
    ("a.#.c", "b.x.c", False), ("#.b.#", "b", True), ("#.b.#", "a.b.c", True),
    ("#.b.#", "a.c", False), ("a.#.*", "a", False), ("a.#.*", "a.x", True),
    ("*.#.*", "a", False), ("*.#.*", "a.b.c.d", True), ("#", "", True), ("#", "a.b", True),
    ("#", "$a.b", True), ("a.b", "a.b", True), ("a.b", "a.b.c", False),
])
def test_amqp_bindings(binding, key, matches):
    assert (trie_with(AMQP, binding).match(AMQP.levels(key)) == {"s"}) is matches
    assert AMQP.matches(binding, key) is matches


@pytest.mark.parametrize("syntax, bad", [
    (MQTT, "a/#/b"), (MQTT, "a+"), (MQTT, "a/b#"), (MQTT, ""), (AMQP, "a*"), (AMQP, "a.b#.c"),
    (AMQP, ""),
])
def test_malformed_filters_are_refused_with_the_syntax_words(syntax, bad):
    with pytest.raises(InvalidArgument):
        syntax.check_filter(bad)
    if bad:
        with pytest.raises(InvalidArgument):
            TopicTrie(syntax).add(syntax.levels(bad), "s")


def test_the_multi_level_wildcard_may_stand_in_the_middle_for_amqp_only():
    assert AMQP.check_filter("a.#.b") == ["a", "#", "b"]
    with pytest.raises(InvalidArgument, match="'#' must be the last level"):
        MQTT.check_filter("a/#/b")


def test_remove_prunes_and_keeps_other_subscribers():
    trie = TopicTrie(MQTT)
    trie.add(["a", "+"], 1)
    trie.add(["a", "+"], 2)
    assert trie.remove(["a", "+"], 1) and not trie.remove(["a", "+"], 1)
    assert trie.match(["a", "b"]) == {2} and len(trie) == 1
    trie.remove(["a", "+"], 2)
    assert list(trie.filters()) == [] and len(trie) == 0


def test_matching_cost_does_not_grow_with_unrelated_subscriptions():
    trie = TopicTrie(MQTT)
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
def test_mqtt_match_agrees_with_a_linear_scan(filters, subject):
    trie = TopicTrie(MQTT)
    valid = [f for f in filters if "#" not in f[:-1]]
    for f in valid:
        trie.add(f, tuple(f))

    def matches(f: list[str]) -> bool:
        for i, level in enumerate(f):
            if level == "#":
                return True
            if i >= len(subject) or (level != "+" and level != subject[i]):
                return False
        return len(f) == len(subject)
    assert trie.match(subject) == {tuple(f) for f in valid if matches(f)}


@given(st.lists(st.lists(st.sampled_from(["a", "b", "*", "#"]), min_size=1, max_size=5), max_size=8),
       st.lists(LEVEL, min_size=1, max_size=5))
def test_amqp_trie_agrees_with_matching_one_binding_at_a_time(bindings, key):
    trie = TopicTrie(AMQP)
    for b in bindings:
        trie.add(b, tuple(b))
    assert trie.match(key) == {tuple(b) for b in bindings if AMQP.levels_match(b, key)}


def reference_match(binding: list[str], key: list[str]) -> bool:
    """AMQP topic matching written as its definition: ``#`` takes zero or more words."""
    if not binding:
        return not key
    if binding[0] == "#":
        return reference_match(binding[1:], key) or (bool(key) and reference_match(binding, key[1:]))
    return bool(key) and binding[0] in ("*", key[0]) and reference_match(binding[1:], key[1:])


@given(st.lists(st.sampled_from(["a", "b", "*", "#"]), min_size=1, max_size=5),
       st.lists(LEVEL, min_size=1, max_size=5))
def test_amqp_matching_agrees_with_its_definition(binding, key):
    assert AMQP.levels_match(binding, key) is reference_match(binding, key)
