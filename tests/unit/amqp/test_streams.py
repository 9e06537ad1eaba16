"""Where a stream consumer starts (x-stream-offset) and RabbitMQ's refusals of stream
consumers."""
from __future__ import annotations

from datetime import datetime, timezone

import pytest

from core.clock import now_ms
from core.errors import NotSupported, PreconditionFailed
from protocols.amqp.streams import check_consumer, start_offset

BOUNDS = (10, 20)


def start(spec, at_time=lambda ms: -ms):
    return start_offset({"x-stream-offset": spec}, BOUNDS, at_time)


def test_named_positions_and_offsets_clamped_to_the_stream():
    assert start_offset(None, BOUNDS, lambda ms: 0) == 20, "next by default"
    assert (start("first"), start("last"), start("next"), start(b"first")) == (10, 19, 20, 10)
    assert (start(15), start(3), start(99)) == (15, 10, 20)
    assert start_offset({"x-stream-offset": "last"}, (5, 5), lambda ms: 0) == 5


def test_timestamps_and_intervals_look_up_the_time():
    asked = []
    moment = datetime(2024, 5, 1, tzinfo=timezone.utc)
    start(moment, lambda ms: asked.append(ms) or 12)
    start(moment.replace(tzinfo=None), lambda ms: asked.append(ms) or 12)
    assert asked == [1_714_521_600_000] * 2
    before = now_ms()
    start("2h", lambda ms: asked.append(ms) or 12)
    assert before - 2 * 3_600_000 - 1000 <= asked[-1] <= now_ms() - 2 * 3_600_000


@pytest.mark.parametrize("spec", ["soon", "1w", "-1h", "0h", 1.5, True, {"a": 1}])
def test_other_values_are_406(spec):
    with pytest.raises(PreconditionFailed):
        start(spec)


def test_stream_consumers_need_manual_acks_and_a_prefetch():
    with pytest.raises(NotSupported):
        check_consumer("s", "/", True, 10)
    with pytest.raises(PreconditionFailed):
        check_consumer("s", "/", False, 0)
    check_consumer("s", "/", False, 1)
