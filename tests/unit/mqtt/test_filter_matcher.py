"""A session's compiled filter (`topics.filter_matcher`) decides exactly as `topics.matches`."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from protocols.mqtt.topics import filter_matcher, matches

_LEVELS = st.sampled_from(["a", "b", "$SYS", "", "a.b", "c*d", "(x)", "\n", "é"])
_TOPICS = st.lists(_LEVELS, min_size=1, max_size=5).map("/".join)
_FILTERS = st.lists(st.one_of(_LEVELS, st.just("+")), min_size=1, max_size=5).flatmap(
    lambda levels: st.sampled_from(["/".join(levels), "/".join([*levels, "#"]), "#"]))


@settings(max_examples=2000, deadline=None)
@given(_FILTERS, _TOPICS)
def test_compiled_filter_decides_as_matches(topic_filter: str, topic: str) -> None:
    assert bool(filter_matcher(topic_filter)(topic)) == matches(topic_filter, topic)


def test_the_rules_users_rely_on() -> None:
    fleet = filter_matcher("devices/+/telemetry")
    assert fleet("devices/d1/telemetry") and fleet("devices//telemetry")
    assert not fleet("devices/d1/telemetry/x") and not fleet("devices/d1")
    assert filter_matcher("sport/#")("sport") and filter_matcher("sport/#")("sport/a/b")
    assert not filter_matcher("#")("$SYS/uptime") and not filter_matcher("+/uptime")("$SYS/uptime")
    assert filter_matcher("$SYS/#")("$SYS/uptime")
    assert not filter_matcher("a.b")("axb") and not filter_matcher("+/a.b")("x/axb")
