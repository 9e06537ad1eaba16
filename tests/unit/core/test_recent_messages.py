"""The in-memory cache of recent messages: what consumers that keep up read instead of the store."""
from __future__ import annotations

from core.delivery import ENTRY_OVERHEAD, RecentMessages
from core.model import Delivery


def delivery(offset: int, body: bytes = b"x" * 100, queue: str = "devices") -> Delivery:
    return Delivery(queue, 0, offset, f"{offset:016X}", body, "", (), {}, 0, 0)


def test_small_messages_count_their_overhead_so_the_cache_holds_few_objects():
    recent = RecentMessages(budget_bytes=100 * (100 + ENTRY_OVERHEAD))
    for offset in range(1_000):
        recent.add(delivery(offset))
    held = recent.get("devices", 0, 0, 10_000) or recent.get("devices", 0, 900, 10_000)
    assert [d.queue_offset for d in held] == list(range(900, 1_000)), "the newest 100 are kept"
    assert recent.size == 100 * (100 + ENTRY_OVERHEAD)


def test_a_gap_in_a_queue_starts_it_afresh_and_forgetting_a_topic_frees_its_share():
    recent = RecentMessages(budget_bytes=1 << 20)
    for offset in range(10):
        recent.add(delivery(offset))
    recent.add(delivery(20))  # not the next offset: what was cached cannot be served in order
    assert recent.get("devices", 0, 5, 10) == [] and len(recent.get("devices", 0, 20, 10)) == 1
    recent.add(delivery(0, queue="other"))
    recent.forget_topic("devices")
    assert recent.size == 100 + ENTRY_OVERHEAD and recent.get("devices", 0, 20, 10) == []
