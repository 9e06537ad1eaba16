"""Hypothesis against what clients hand the delay timer: MQTT ``$delayed/...`` topic names and
recall handles parse or are refused with the protocol's error, never another exception."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from core.errors import InvalidArgument
from core.timer import parse_recall_handle, recall_handle
from protocols.mqtt.topics import DELAYED_PREFIX, MAX_DELAY_DIGITS, split_delayed

pieces = st.lists(st.sampled_from(["1", "60", "007", "x", "", "/", "$", "a", "٣", "-1", ":"]),
                  max_size=8).map("".join)


@settings(max_examples=500, deadline=None)
@given(rest=st.one_of(pieces, st.text(max_size=40)))
def test_delayed_topics_parse_or_are_refused(rest):
    parsed = split_delayed(DELAYED_PREFIX + rest)
    if parsed is not None:
        seconds, topic = parsed
        assert 0 <= seconds < 10 ** MAX_DELAY_DIGITS and topic and not topic.startswith("$")
        assert rest == f"{rest.split('/', 1)[0]}/{topic}"


@settings(max_examples=500, deadline=None)
@given(handle=st.one_of(pieces, st.text(max_size=300),
                        st.builds("{}:{}:{}".format, st.sampled_from(["7", "007", "٣"]),
                                  st.integers(0, 99), st.text(max_size=5))))
def test_recall_handles_parse_or_are_refused(handle):
    try:
        bucket, offset, msg_id = parse_recall_handle(handle)
    except InvalidArgument:
        return
    assert recall_handle(bucket, offset, msg_id) == handle
