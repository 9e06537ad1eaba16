"""Cursor.visible counts in-flight messages whose deadline has passed (released ones too),
walking only the due part of the deadline heap; checked against a plain count."""
from __future__ import annotations

from hypothesis import given, strategies as st

from core.cursors import Cursor

Step = st.tuples(st.sampled_from(["deliver", "extend", "ack"]), st.integers(0, 30),
                 st.integers(0, 100))


@given(st.lists(Step, max_size=120), st.integers(0, 200))
def test_visible_is_the_number_of_flights_past_their_deadline(steps, now):
    cursor = Cursor(committed=0, next=0)
    for action, offset, when in steps:
        if action == "deliver":
            cursor.deliver(offset, when, when % 7 * 10)
        elif action == "extend" and offset in cursor.inflight:
            cursor.extend(offset, when, 0)  # released: visible again from ``when``
        elif action == "ack":
            cursor.ack(offset)
    expected = sum(1 for flight in cursor.inflight.values() if flight.deadline_ms <= now)
    assert cursor.visible(now) == expected
