"""Retained messages in a trie with limits, and saved session state that cannot stop a start.

- A wildcard lookup visits the nodes its filter selects, not every retained message: with
  60,000 retained topics, ``fleet/+/status`` or ``other/#`` visit about as many nodes as they
  match (node visits are counted, so the check does not depend on the machine's speed).
- Count and byte limits refuse new topics (counting those still being stored) and never
  replacements or clears; a cancelled admission gives its room back.
- Any saved session record other than what this version writes raises BadRecord only.
"""
from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocols.mqtt.mapping import EXPIRY_PROPERTY
from protocols.mqtt.retained import RetainedMessages
from protocols.mqtt.session_store import BadRecord, Qos2State, SessionRecord, SubscriptionOptions
from protocols.mqtt.topics import matches


def topics(retained: RetainedMessages, topic_filter: str) -> set[str]:
    return {inbound.topic for inbound in retained.matching(topic_filter)}


@pytest.fixture(scope="module")
def sixty_thousand() -> RetainedMessages:
    retained = RetainedMessages(max_messages=1_000_000)
    for i in range(50_000):
        retained.update(f"fleet/d{i}/status", b"s", {})
    for i in range(10_000):
        retained.update(f"other/{i % 100}/{i}", b"o", {})
    retained.update("fleet/d7/status/extra", b"e", {})
    retained.update("$SYS/broker", b"sys", {})
    return retained


@pytest.mark.parametrize("topic_filter, matched, most_visits", [
    ("fleet/d7/status", 1, 4),
    ("fleet/d7/#", 2, 6),
    ("other/42/+", 100, 110),
    ("other/+/4242", 1, 110),
    ("+/d7/status", 1, 8),
    ("other/#", 10_000, 10_200),
])
def test_a_wildcard_lookup_visits_what_it_matches(sixty_thousand, topic_filter, matched, most_visits):
    assert len(sixty_thousand.matching(topic_filter)) == matched
    assert sixty_thousand.visited <= most_visits


def test_wildcard_semantics():
    retained = RetainedMessages()
    for topic in ["a", "a/b", "a/b/c", "a//c", "$SYS/x", "b"]:
        retained.update(topic, topic.encode(), {})
    assert topics(retained, "a/#") == {"a", "a/b", "a/b/c", "a//c"}
    assert topics(retained, "#") == {"a", "a/b", "a/b/c", "a//c", "b"}
    assert topics(retained, "+/+/c") == {"a/b/c", "a//c"}
    assert topics(retained, "+") == {"a", "b"}
    assert topics(retained, "$SYS/#") == {"$SYS/x"}
    assert topics(retained, "a/b") == {"a/b"}
    retained.update("a/b", b"", {})
    assert topics(retained, "a/#") == {"a", "a/b/c", "a//c"} and len(retained) == 5


def test_limits_refuse_new_topics_but_not_replacements_or_clears():
    retained = RetainedMessages(max_messages=2, max_bytes=10)
    assert retained.admit("t/1", 4) and retained.admit("t/2", 4)
    assert not retained.admit("t/3", 1), "two admitted and still being stored count"
    retained.update("t/1", b"1234", {})
    retained.cancel("t/2")  # its store failed: its room is free again
    assert retained.admit("t/3", 6) and not retained.admit("t/4", 1)
    retained.update("t/3", b"123456", {})
    assert retained.admit("t/1", 100), "a replacement is always admitted"
    retained.update("t/1", b"x" * 100, {})
    assert retained.admit("t/9", 0), "a clear is always admitted"
    assert len(retained) == 2 and retained.bytes == 106
    retained.update("t/1", b"", {})
    assert retained.admit("t/5", 4)


def test_expired_retained_messages_are_dropped_and_free_their_room():
    retained = RetainedMessages(max_messages=1)
    retained.update("gone", b"x", {EXPIRY_PROPERTY: "1"})
    assert not retained.admit("new", 1)
    assert retained.matching("#") == [] and len(retained) == 0
    assert retained.admit("new", 1)


def test_a_session_record_round_trips():
    subs = {"a/+": SubscriptionOptions("a/+", 1, True, False, 2, 7),
            "$share/g/b/#": SubscriptionOptions("b/#", 2, share="g")}
    record = SessionRecord("c1", 3600, subs, 1_700_000_000_000)
    assert SessionRecord.decode("c1", record.encode()) == record
    state = Qos2State({1, 2}, {5: 3}, {6: 1_700_000_000_000})
    assert Qos2State.decode(state.encode()) == state


@pytest.mark.parametrize("data", [
    b"not json", b"[" * 100_000, b"\xff\xfe", b"[]", b'{"expiry": 1}', b'{"expiry": "1", "subs": []}',
    b'{"expiry": -1, "subs": []}', b'{"expiry": 1, "subs": [["a/#/b", 1]]}',
    b'{"expiry": 1, "subs": [["a", 3]]}', b'{"expiry": 1, "subs": [["a", 1, 1]]}',
    b'{"expiry": 1, "subs": [["a", 1, false, false, 0, 0]]}', b'{"expiry": 1, "subs": [{}]}',
    b'{"expiry": 1, "subs": [["a", 1, false, false, 0, null, "x/y"]]}',
    b'{"expiry": 1, "subs": [], "disconnected_at": "yesterday"}',
])
def test_bad_session_records_raise_bad_record(data):
    with pytest.raises(BadRecord):
        SessionRecord.decode("c1", data)


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6),
                    lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.sampled_from(["expiry", "subs", "disconnected_at", "in",
                                                       "rec", "done", "x"]), inner, max_size=4),
                    max_leaves=20)


@settings(max_examples=500, deadline=None)
@given(JSON)
def test_any_saved_json_decodes_or_raises_bad_record(doc):
    data = json.dumps(doc).encode()
    for decode in (lambda: SessionRecord.decode("c", data), lambda: Qos2State.decode(data)):
        try:
            decode()
        except BadRecord:
            pass


LEVELS = st.sampled_from(["a", "b", "", "$x"])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(LEVELS, min_size=1, max_size=4), max_size=12),
       st.lists(st.sampled_from(["a", "b", "", "+", "#", "$x"]), min_size=1, max_size=4),
       st.sets(st.integers(0, 11)))
def test_trie_lookup_agrees_with_matching_every_topic(levels, filter_levels, cleared):
    """The trie finds exactly the retained topics ``topics.matches`` accepts, after updates
    and clears in any order."""
    if "#" in filter_levels[:-1]:
        filter_levels = filter_levels[:filter_levels.index("#") + 1]
    topic_filter = "/".join(filter_levels)
    retained = RetainedMessages()
    kept = {}
    for i, topic_levels in enumerate(levels):
        topic = "/".join(topic_levels)
        retained.update(topic, b"" if i in cleared else b"p" + topic.encode(), {})
        if i in cleared:
            kept.pop(topic, None)
        else:
            kept[topic] = True
    assert topics(retained, topic_filter) == {t for t in kept if matches(topic_filter, t)}
    assert len(retained) == len(kept)
