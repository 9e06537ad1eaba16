"""Hypothesis against what push receivers answer, which the broker reads from any sink: a
response's headers and body make a reply event or None, and a Retry-After header a delay in
range or None, and neither ever raises."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from core.service import MAX_INVISIBLE_MS
from protocols.push.delivery import backoff_ms, retry_after_ms, subject_matches
from protocols.push.reply import reply_event

NAMES = st.sampled_from(["ce-id", "ce-source", "ce-specversion", "ce-type", "ce-time",
                         "ce-subject", "ce-x", "content-type", "Content-Type", "ce-"])
VALUES = st.one_of(st.sampled_from(["1.0", "0.3", "", "a", "2020-01-01T00:00:00Z", "nope",
                                    "application/json", "application/cloudevents+json",
                                    "text/plain"]), st.text(max_size=12))
BODIES = st.one_of(st.binary(max_size=64), st.sampled_from([
    b'{"specversion":"1.0","id":"1","source":"/s","type":"t","data":{"a":1}}',
    b'{"specversion":"1.0","id":"1","source":"/s","type":"t","data_base64":"!!"}',
    b'{"specversion":"1.0"}', b"[]", b"{", b'{"data": 1}']))


@settings(max_examples=400, deadline=None)
@given(headers=st.dictionaries(NAMES, VALUES, max_size=8), body=BODIES)
def test_any_response_is_a_valid_event_or_none(headers, body):
    event = reply_event(headers, body)
    if event is not None:
        assert all(event.attributes[name] for name in ("id", "source", "specversion", "type"))
        assert isinstance(event.data, bytes)


@settings(max_examples=400, deadline=None)
@given(value=st.one_of(st.none(), st.text(max_size=40), st.integers(0, 10**12).map(str),
                       st.sampled_from(["Wed, 21 Oct 2015 07:28:00 GMT", "Sun, 06 Nov 2094 "
                                        "08:49:37 GMT", "120", " 5 ", "-1", "1.5"])))
def test_retry_after_is_a_delay_in_range_or_none(value):
    delay = retry_after_ms(value)
    assert delay is None or 0 <= delay <= MAX_INVISIBLE_MS


@given(attempt=st.integers(1, 10_000), low=st.integers(1, 10_000), extra=st.integers(0, 10**6))
def test_backoff_stays_between_its_bounds(attempt, low, extra):
    assert low <= backoff_ms(attempt, low, low + extra) <= low + extra


def test_subject_filters_match_as_mqtt_filters_do():
    assert subject_matches("a/+/c", "a/b/c") and not subject_matches("a/+/c", "a/b/c/d")
    assert subject_matches("a/#", "a") and subject_matches("a/#", "a/b/c")
    assert not subject_matches("a/b", "a") and subject_matches("+", "a")
