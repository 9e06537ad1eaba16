"""The store contract: every test here runs against FileStore and MemoryStore alike."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from store.api import Message
WAIT = 120  # seconds: only guards against hanging; a busy disk may stall one fsync for long

from store.errors import InvalidCursorError, InvalidRecordError, OffsetOutOfRangeError, RecordTooLargeError


def visible(store, result):
    assert store.wait_visible(result.end_offset, timeout=WAIT)
    return result


def read_all(store, topic, queue_id=0):
    low, high = store.queue_range(topic, queue_id)
    return store.read(topic, queue_id, low, max_count=high - low + 1, max_bytes=1 << 40)


def test_append_then_read_returns_every_field(store):
    result = visible(store, store.append(
        "orders", b"\x00payload\xff", queue_id=3, tag="TagA", keys=["order-1", "customer-9"],
        properties={"z": "last", "a": "first", "unicode": "h\u00e9"}, msg_id="id-1", born_ts=1234))
    [message] = store.read("orders", 3, 0)
    assert (message.topic, message.queue_id, message.queue_offset) == ("orders", 3, 0)
    assert message.body == b"\x00payload\xff"
    assert message.tag == "TagA"
    assert message.keys == ("order-1", "customer-9")
    assert list(message.properties.items()) == [("z", "last"), ("a", "first"), ("unicode", "h\u00e9")]
    assert message.msg_id == "id-1"
    assert message.born_ts == 1234
    assert message.store_ts == result.store_ts
    assert message.phys_offset == result.phys_offset
    assert store.read_at(result.phys_offset).body == message.body


def test_queue_offsets_count_per_queue_from_zero(store):
    results = [store.append("t", b"%d" % i, queue_id=i % 3) for i in range(30)]
    visible(store, results[-1])
    for queue_id in range(3):
        assert store.queue_range("t", queue_id) == (0, 10)
        assert [m.body for m in read_all(store, "t", queue_id)] == [b"%d" % i for i in range(queue_id, 30, 3)]
    assert [r.queue_offset for r in results if r.queue_id == 1] == list(range(10))
    assert store.queues() == [("t", 0), ("t", 1), ("t", 2)]


def test_generated_message_ids_are_unique_and_found(store):
    results = [store.append("t", b"x") for _ in range(20)]
    visible(store, results[-1])
    assert len({r.msg_id for r in results}) == 20
    assert [m.phys_offset for m in store.lookup_id(results[7].msg_id, ["t"])] == [results[7].phys_offset]
    assert store.lookup_id(results[7].msg_id, ["other"]) == []


def test_batch_append_lands_contiguously_in_order(store):
    results = store.append_batch([Message("b", b"m%d" % i, tag="T") for i in range(50)])
    visible(store, results[-1])
    assert [r.queue_offset for r in results] == list(range(50))
    assert all(a.end_offset == b.phys_offset for a, b in zip(results, results[1:]))
    assert [m.body for m in read_all(store, "b")] == [b"m%d" % i for i in range(50)]


def test_fan_out_indexes_one_record_into_every_target_queue(store):
    store.append("session-a", b"earlier")
    result = visible(store, store.append("devices", b"reading", extra_queues=[("session-a", 0), ("session-b", 2)]))
    assert result.extra == (("session-a", 0, 1), ("session-b", 2, 0))
    copies = [store.read(topic, queue_id, offset)[0]
              for topic, queue_id, offset in [("devices", 0, 0), ("session-a", 0, 1), ("session-b", 2, 0)]]
    assert {m.phys_offset for m in copies} == {result.phys_offset}
    assert copies[0].dispatch == (("session-a", 0, 1), ("session-b", 2, 0))
    assert copies[0].topic == "devices"


def test_reads_respect_count_and_bytes_and_stop_at_the_end(store):
    results = [store.append("q", bytes(100)) for _ in range(10)]
    visible(store, results[-1])
    assert len(store.read("q", 0, 0, max_count=4)) == 4
    assert len(store.read("q", 0, 0, max_bytes=3 * results[0].size)) == 3
    assert len(store.read("q", 0, 0, max_bytes=1)) == 1, "one message is always returned"
    assert store.read("q", 0, 10) == []
    assert store.read("missing", 0, 0) == []
    with pytest.raises(OffsetOutOfRangeError):
        store.read("q", 0, 11)


def test_lookup_by_business_key_is_scoped_to_the_topic_and_newest_first(store):
    first = store.append("orders", b"v1", keys=["k"])
    store.append("other", b"x", keys=["k"])
    second = visible(store, store.append("orders", b"v2", keys=["unrelated", "k"]))
    assert [m.phys_offset for m in store.lookup_key("orders", "k")] == [second.phys_offset, first.phys_offset]
    assert [m.body for m in store.lookup_key("other", "k")] == [b"x"]
    assert store.lookup_key("orders", "absent") == []
    assert store.lookup_id("absent", ["orders"]) == []


def test_offset_for_time_finds_the_first_record_stored_at_or_after(store):
    results = [store.append("t", b"x") for _ in range(5)]
    visible(store, results[-1])
    assert store.offset_for_time("t", 0, 0) == 0
    assert store.offset_for_time("t", 0, results[-1].store_ts + 1) == 5
    assert store.offset_for_time("t", 0, results[2].store_ts) <= 2


def test_compacted_topic_keeps_the_newest_value_per_key(store):
    store.enable_compaction("retained")
    store.append("retained", b"a1", keys=["a"])
    store.append("retained", b"b1", keys=["b"])
    store.append("retained", b"a2", keys=["a"])
    store.append("retained", b"c1", keys=["c"])
    visible(store, store.append("retained", b"", keys=["b"]))  # tombstone
    assert store.compact("retained") == 2
    assert [(m.keys[0], m.body) for m in store.compacted("retained")] == [("a", b"a2"), ("c", b"c1")]
    visible(store, store.append("retained", b"c2", keys=["c"]))
    assert [(m.keys[0], m.body) for m in store.compacted("retained")] == [("a", b"a2"), ("c", b"c2")]
    with pytest.raises(InvalidRecordError):
        store.append("retained", b"no key")


def test_a_fanned_out_queue_can_be_compacted(store):
    """Records indexed into a compacted named queue keep their home queue's offsets; the
    compacted view of the named queue still sees each once (MQTT retained messages)."""
    store.enable_compaction("%retained")
    for topic, body in (("a", b"a1"), ("b", b"b1"), ("a", b"a2"), ("b", b"")):
        last = store.append(topic, body, keys=[f"{topic}/x"], extra_queues=[("%retained", 0)])
    store.append("a", b"not retained")
    visible(store, last)
    assert [(m.keys[0], m.body) for m in store.compacted("%retained")] == [("a/x", b"a2")]
    assert store.compact("%retained") == 1
    assert [(m.keys[0], m.body) for m in store.compacted("%retained")] == [("a/x", b"a2")]


def test_retention_by_size_deletes_whole_oldest_segments(open_store):
    store = open_store(retention_max_bytes=20_000)
    store.enable_compaction("state")
    visible(store, store.append("state", b"kept", keys=["device-1"]))
    results = [store.append("bulk", bytes(900), queue_id=i % 2) for i in range(60)]
    visible(store, results[-1])
    report = store.apply_retention()
    assert report.deleted_segments and report.log_min_offset > 0
    low, high = store.queue_range("bulk", 0)
    assert 0 < low < high == 30
    assert read_all(store, "bulk", 0)[0].queue_offset == low
    assert all(m.phys_offset >= report.log_min_offset for m in read_all(store, "bulk", 0))
    with pytest.raises(OffsetOutOfRangeError) as error:
        store.read("bulk", 0, 0)
    assert error.value.min_offset == low
    assert [m.body for m in store.compacted("state")] == [b"kept"], "compacted state outlives its segment"
    assert store.lookup_id(results[0].msg_id, ["bulk"]) == []


def test_retention_by_age_spares_recent_segments(open_store):
    store = open_store(retention_max_age_ms=60_000)
    results = [store.append("t", bytes(900)) for _ in range(30)]
    visible(store, results[-1])
    assert store.apply_retention().deleted_segments == []
    report = store.apply_retention(now_ms=results[-1].store_ts + 120_000)
    assert report.deleted_segments, "old segments go"
    assert store.queue_range("t", 0)[1] == 30, "the active segment stays"


def test_durability_is_reported_to_waiters_and_listeners(store):
    seen = []
    store.add_listener(lambda visible_end, durable_end: seen.append(durable_end))
    result = store.append("t", b"x")
    assert store.wait_durable(result.end_offset, timeout=WAIT)
    assert store.durable_offset >= result.end_offset
    assert store.wait_visible(result.end_offset, timeout=WAIT)
    assert any(end >= result.end_offset for end in seen)


def test_invalid_appends_are_refused_with_a_clear_error(store):
    with pytest.raises(RecordTooLargeError, match="segment size"):
        store.append("t", bytes(10_000))
    with pytest.raises(InvalidRecordError):
        store.append("", b"x")
    with pytest.raises(InvalidRecordError):
        store.append("t", b"x", keys=["k" * 70_000])
    for bad in ({"queue_id": -1}, {"queue_id": 1 << 32}, {"born_ts": 1 << 63}, {"born_ts": -5}):
        with pytest.raises(InvalidRecordError):
            store.append("t", b"x", **bad)
    visible(store, store.append("t", b"still works"))
    assert [m.body for m in read_all(store, "t")] == [b"still works"]


appends = st.lists(st.tuples(st.sampled_from(["a", "b/c", "d e"]), st.integers(0, 2),
                             st.binary(max_size=600), st.sampled_from(["", "TagA"])),
                   min_size=1, max_size=60)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch=appends)
def test_any_sequence_of_appends_reads_back_per_queue_in_order(open_store, batch):
    with open_store() as store:
        check_round_trip(store, batch)


def check_round_trip(store, batch):
    model: dict[tuple[str, int], list[bytes]] = {}
    for topic, queue_id, body, tag in batch:
        model.setdefault((topic, queue_id), []).append(body)
    start = {key: store.queue_range(*key)[1] for key in model}
    results = store.append_batch([Message(t, b, q, tag) for t, q, b, tag in batch])
    visible(store, results[-1])
    for (topic, queue_id), bodies in model.items():
        got = store.read(topic, queue_id, start[(topic, queue_id)], max_count=1000, max_bytes=1 << 30)
        assert [m.body for m in got] == bodies


def test_a_producer_id_shaped_like_a_generated_one_finds_both_messages(store):
    store.append("t", b"first")
    visible(store, store.append("t", b"second", msg_id="0000000000000000"))
    assert [m.body for m in store.lookup_id("0000000000000000", ["t"])] == [b"second", b"first"]


def test_lookup_by_id_is_scoped_to_the_topics_asked_and_finds_every_copy(store):
    mine = store.append("mine", b"mine", msg_id="order-7")
    theirs = [store.append("theirs", b"theirs", msg_id="order-7") for _ in range(40)]
    visible(store, theirs[-1])
    assert [m.phys_offset for m in store.lookup_id("order-7", ["mine"])] == [mine.phys_offset]
    both = store.lookup_id("order-7", ["mine", "theirs"], limit=2)
    assert [m.topic for m in both] == ["theirs", "theirs", "mine"]
    assert len(store.lookup_id("order-7", ["theirs"], limit=100)) == 40
    assert store.lookup_id("order-7", []) == [] and store.lookup_id("order-7", ["nobody"]) == []


def test_lookup_by_key_pages_newest_first(store):
    results = [store.append("orders", b"%d" % i, keys=["k", "k"] if i % 2 else ["k"]) for i in range(7)]
    store.append("orders", b"other", keys=["k2"])
    visible(store, store.append("other", b"x", keys=["k"]))
    pages, after = [], None
    while True:
        page = store.lookup_key_page("orders", "k", 3, after)
        pages.append([m.body for m in page.messages])
        if page.next is None:
            break
        assert page.next.offset == page.messages[-1].phys_offset
        after = page.next
    assert pages == [[b"6", b"5", b"4"], [b"3", b"2", b"1"], [b"0"]]
    assert store.lookup_key_page("orders", "k", 7).next is None
    assert [m.phys_offset for m in store.lookup_key_page("orders", "k", 7).messages] == \
        [r.phys_offset for r in reversed(results)]
    first = store.lookup_key_page("orders", "k", 1).next
    for forged in (first._replace(entry=first.entry + 9), first._replace(offset=first.offset + 1)):
        with pytest.raises(InvalidCursorError):
            store.lookup_key_page("orders", "k", 3, forged)
    with pytest.raises(InvalidCursorError):
        store.lookup_key_page("orders", "k2", 3, first)


def test_a_refused_message_in_a_batch_keeps_those_before_it(store):
    batch = [Message("t", b"one"), Message("t", b"two", keys=["k" * 70_000]), Message("t", b"three")]
    with pytest.raises(InvalidRecordError) as error:
        store.append_batch(batch)
    assert [r.queue_offset for r in error.value.appended] == [0]
    visible(store, store.append("t", b"after"))
    assert [m.body for m in read_all(store, "t")] == [b"one", b"after"]
