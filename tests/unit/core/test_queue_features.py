"""Queue arguments that change how messages reach consumers: checked as RabbitMQ checks them,
and a priority queue's levels (a message's priority above the max counts as the max), popped
highest first."""
from __future__ import annotations

import pytest

from core.errors import PreconditionFailed
from core.model import OutgoingMessage
from core.queue_features import QueueFeatures, check, features, levels, target
from tests.unit.amqp.fake_wire import run


def declare(arguments, durable=True, exclusive=False, auto_delete=False):
    check("q", "/", arguments, durable=durable, exclusive=exclusive, auto_delete=auto_delete)


@pytest.mark.parametrize("arguments,reason", [
    ({"x-max-priority": 256}, "{max_value_exceeded,256}"),
    ({"x-max-priority": -1}, "{value_negative,-1}"),
    ({"x-max-priority": "5"}, "{unacceptable_type,longstr}"),
    ({"x-max-priority": True}, "{unacceptable_type,bool}"),
    ({"x-single-active-consumer": "yes"}, "{unacceptable_type,longstr}"),
    ({"x-queue-type": "lazy"}, "unsupported queue type 'lazy'"),
    ({"x-queue-type": 1}, "{unacceptable_type,long}"),
    ({"x-single-active-consumer": b"yes"}, "{unacceptable_type,longstr}"),
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


def test_levels_are_popped_highest_first_and_empty_ones_are_passed_over(tmp_path):
    async def scenario(frontend, core):
        queues, top = core.queues, levels("n", 2)
        await core.broker.send_decided([OutgoingMessage("t", b"low", also_into=("n",)),
                                        OutgoingMessage("t", b"high", also_into=("n@p1",))])
        [first] = queues.pop_first(top, 1, 60_000)
        assert first.body == b"high"
        queues.release(first.topic, first.queue_offset)
        again = queues.pop_first(top, 5, 60_000)
        assert [(m.body, m.attempt) for m in again] == [(b"high", 2), (b"low", 1)]
        assert core.engine.cursors.get(("n@p2", "n@p2", 0)) is None, "no state for an empty level"
    run(tmp_path, scenario)
