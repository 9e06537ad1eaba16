"""Waiting for durability on the event loop when the store fails: producers hear of a full disk
as QuotaExceeded, deliveries of records written later still happen, and one failing callback
never leaves the other waiters unanswered."""
from __future__ import annotations

import asyncio
import errno
import logging

import pytest

from core.assembly import Core
from core.durable import BatchingAppender, DurableWaiters
from core.errors import QuotaExceeded
from core.metadata import MetadataRepository
from core.model import SYSTEM, OutgoingMessage, TopicConfig
from store import FileStore, StoreConfig
from store.api import Message
from store.faults import Fault
from tests.unit.core.test_broker import SUBJECTS

WAIT = 30
STORE = StoreConfig(segment_size=1 << 20, index_slot_count=97, index_max_entries=64)



def test_one_raising_callback_does_not_keep_the_other_waiters_unanswered(caplog):
    async def main() -> None:
        loop = asyncio.get_running_loop()
        waiters = DurableWaiters(loop, 0)
        ran: list[str] = []
        sent = loop.create_future()
        waiters.call_when_durable(10, lambda: ran.append("before"))
        waiters.call_when_durable(10, lambda: {}["a poison message"])
        waiters.resolve_when_durable(20, sent, "the sender's answer")
        waiters.call_when_durable(20, lambda: ran.append("after"))
        with caplog.at_level(logging.ERROR):
            waiters.advance(30, 30)
        assert ran == ["before", "after"]
        assert sent.done() and sent.result() == "the sender's answer"
        assert [r for r in caplog.records if "failed" in r.getMessage() and r.exc_info]
    asyncio.run(main())


def test_a_full_disk_fails_waiting_producers_and_keeps_publishing_what_is_written_later(tmp_path, faults):
    async def main() -> None:
        loop = asyncio.get_running_loop()
        store = FileStore(str(tmp_path / "store"), STORE)
        writable = asyncio.Event()
        waiters = DurableWaiters(loop, store.durable_offset, store.visible_offset)
        store.add_listener(waiters.listener)
        store.add_health_listener(waiters.health_listener)
        store.add_health_listener(lambda reason: reason is None and loop.call_soon_threadsafe(writable.set))
        published: list[bytes] = []
        stuck_published = asyncio.Event()

        def publish_when_durable(messages: list[Message], results) -> None:  # as Producer does
            def publish() -> None:
                published.extend(m.body for m in messages)
                if b"stuck" in published:
                    stuck_published.set()
            waiters.call_when_durable(results[-1].end_offset, publish)

        appender = BatchingAppender(store, waiters, on_batch=publish_when_durable)
        try:
            await appender.append(Message("t", b"first"))
            faults.add(Fault("commitlog", "write", errno.ENOSPC))
            with pytest.raises(QuotaExceeded, match="ENOSPC") as waited:
                await asyncio.wait_for(appender.append(Message("t", b"stuck")), WAIT)
            assert "free space" in str(waited.value)
            with pytest.raises(QuotaExceeded, match="nothing was stored"):
                await asyncio.wait_for(appender.append(Message("t", b"refused")), WAIT)
            assert published == [b"first"], "nothing unstored may be published"
            faults.lift()
            await asyncio.wait_for(stuck_published.wait(), WAIT)
            await asyncio.wait_for(writable.wait(), WAIT)
            assert published == [b"first", b"stuck"], "a record written later is delivered"
            await asyncio.wait_for(appender.append(Message("t", b"again")), WAIT)
            assert published[-1] == b"again"
        finally:
            store.close()
    asyncio.run(main())


def test_the_broker_answers_sends_with_quota_exceeded_while_the_disk_is_full(tmp_path, faults):
    async def main() -> None:
        store = FileStore(str(tmp_path / "store"), STORE)
        metadata = MetadataRepository.for_data_dir(str(tmp_path))
        core = Core(store, metadata, str(tmp_path), subject_syntax=SUBJECTS)
        await core.start()
        broker = core.broker
        loop, writable = asyncio.get_running_loop(), asyncio.Event()
        store.add_health_listener(lambda reason: reason is None and loop.call_soon_threadsafe(writable.set))
        try:
            await broker.create_topic(SYSTEM, TopicConfig("orders", queue_count=1))
            await broker.send(SYSTEM, [OutgoingMessage("orders", b"kept")])
            faults.add(Fault("commitlog", "sync", errno.EIO))
            for _ in range(3):  # the first fails once the flusher meets the fault, then at once
                with pytest.raises(QuotaExceeded, match="EIO"):
                    await asyncio.wait_for(broker.send(SYSTEM, [OutgoingMessage("orders", b"lost")]), WAIT)
            faults.lift()
            await asyncio.wait_for(writable.wait(), WAIT)
            await asyncio.wait_for(broker.send(SYSTEM, [OutgoingMessage("orders", b"after")]), WAIT)
            pulled = await broker.pull(SYSTEM, "g", "orders", 0, 0, max_messages=10)
            assert [m.body for m in pulled.messages] == [b"kept", b"lost", b"after"], \
                "the stuck record is delivered once written; the refused ones were never stored"
        finally:
            await core.close()
            store.close()
            metadata.close()
    asyncio.run(main())
