"""Subject fan-out: messages reach bound named queues and live listeners by subject; named
queues are read by offset, popped by several consumers, and compacted state is kept."""
from __future__ import annotations

import pytest

from core.errors import InvalidArgument, TopicNotFound
from core.model import SUBJECT_PROPERTY, SYSTEM, OutgoingMessage, TopicConfig
from core.assembly import Core

from tests.unit.core.test_broker import SUBJECTS, run_core, topic


def subject(name: str, body: bytes, subject_: str) -> OutgoingMessage:
    return OutgoingMessage(name, body, properties={SUBJECT_PROPERTY: subject_})


class Recorder:
    """A live listener that keeps what it is handed."""

    def __init__(self) -> None:
        self.got: list[bytes] = []

    def deliver(self, delivery) -> None:
        self.got.append(delivery.body)


def test_bound_queues_and_listeners_get_matching_subjects_only(tmp_path):
    async def scenario(core: Core) -> None:
        broker = core.broker
        await topic(broker, "devices")
        listener = Recorder()
        core.queues.bind("devices/+/telemetry", "session-a")
        core.queues.add_listener("devices/#", listener)
        await broker.send(SYSTEM, [subject("devices", b"t1", "devices/d1/telemetry"),
                                   subject("devices", b"s1", "devices/d1/status"),
                                   OutgoingMessage("devices", b"plain")])
        messages, next_offset = core.queues.read("session-a", 0, 10)
        assert [m.body for m in messages] == [b"t1"] and next_offset == 1
        assert [m.queue_offset for m in messages] == [0]
        assert listener.got == [b"t1", b"s1", b"plain"]  # no subject: the topic name is the subject
        core.queues.remove_listener("devices/#", listener)
        core.queues.unbind("devices/+/telemetry", "session-a")
        await broker.send(SYSTEM, [subject("devices", b"t2", "devices/d2/telemetry")])
        assert core.queues.read("session-a", 1, 10)[0] == [] and listener.got[-1] == b"plain"
    run_core(tmp_path, scenario, store="file")


def test_wildcards_do_not_match_dollar_subjects(tmp_path):
    async def scenario(core: Core) -> None:
        broker = core.broker
        await topic(broker, "%24SYS", queues=1)
        listener = Recorder()
        core.queues.add_listener("#", listener)
        await broker.send(SYSTEM, [subject("%24SYS", b"x", "$SYS/uptime")])
        assert listener.got == []
    run_core(tmp_path, scenario)


def test_one_subject_stays_in_one_queue(tmp_path):
    async def scenario(core: Core) -> None:
        broker = core.broker
        await topic(broker, "devices", queues=4)
        results = await broker.send(SYSTEM, [subject("devices", b"%d" % i, f"devices/d{i % 3}/t")
                                             for i in range(30)])
        queues: dict[bytes, set[int]] = {}
        for message, result in zip(range(30), results):
            queues.setdefault(b"d%d" % (message % 3), set()).add(result.queue_id)
        assert all(len(used) == 1 for used in queues.values())
    run_core(tmp_path, scenario)


def test_acks_of_a_named_queue_move_its_position_and_survive_a_restart(tmp_path):
    async def first(core: Core) -> None:
        broker = core.broker
        await topic(broker, "jobs")
        core.queues.bind("jobs/#", "session-b")
        await broker.send(SYSTEM, [subject("jobs", b"%d" % i, "jobs/x") for i in range(4)])
        core.queues.ack("session-b", 0)
        core.queues.ack("session-b", 2)
        assert core.queues.position("session-b") == (1, frozenset({2}))

    async def second(core: Core) -> None:
        assert core.queues.position("session-b") == (1, frozenset({2}))
        messages, _ = core.queues.read("session-b", 1, 10)
        assert [m.body for m in messages] == [b"1", b"2", b"3"]
    run_core(tmp_path, first, store="file")
    run_core(tmp_path, second, store="file")


def test_a_popped_message_goes_to_one_consumer_until_released(tmp_path):
    async def scenario(core: Core) -> None:
        broker = core.broker
        await topic(broker, "work")
        core.queues.bind("work/#", "group-q")
        await broker.send(SYSTEM, [subject("work", b"%d" % i, "work/x") for i in range(3)])
        first = core.queues.pop("group-q", 2, 60_000)
        second = core.queues.pop("group-q", 2, 60_000)
        assert [m.body for m in first] == [b"0", b"1"] and [m.body for m in second] == [b"2"]
        core.queues.settle("group-q", first[0].queue_offset)
        core.queues.release("group-q", first[1].queue_offset)
        again = core.queues.pop("group-q", 5, 60_000)
        assert [m.body for m in again] == [b"1"]
        assert core.queues.next_redelivery_ms("group-q") is not None
    run_core(tmp_path, scenario)


@pytest.mark.parametrize("store", ["memory", "file"])
def test_compacted_state_keeps_the_newest_value_per_key(tmp_path, store):
    async def scenario(core: Core) -> None:
        await core.state.ensure_compacted("%SYS%state")
        await core.state.put("%SYS%state", "a", b"1")
        await core.state.put("%SYS%state", "b", b"1")
        await core.state.put("%SYS%state", "a", b"2")
        await core.state.put("%SYS%state", "b", b"")
        assert [(m.keys[0], m.body) for m in core.state.load("%SYS%state")] == [("a", b"2")]
    run_core(tmp_path, scenario, store=store)


def test_a_publish_creates_a_missing_topic(tmp_path):
    async def scenario(core: Core) -> None:
        broker = core.broker
        message = OutgoingMessage("sensors", b"21.5", properties={SUBJECT_PROPERTY: "sensors/t1"})
        with pytest.raises(TopicNotFound):
            await broker.send(SYSTEM, [message])
        [result] = await broker.send(SYSTEM, [message], create_topics=True)
        config = broker.get_topic("sensors")
        assert config.queue_count == broker.config.auto_topic_queues
        assert result.topic == "sensors"
    run_core(tmp_path, scenario)


def test_a_subject_outside_its_topic_is_refused_on_every_path(tmp_path):
    """A message's subject names its topic: one sent to another topic (or fanned out from a
    dead-letter copy) could otherwise reach subscribers of a topic it was never authorized for."""
    async def scenario(core: Core) -> None:
        broker = core.broker
        await broker.create_topic(SYSTEM, TopicConfig("a-1", 1))
        heard = Recorder()
        core.queues.add_listener("secret/#", heard)
        with pytest.raises(InvalidArgument, match="does not belong to topic 'a-1'"):
            await broker.send(SYSTEM, [OutgoingMessage(
                "a-1", b"x", properties={SUBJECT_PROPERTY: "secret/cmd"})])
        await broker.send(SYSTEM, [OutgoingMessage("a-1", b"ok", properties={SUBJECT_PROPERTY: "a-1/x"})])
        assert heard.got == []
    run_core(tmp_path, scenario)


def test_a_dead_lettered_copy_keeps_its_subject_only_as_a_record(tmp_path):
    async def scenario(core: Core) -> None:
        broker = core.broker
        from core.model import GroupConfig, RetryPolicy
        await broker.create_topic(SYSTEM, TopicConfig("devices", 1))
        await broker.create_group(SYSTEM, GroupConfig("g", retry=RetryPolicy(max_attempts=1)))
        heard = Recorder()
        core.queues.add_listener("devices/#", heard)
        await broker.send(SYSTEM, [subject("devices", b"m", "devices/d1/cmd")])
        [delivery] = await broker.receive(SYSTEM, "g", "devices", "c1", invisible_ms=100, wait_ms=5_000)
        await broker.forward_to_dead_letter(SYSTEM, "g", "devices", delivery.receipt_handle)
        dead = await broker.pull(SYSTEM, "dlq-reader", "%DLQ%g", 0, 0)
        [copy] = dead.messages
        assert SUBJECT_PROPERTY not in copy.properties
        assert copy.properties["sluice.dlq.origin_subject"] == "devices/d1/cmd"
        assert heard.got == [b"m"]  # the original only, not its dead-letter copy
    run_core(tmp_path, scenario)


def test_a_multi_level_wildcard_anywhere_needs_asking_for(tmp_path):
    async def scenario(core: Core) -> None:
        broker = core.broker
        await topic(broker, "plant")
        with pytest.raises(InvalidArgument, match="last level"):
            core.queues.bind("plant/#/alarm", "amqp-like")
        assert core.queues.bind("plant/#/alarm", "amqp-like", multi_anywhere=True)
        await broker.send(SYSTEM, [subject("plant", b"deep", "plant/3/boiler/alarm"),
                                   subject("plant", b"shallow", "plant/alarm"),
                                   subject("plant", b"other", "plant/3/status")])
        assert [m.body for m in core.queues.read("amqp-like", 0, 10)[0]] == [b"deep", b"shallow"]
    run_core(tmp_path, scenario)


def test_a_queue_both_routed_to_and_named_in_also_into_is_indexed_once(tmp_path):
    async def scenario(core: Core) -> None:
        broker = core.broker
        await topic(broker, "devices")
        core.queues.bind("devices/+/telemetry", "both")
        message = OutgoingMessage("devices", b"once", also_into=("both",),
                                  properties={SUBJECT_PROPERTY: "devices/d1/telemetry"})
        await broker.send_decided([message])
        assert [m.body for m in core.queues.read("both", 0, 10)[0]] == [b"once"]
        assert core.queues.bounds("both") == (0, 1)
    run_core(tmp_path, scenario, store="file")
