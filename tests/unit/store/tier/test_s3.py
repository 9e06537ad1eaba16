"""The tier reader against a real S3 service (SeaweedFS): the same records as the log, range
gets only, a StoreReader in another process finding the tier through tier.json with its keys
from the environment, and a clear error while the object store is down."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pytest

from store.api import StoreConfig
from store.errors import StoreError
from store.file_store import FileStore
from store.tier.objects import ACCESS_KEY_ENV, SECRET_KEY_ENV, ObjectStoreError, TierLocation, save_location
from store.tier.reader import TierReader

from .build import row_groups, segment_records, tier_segments
from .conftest import fill
from .test_reader import Counting


@pytest.fixture
def s3_tier(seaweedfs, tmp_path):
    """A filled store, its sealed segments tiered to a fresh prefix of the bucket, then deleted
    locally by retention; and what the log held."""
    location = TierLocation(f"s3://{seaweedfs.bucket}/read-{uuid.uuid4().hex[:8]}", seaweedfs.endpoint)
    objects = location.open(seaweedfs.access_key, seaweedfs.secret_key)
    store = FileStore(str(tmp_path / "data"), StoreConfig(segment_size=4096, retention_max_bytes=1))
    fill(store, 200)
    records = {m.phys_offset: m.encode() for s in store.log.segments()[:-1] for m in segment_records(store, s)}
    before = {queue: [m.encode() for m in store.read(*queue, 0, 10_000, 1 << 30)] for queue in store.queues()}
    with row_groups(8):
        manifest = tier_segments(store, objects, 1000)
    store.apply_retention()
    assert store.log.min_offset == manifest.tiered_end
    yield store, location, objects, records, before
    store.close()


def test_a_store_reads_its_deleted_history_from_s3_with_range_gets(s3_tier):
    store, _, objects, records, before = s3_tier
    counting = Counting(objects)
    store.tier = TierReader(counting, cache_bytes=32 << 10)
    store.tier.refresh()
    for queue, expected in before.items():
        assert store.queue_range(*queue)[0] == 0
        assert [m.encode() for m in store.read(*queue, 0, 10_000, 1 << 30)] == expected
    for offset, encoded in records.items():
        assert store.read_at(offset).encode() == encoded
    assert store.tier.cache_size <= 32 << 10
    assert counting.fetched and all(length <= 1 << 20 for _, _, length in counting.fetched)


def test_a_store_reader_in_another_process_finds_the_s3_tier(s3_tier, seaweedfs):
    store, location, _, _, before = s3_tier
    store.checkpoint()
    save_location(store.directory, location)
    script = """
import json, sys
from store.reader import StoreReader
reader = StoreReader(sys.argv[1])
print(json.dumps({f"{t}/{q}": [m.encode().hex() for m in reader.read(t, q, reader.queue_range(t, q)[0], 10_000, 1 << 30)]
                  for t, q in reader.queues()}))
"""
    environment = {**os.environ, ACCESS_KEY_ENV: seaweedfs.access_key, SECRET_KEY_ENV: seaweedfs.secret_key}
    done = subprocess.run([sys.executable, "-c", script, store.directory], env=environment,
                          capture_output=True, text=True, timeout=120, check=True)
    got = json.loads(done.stdout)
    assert got == {f"{t}/{q}": [m.hex() for m in expected] for (t, q), expected in before.items()}


def test_an_object_store_that_is_down_is_a_clear_store_error(s3_tier, seaweedfs_server, caplog):
    store, location, objects, records, _ = s3_tier
    store.tier = TierReader(objects, cache_bytes=0)
    store.tier.refresh()
    oldest = min(records)
    local = store.read("orders", 0, store.consume_queues.get("orders", 0, create=False).min_offset, 5)
    with seaweedfs_server.down():
        with pytest.raises(ObjectStoreError) as error:
            store.read_at(oldest)
        assert "object store" in str(error.value) and isinstance(error.value, StoreError)
        assert [m.encode() for m in store.read("orders", 0, local[0].queue_offset, 5)] == \
            [m.encode() for m in local]  # local reads do not depend on it
    assert store.read_at(oldest).encode() == records[oldest]
