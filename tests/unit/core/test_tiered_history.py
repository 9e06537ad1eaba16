"""Core over a file store whose old segments were tiered and then deleted by local retention:
pull by offset from the earliest, offset lookups, id and key lookups all reach the tiered
history through the store, with no change in what a consumer gets."""
from __future__ import annotations

import asyncio

from core.assembly import Core
from core.metadata import MetadataRepository
from core.model import SYSTEM, OutgoingMessage, TopicConfig
from core.settings import CoreConfig
from store import FileStore, StoreConfig
from store.tier.objects import LocalDirectory
from store.tier.reader import TierReader
from store.tier.tierer import Tierer
from tests.unit.core.test_broker import SUBJECTS

CONFIG = CoreConfig(recent_cache_bytes=0)  # every read goes to the store


def view(delivery) -> tuple:
    return (delivery.queue_id, delivery.queue_offset, delivery.msg_id, delivery.body, delivery.keys,
            dict(delivery.properties), delivery.store_ts)


async def everything(broker, queues: int) -> dict:
    """What a consumer reading by offset from the earliest sees, and what lookups answer."""
    out: dict = {"pulled": {}, "earliest": {}, "ids": {}, "keys": []}
    for queue in range(queues):
        offset = out["earliest"][queue] = broker.offset_at("orders", queue, "earliest")
        pulled = []
        while True:
            result = await broker.pull(SYSTEM, "reader", "orders", queue, offset, max_messages=7)
            if not result.messages:
                break
            pulled += [view(d) for d in result.messages]
            offset = result.next_offset
        out["pulled"][queue] = pulled
        out["at_time"] = [broker.offset_at("orders", queue, ts) for *_, ts in pulled[::9]]
    for n in range(0, 120, 11):
        out["ids"][n] = [view(d) for d in broker.lookup_messages(SYSTEM, f"id-{n}", "orders")]
    after = ""
    while True:
        page = broker.lookup_key(SYSTEM, "orders", "even", 5, after)
        out["keys"] += [view(d) for d in page.messages]
        if not page.next:
            return out
        after = page.next


def test_consumers_read_tiered_history_as_before_local_retention(tmp_path):
    async def main() -> None:
        store = FileStore(str(tmp_path / "store"), StoreConfig(segment_size=4096, retention_max_bytes=1))
        tierer = Tierer(store, LocalDirectory(str(tmp_path / "tier")))
        store.tier_floor = lambda: tierer.tiered_end  # as the broker sets it: nothing untiered goes
        metadata = MetadataRepository.for_data_dir(str(tmp_path))
        core = Core(store, metadata, str(tmp_path), CONFIG, subject_syntax=SUBJECTS)
        await core.start()
        try:
            broker = core.broker
            await broker.create_topic(SYSTEM, TopicConfig("orders", queue_count=2))
            await broker.send(SYSTEM, [OutgoingMessage(
                "orders", f"order {n}".encode() * 8, keys=["even"] if n % 2 == 0 else [], msg_id=f"id-{n}",
                properties={"n": str(n)}, queue_id=n % 2) for n in range(120)])
            before = await everything(broker, 2)
            assert all(earliest == 0 for earliest in before["earliest"].values())

            while await asyncio.to_thread(tierer.tier_once) is not None:
                pass
            store.tier = TierReader(tierer.objects)
            store.tier.set_manifest(tierer.manifest)
            await asyncio.to_thread(store.apply_retention)
            assert store.log.min_offset == tierer.tiered_end > 0
            assert store.consume_queues.get("orders", 0, create=False).min_offset > 0

            assert await everything(broker, 2) == before
        finally:
            await core.close()
            store.close()
            metadata.close()
    asyncio.run(main())
