"""A corrupt stored message surfaces as an error, never as an empty read: consumers of the client
API get CorruptMessage (INTERNAL_ERROR natively, a 500 from the admin API: see
tests/unit/test_error_tables.py) and the log a line; adapters' named queues skip it, logged, so
one bad record does not stall a session."""
from __future__ import annotations

import logging

import pytest

from core.assembly import Core
from core.errors import CorruptMessage
from core.model import SUBJECT_PROPERTY, SYSTEM, OutgoingMessage, TopicConfig
from store import FileStore, StoreConfig
from tests.unit.core.test_broker import run_core
from tests.unit.store.test_read_runs import flip_body_bit


def _sent_then_corrupted(tmp_path) -> None:
    """Topic ``orders`` (one queue) holds m0, m1, m2, also fanned out to named queue ``q``;
    the record of m1 is then corrupted on disk."""
    async def send(core: Core) -> None:
        await core.broker.create_topic(SYSTEM, TopicConfig("orders", queue_count=1))
        core.queues.bind("orders/#", "q")
        await core.broker.send(SYSTEM, [OutgoingMessage("orders", b"m%d" % i, properties={
            SUBJECT_PROPERTY: "orders/x"}) for i in range(3)])
    run_core(tmp_path, send, store="file")
    with FileStore(str(tmp_path / "store"), StoreConfig(segment_size=1 << 20)) as store:
        victim = store.read("orders", 0, 1, 1)[0]
    flip_body_bit(str(tmp_path / "store"), victim.phys_offset + victim.size - 5)


def test_pull_and_receive_report_a_corrupt_message_instead_of_nothing(tmp_path, caplog):
    _sent_then_corrupted(tmp_path)

    async def read(core: Core) -> None:
        broker = core.broker
        pulled = await broker.pull(SYSTEM, "g", "orders", 0, 0, max_messages=10)
        assert [m.body for m in pulled.messages] == [b"m0"] and pulled.next_offset == 1
        with pytest.raises(CorruptMessage) as corrupt:
            await broker.pull(SYSTEM, "g", "orders", 0, 1, max_messages=10)
        assert corrupt.value.offset == 1
        assert str(corrupt.value).startswith("the message at offset 1 of queue 0 of topic 'orders' "
                                             "is corrupt on disk (")
        assert "from offset 2" in str(corrupt.value)
        assert [m.body for m in (await broker.pull(SYSTEM, "g", "orders", 0, 2)).messages] == [b"m2"]
        [first] = await broker.receive(SYSTEM, "g", "orders", "c1", max_messages=10)
        assert first.body == b"m0"
        with pytest.raises(CorruptMessage):
            await broker.receive(SYSTEM, "g", "orders", "c1", max_messages=10)
    with caplog.at_level(logging.ERROR, logger="core.consume"):
        run_core(tmp_path, read, store="file")
    assert any("offset 1 of queue 0 of topic orders is corrupt" in r.getMessage()
               for r in caplog.records)


def test_a_named_queue_skips_a_corrupt_message_and_logs_it(tmp_path, caplog):
    _sent_then_corrupted(tmp_path)

    async def read(core: Core) -> None:
        messages, next_offset = core.queues.read("q", 0, 10)
        assert [m.body for m in messages] == [b"m0"] and next_offset == 1
        messages, _ = core.queues.read("q", 1, 10)
        assert [m.body for m in messages] == [b"m2"]
        core.queues.ack("q", 0)
        assert core.queues.position("q")[0] == 2, "the corrupt message counts as done"
        assert [m.body for m in core.queues.pop("q", 10, 60_000)] == [b"m0"]
        assert [m.body for m in core.queues.pop("q", 10, 60_000)] == [b"m2"]
    with caplog.at_level(logging.ERROR, logger="core.consume"):
        run_core(tmp_path, read, store="file")
    assert any("is corrupt" in r.getMessage() for r in caplog.records)

