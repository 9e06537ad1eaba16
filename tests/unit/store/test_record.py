"""The record format: both encoders agree, and decoding rejects anything altered."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from store import record
from store.api import Message, SharedProperties
from store.record_builder import PropertySections, RecordBuilder
from store.errors import CorruptRecordError


def build(messages):
    """Encode ``messages`` with a fresh builder into one buffer; return (bytes, results)."""
    builder, buf = RecordBuilder({}, set()), bytearray()

    def place(size):
        buf.extend(bytes(size))
        return len(buf) - size, buf, len(buf) - size

    requests, results = [], []
    builder.build_batch(place, messages, 1_700_000_000_000, requests, results)
    return bytes(buf), results


@settings(deadline=None)  # a shared machine may stall any example; this checks bytes, not speed
@given(st.lists(st.tuples(st.sampled_from(["t", "devices", "a/b"]), st.integers(0, 3), st.binary(max_size=300)),
                min_size=2, max_size=20))
def test_the_short_path_encodes_what_the_general_path_encodes(appends):
    messages = [Message(topic, body, queue_id) for topic, queue_id, body in appends]
    data, results = build(messages)  # the first message per topic goes the general way, the rest the short way
    for message, result in zip(messages, results):
        again = record.encode(result.phys_offset, result.queue_id, result.queue_offset, result.store_ts,
                              result.store_ts, message.topic.encode(), result.msg_id.encode(),
                              b"", b"", b"", b"", message.body)
        assert data[result.phys_offset:result.end_offset] == again


def test_decode_rejects_a_record_altered_anywhere():
    data, [result] = build([Message("t", b"payload", 2, tag="x", keys=["k"], properties={"p": "v"})])
    assert record.decode(data, 0, 0).body == b"payload"
    for position in range(len(data)):
        damaged = bytearray(data)
        damaged[position] ^= 0x01
        with pytest.raises(CorruptRecordError):
            record.decode(bytes(damaged), 0, 0)
    with pytest.raises(CorruptRecordError, match="claims offset"):
        record.decode(data, 0, 5)


_names = st.sampled_from(["subject", "mqtt.qos", "mqtt.client", "amqp.headers", "é"])
_values = st.one_of(st.text(max_size=40), st.sampled_from(["x" * 1100, "é" * 600]))  # lengths past the table


@settings(deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["t", "devices"]), st.dictionaries(_names, _values, max_size=4),
                          st.lists(st.tuples(st.sampled_from(["q1", "q2"]), st.integers(0, 2)), max_size=3,
                                   unique=True),
                          st.binary(max_size=300)),
                min_size=2, max_size=20))
def test_records_with_properties_and_fan_out_read_back_as_appended(appends):
    messages = [Message(topic, body, 0, properties=props or None, extra_queues=tuple(extra))
                for topic, props, extra, body in appends]
    data, results = build(messages)  # the first message per topic goes the general way, the rest the short way
    next_offsets: dict[tuple[str, int], int] = {}
    for message, result in zip(messages, results):
        stored = record.decode(data, result.phys_offset, result.phys_offset)
        assert (stored.topic, stored.body, stored.msg_id) == (message.topic, message.body, result.msg_id)
        assert stored.properties == (message.properties or {})
        assert list(stored.properties) == list(message.properties or {})
        targets = [(message.topic, 0), *message.extra_queues]
        assert stored.dispatch == result.extra == tuple(
            (q, i, next_offsets.get((q, i), 0)) for q, i in message.extra_queues)
        for target in targets:
            next_offsets[target] = next_offsets.get(target, 0) + 1


def test_a_properties_mapping_shared_by_many_messages_reads_back_with_each():
    shared = SharedProperties({"subject": "devices/7/telemetry", "mqtt.qos": "1"})
    messages = [Message("devices", f"reading {i}".encode(), 0, properties=shared) for i in range(5)]
    messages.append(Message("devices", b"other", 0, properties={"subject": "devices/8/telemetry"}))
    data, results = build(messages)
    for message, result in zip(messages, results):
        stored = record.decode(data, result.phys_offset, result.phys_offset)
        assert (stored.body, stored.properties) == (message.body, message.properties)


def test_property_sections_are_encoded_once_per_mapping_within_their_budget():
    sections = PropertySections(budget_bytes=5_000)
    shared = SharedProperties({"subject": "devices/7/telemetry"})
    assert sections.encode(shared) is sections.encode(shared) == record.encode_properties(shared)
    assert sections.encode(SharedProperties(shared)) is not sections.encode(shared), \
        "kept by identity, not equality"
    plain = {"subject": "devices/7/telemetry"}
    assert sections.encode(plain) == sections.encode(shared) and len(sections) == 2, "plain dicts are not kept"
    for i in range(200):
        sections.encode(SharedProperties({"subject": f"devices/{i}/telemetry"}))
    assert sections.size <= 5_000 and 0 < len(sections) < 200
    huge = SharedProperties({"subject": "x" * 10_000})
    assert sections.encode(huge) == record.encode_properties(huge) and sections.size <= 5_000
