"""A popped message is the stored one with its delivery's attempt, deadline and receipt handle:
nothing else of it is lost on the way (the copy is built field by field, per message)."""
from __future__ import annotations

import dataclasses

from core.consume import _deliver, parse_handle
from core.cursors import Cursor
from core.model import Delivery


def test_a_popped_delivery_keeps_every_field_of_the_stored_message():
    stored = Delivery("orders", 3, 41, "m-1", b"body", "tag", ("k1", "k2"), {"p": "v"}, 111, 222,
                      attempt=7, receipt_handle="old", invisible_until_ms=5, home_topic="home")
    cursor = Cursor(40, 40)
    flight = cursor.deliver(41, 1_000, 30_000)
    popped = _deliver(stored, "group", cursor, 41, flight.attempt)
    changed = {"attempt", "receipt_handle", "invisible_until_ms"}
    for field in dataclasses.fields(Delivery):
        if field.name not in changed:
            assert getattr(popped, field.name) == getattr(stored, field.name), field.name
    assert (popped.attempt, popped.invisible_until_ms) == (1, 31_000)
    handle = parse_handle(popped.receipt_handle, "group", "orders")
    assert (handle.queue_id, handle.offset, handle.version) == (3, 41, flight.version)
