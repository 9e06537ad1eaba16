"""Queue arguments that change how messages reach consumers: checked as RabbitMQ checks them,
and a priority queue's levels (a message's priority above the max counts as the max)."""
from __future__ import annotations

import pytest

from core.errors import PreconditionFailed
from core.queue_features import QueueFeatures, check, features, levels, target


def declare(arguments, durable=True, exclusive=False, auto_delete=False):
    check("q", "/", arguments, durable=durable, exclusive=exclusive, auto_delete=auto_delete)


@pytest.mark.parametrize("arguments,reason", [
    ({"x-max-priority": 256}, "{max_value_exceeded,256}"),
    ({"x-max-priority": -1}, "{value_negative,-1}"),
    ({"x-max-priority": "5"}, "{unacceptable_type,longstr}"),
    ({"x-max-priority": True}, "{unacceptable_type,bool}"),
    ({"x-single-active-consumer": "yes"}, "{unacceptable_type,longstr}"),
    ({"x-queue-type": "lazy"}, "x-queue-type"),
])
def test_refused_arguments_name_the_reason(arguments, reason):
    with pytest.raises(PreconditionFailed) as refused:
        declare(arguments)
    assert reason in str(refused.value)


@pytest.mark.parametrize("flags,prop", [({"durable": False}, "non-durable"),
                                         ({"exclusive": True}, "exclusive-owner"),
                                         ({"auto_delete": True}, "auto-delete")])
def test_a_stream_must_be_durable_and_shared(flags, prop):
    with pytest.raises(PreconditionFailed) as refused:
        declare({"x-queue-type": "stream"}, **flags)
    assert f"invalid property '{prop}'" in str(refused.value)


def test_accepted_arguments_and_their_features():
    declare({"x-max-priority": 255, "x-single-active-consumer": True})
    declare({"x-queue-type": "stream"})
    assert features({"x-max-priority": 3, "x-single-active-consumer": True}) == \
        QueueFeatures(3, True, False)
    assert features({"x-queue-type": "stream"}).stream and features({}) == QueueFeatures()


def test_priority_levels_highest_first_and_the_level_of_a_message():
    assert levels("n", 0) == ("n",)
    assert levels("n", 2) == ("n@p2", "n@p1", "n")
    arguments = {"x-max-priority": 5}
    assert [target("n", arguments, p) for p in (None, 0, 3, 5, 9)] == \
        ["n", "n", "n@p3", "n@p5", "n@p5"]
    assert target("n", {}, 9) == "n", "without x-max-priority a priority changes nothing"
