"""A file store with varied records over several small segments, and tiers of it."""
from __future__ import annotations

import pytest

from store.api import Message, StoreConfig
from store.file_store import FileStore

from sluice.client.packing import pack_bodies as packed


def fill(store: FileStore, count: int = 300) -> None:
    """Records of two topics: keys, tags, properties, fan-out to another topic, packed batches."""
    for n in range(count):
        if n % 50 == 13:  # an empty batch, and a body that only claims to be one: kept whole
            last = store.append("orders", packed([]), queue_id=1, properties={"sluice.batch": "0"})
            last = store.append("orders", b"SB\x01junk", queue_id=1, properties={"sluice.batch": "3"})
        elif n % 10 == 3:
            bodies = [f"b{n}-{i}".encode() * (i + 1) for i in range(n % 7 + 1)]
            last = store.append("orders", packed(bodies), queue_id=n % 2, properties={"sluice.batch": str(len(bodies))},
                         keys=[f"k{n % 5}"])
        elif n % 10 == 5:
            last = store.append("audit", f"a{n}".encode(), tag="t", msg_id=f"id-{n}", extra_queues=[("orders-copy", 0)])
        else:
            last = store.append("orders", f"order {n}".encode() * (n % 4 + 1), queue_id=n % 2, tag="x" if n % 3 else "",
                         keys=[f"k{n % 5}", "all"], properties={"sluice.subject": f"orders/{n}", "z": "1", "a": ""},
                         msg_id=f"id-{n}", born_ts=1_700_000_000_000 + n,
                         extra_queues=[("orders-copy", 0), ("orders-copy", 1)] if n % 4 == 0 else ())
    assert store.wait_visible(last.end_offset, timeout=60) and store.wait_durable(last.end_offset, timeout=60)


@pytest.fixture
def filled(tmp_path):
    store = FileStore(str(tmp_path / "data"), StoreConfig(segment_size=4096, checkpoint_interval_ms=50))
    fill(store)
    yield store
    store.close()
