"""Open descriptors stay bounded whatever the number of queues: consume-queue files go through
one LRU cache per store, and a data directory with thousands of queues opens and serves under a
low descriptor limit."""
from __future__ import annotations

import errno
import os
import resource
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from store.api import Message, StoreConfig
from store.descriptors import DescriptorCache
from store.faults import Fault
from store.file_store import FileStore
from store.reader import StoreReader

REPO = Path(__file__).resolve().parents[3]
QUEUES = 2000
CONFIG = StoreConfig(segment_size=1 << 20, queue_entries_per_file=1000, index_slot_count=1009,
                     index_max_entries=4096, checkpoint_interval_ms=600_000)
SLACK = 32  # descriptors besides queue files: segments, index mappings, the lock, transient ones


def open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def files(tmp_path: Path, count: int) -> list[str]:
    paths = [str(tmp_path / f"f{i}") for i in range(count)]
    for path in paths:
        Path(path).write_bytes(b"")
    return paths


def test_the_cache_keeps_at_most_its_capacity_open_least_recently_used_closed_first(tmp_path):
    cache = DescriptorCache(4, os.O_RDONLY, "test")
    paths = files(tmp_path, 6)
    before = open_descriptors()
    for path in paths[:4]:
        with cache.use(path):
            pass
    with cache.use(paths[0]):  # now the most recently used
        pass
    for path in paths[4:]:
        with cache.use(path):
            pass
    assert len(cache) == 4 and open_descriptors() == before + 4
    with cache.use(paths[0]) as fd:  # still open: no new descriptor
        assert open_descriptors() == before + 4 and os.fstat(fd)
    cache.close()
    assert open_descriptors() == before


def test_a_descriptor_in_use_is_never_closed_under_its_user(tmp_path):
    cache = DescriptorCache(1, os.O_RDONLY, "test")
    first, second = files(tmp_path, 2)
    Path(first).write_bytes(b"first")
    with cache.use(first) as fd:
        with cache.use(second):
            pass
        cache.forget(first)
        assert os.pread(fd, 5, 0) == b"first"
    cache.close()


def test_out_of_descriptors_closes_idle_ones_and_tries_once_more(tmp_path, faults):
    cache = DescriptorCache(8, os.O_RDONLY, "test")
    paths = files(tmp_path, 9)
    for path in paths[:8]:
        with cache.use(path):
            pass
    faults.add(Fault("test", "open", errno.EMFILE, times=1))
    with cache.use(paths[8]):
        assert len(cache) == 5, "half of the idle descriptors are closed, then the open is retried"
    faults.add(Fault("test", "open", errno.EMFILE))
    with pytest.raises(OSError) as error:
        with cache.use(paths[0]):
            pass
    assert error.value.errno == errno.EMFILE
    cache.close()


def fill_queues(directory: str) -> None:
    """One record in each of QUEUES queues, checkpointed (every queue file written)."""
    with FileStore(directory, CONFIG) as store:
        results = store.append_batch([Message(f"q{i}", f"first {i}".encode()) for i in range(QUEUES)])
        assert store.wait_durable(results[-1].end_offset, timeout=60)


def test_appends_to_thousands_of_queues_keep_descriptors_within_the_cache(tmp_path):
    before = open_descriptors()
    with FileStore(str(tmp_path / "data"), CONFIG) as store:
        results = store.append_batch([Message(f"q{i}", f"first {i}".encode()) for i in range(QUEUES)])
        assert store.wait_durable(results[-1].end_offset, timeout=60)
        store.checkpoint()  # writes every queue's entries to its file
        assert open_descriptors() <= before + CONFIG.max_open_queue_files + SLACK
        for i in range(QUEUES):
            assert [m.body for m in store.read(f"q{i}", 0, 0, 2)] == [f"first {i}".encode()]
        assert open_descriptors() <= before + CONFIG.max_open_queue_files + SLACK
    reader = StoreReader(str(tmp_path / "data"))
    try:
        assert open_descriptors() <= before + SLACK, "a reader opens queue files only as it reads them"
        for i in range(QUEUES):
            assert len(reader.read(f"q{i}", 0, 0, 2)) == 1
        assert open_descriptors() <= before + CONFIG.max_open_queue_files + SLACK
    finally:
        reader.close()
    assert open_descriptors() <= before + 2


UNDER_LIMIT = textwrap.dedent("""
    import sys
    from store.api import Message
    from store.file_store import FileStore
    from store.reader import StoreReader
    sys.path.insert(0, sys.argv[2])
    from test_descriptors import CONFIG, QUEUES

    directory = sys.argv[1]
    with FileStore(directory, CONFIG) as store:
        for i in range(QUEUES):
            assert [m.body for m in store.read(f"q{i}", 0, 0, 5)] == [f"first {i}".encode()], i
        results = store.append_batch([Message(f"q{i}", f"second {i}".encode()) for i in range(QUEUES)])
        assert store.wait_durable(results[-1].end_offset, timeout=60)
        store.checkpoint()
        assert store.degraded is None, store.degraded
    reader = StoreReader(directory)
    for i in range(QUEUES):
        assert [m.body for m in reader.read(f"q{i}", 0, 0, 5)] == [f"first {i}".encode(),
                                                                    f"second {i}".encode()], i
    assert reader.verify() == []
    reader.close()
    print("served", QUEUES, "queues")
""")


def test_a_data_dir_with_thousands_of_queues_opens_and_serves_under_a_low_descriptor_limit(tmp_path):
    directory = str(tmp_path / "data")
    fill_queues(directory)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = subprocess.run(
        [sys.executable, "-c", UNDER_LIMIT, directory, str(Path(__file__).parent)],
        capture_output=True, text=True, env=env, cwd=REPO, timeout=120,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256)))
    assert done.returncode == 0, done.stderr
    assert f"served {QUEUES} queues" in done.stdout


def test_a_roll_that_finds_no_descriptor_free_closes_idle_queue_files_and_goes_on(tmp_path, faults):
    """The queue-file cache may hold the last free descriptors when a new segment is opened:
    the flusher then closes idle queue files and retries, instead of failing until restart."""
    config = StoreConfig(segment_size=64 << 10, queue_entries_per_file=1000, index_slot_count=1009,
                         index_max_entries=4096, max_open_queue_files=64, checkpoint_interval_ms=600_000)
    with FileStore(str(tmp_path / "data"), config) as store:
        results = store.append_batch([Message(f"q{i}", b"x") for i in range(64)])
        assert store.wait_durable(results[-1].end_offset, timeout=60)
        store.checkpoint()
        cache = store.consume_queues.files
        assert len(cache) == 64

        class DescriptorLimit(Fault):
            """Opens fail with EMFILE while the cache holds more than 32 descriptors."""
            def admit(self, op, path, size):
                if len(cache) > 32:
                    return super().admit(op, path, size)
                return size

        faults.add(DescriptorLimit("commitlog", "open", errno.EMFILE))
        segments = len(store.log.segments())
        result = store.append("big", b"y" * (60 << 10))  # does not fit the current segment
        assert store.wait_durable(result.end_offset, timeout=60)
        assert len(store.log.segments()) == segments + 1 and len(cache) <= 32
