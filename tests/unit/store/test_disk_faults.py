"""A failing disk, injected at every store write site: appends fail fast with a clear error,
nothing unstored is acknowledged, the store resumes by itself once the fault is lifted, and a
reopen finds every acknowledged record with ``verify`` clean.

Faults come from ``store.faults`` (the file-operations layer every store write goes through):
short writes, ENOSPC, EMFILE and EIO at the commit log, consume queues and key index (the write
path: the store degrades), and at checkpoints, preallocation and compaction (background work:
logged and retried, appends unaffected).
"""
from __future__ import annotations

import errno
import logging
import os
import shutil
import threading
import time
from dataclasses import replace

import pytest

from store import checkpoint
from store.api import Message, StoreConfig
from store.errors import StoreDegradedError
from store.faults import Fault
from store.file_store import FileStore
from store.key_index import KeyIndex
from store.reader import StoreReader
from tests.conftest import fill_disk

WAIT = 60  # seconds: only guards against hanging
CONFIG = StoreConfig(segment_size=8192, queue_entries_per_file=16, index_slot_count=97,
                     index_max_entries=64, checkpoint_interval_ms=600_000)
"""Small files so that segments, queue files and index files roll within a few hundred records;
no periodic checkpoint, so queue entries reach their files on the flusher thread."""
BATCH = 8
LIMIT = 600  # records appended at most while waiting for a fault to fire

KINDS = {"short": None, "ENOSPC": errno.ENOSPC, "EMFILE": errno.EMFILE, "EIO": errno.EIO}


def message(i: int) -> Message:
    """Record ``i``: a pure function of ``i``; every third one is fanned out to queue fan/0."""
    return Message("t", f"body {i} ".encode() * (1 + i % 40), keys=(f"k{i}",), msg_id=f"m{i}",
                   extra_queues=(("fan", 0),) if i % 3 == 0 else ())


class Health:
    """Records what the store's health listener hears; lets a test await a change."""

    def __init__(self) -> None:
        self.reasons: list[str | None] = []
        self._changed = threading.Condition()

    def __call__(self, reason: str | None) -> None:
        with self._changed:
            self.reasons.append(reason)
            self._changed.notify_all()

    def wait_for(self, predicate, timeout: float = WAIT) -> None:
        with self._changed:
            assert self._changed.wait_for(lambda: predicate(self.reasons), timeout), self.reasons


def append_until_refused(store: FileStore, acked: dict, start: int,
                         limit: int = LIMIT) -> tuple[int, StoreDegradedError | None]:
    """Append batches from record ``start`` on, acknowledging each once durable, until the store
    refuses one or ``limit`` records went through; return the next index and the refusal."""
    i = start
    while i < start + limit:
        batch = list(range(i, i + BATCH))
        i += BATCH
        try:
            results = store.append_batch([message(n) for n in batch])
            assert store.wait_durable(results[-1].end_offset, timeout=WAIT)
        except StoreDegradedError as error:
            return i, error
        acked.update(zip(batch, results))
    return i, None


def check_acknowledged(directory: str, acked: dict) -> None:
    """Reopen ``directory``: every acknowledged record is there, in its queues and by id, byte
    for byte, and ``verify`` finds nothing wrong."""
    with FileStore(directory, CONFIG) as store:
        for i, result in acked.items():
            expected = message(i)
            stored = store.read_at(result.phys_offset)
            assert (stored.msg_id, stored.body) == (expected.msg_id, expected.body), i
            assert [m.phys_offset for m in store.read("t", 0, result.queue_offset, 1)] == [result.phys_offset]
            for topic, queue_id, offset in result.extra:
                assert [m.phys_offset for m in store.read(topic, queue_id, offset, 1)] == [result.phys_offset]
            assert [m.phys_offset for m in store.lookup_id(f"m{i}", ["t"])] == [result.phys_offset]
    reader = StoreReader(directory)
    try:
        assert reader.verify() == []
    finally:
        reader.close()


WRITE_PATH = [
    ("commitlog", "write", "short"), ("commitlog", "write", "ENOSPC"), ("commitlog", "open", "EMFILE"),
    ("commitlog", "write", "EIO"), ("commitlog", "sync", "EIO"),
    ("consumequeue", "write", "short"), ("consumequeue", "write", "ENOSPC"),
    ("consumequeue", "open", "EMFILE"), ("consumequeue", "write", "EIO"),
    ("consumequeue", "mkdir", "ENOSPC"),
    ("index", "allocate", "ENOSPC"), ("index", "open", "EMFILE"), ("index", "sync", "EIO"),
]


@pytest.mark.parametrize("site,op,kind", WRITE_PATH, ids=["-".join(case) for case in WRITE_PATH])
def test_a_fault_on_the_write_path_fails_appends_fast_and_the_store_resumes(tmp_path, faults, site, op, kind):
    directory = str(tmp_path / "data")
    acked: dict = {}
    with FileStore(directory, CONFIG) as store:
        health = Health()
        store.add_health_listener(health)
        following, refused = append_until_refused(store, acked, 0, 40)
        assert refused is None and len(acked) == 40  # no fault yet
        fault = faults.add(Fault(site, op, KINDS[kind], path="fan" if op == "mkdir" else ""))
        if op == "mkdir":
            store.append("t", b"to a new queue", extra_queues=(("fan", 1),))
        following, refused = append_until_refused(store, acked, following)
        assert fault.calls, f"nothing reached the {site} {op} site"
        if kind == "short":
            assert refused is None and store.degraded is None and health.reasons == []
        else:
            assert refused is not None, f"{kind} at the {site} {op} site never failed an append"
            assert errno.errorcode[refused.errno] == kind and kind in str(refused)
            assert store.degraded is not None and kind in store.degraded
            health.wait_for(lambda reasons: reasons and reasons[0] and kind in reasons[0])
            began = time.monotonic()
            with pytest.raises(StoreDegradedError, match="the store cannot write"):
                store.append("t", b"refused while degraded")
            assert time.monotonic() - began < 1, "a refusal must not wait for the disk"
            faults.lift()
            health.wait_for(lambda reasons: reasons[-1] is None)
            assert store.degraded is None
            following, refused = append_until_refused(store, acked, following, 80)
            assert refused is None, f"the store did not resume after the fault was lifted: {refused}"
    check_acknowledged(directory, acked)


def test_a_wait_already_blocked_fails_when_the_store_degrades(tmp_path, faults):
    """A producer waiting for durability hears of the failure at once, not after a timeout."""
    with FileStore(str(tmp_path / "data"), CONFIG) as store:
        gate = threading.Event()

        class Slow(Fault):
            def admit(self, op, path, size):
                gate.wait(WAIT)  # holds the flusher inside the write until the waiter waits
                return super().admit(op, path, size)

        faults.add(Slow("commitlog", "write", errno.ENOSPC))
        result = store.append("t", b"never durable")
        errors: list[BaseException] = []
        waiter = threading.Thread(target=lambda: _wait(store, result.end_offset, errors))
        waiter.start()
        gate.set()
        waiter.join(WAIT)
        assert not waiter.is_alive() and len(errors) == 1 and isinstance(errors[0], StoreDegradedError)
        assert store.durable_offset < result.end_offset, "an unwritten record was reported durable"
        faults.lift()


def _wait(store: FileStore, end: int, errors: list[BaseException]) -> None:
    try:
        store.wait_durable(end, timeout=WAIT)
    except BaseException as error:  # noqa: BLE001 - the test inspects it
        errors.append(error)


def test_closing_while_degraded_gives_up_instead_of_hanging(tmp_path, faults, caplog):
    directory = str(tmp_path / "data")
    acked: dict = {}
    store = FileStore(directory, CONFIG)
    append_until_refused(store, acked, 0)
    acked = dict(list(acked.items())[:40])
    faults.add(Fault("commitlog", "write", errno.EIO))
    with pytest.raises(StoreDegradedError):
        result = store.append("t", b"stuck")
        store.wait_durable(result.end_offset, timeout=WAIT)
    began = time.monotonic()
    with caplog.at_level(logging.ERROR):
        store.close()
    assert time.monotonic() - began < 10
    assert any("records not written are dropped" in r.getMessage() for r in caplog.records)
    faults.lift()
    check_acknowledged(directory, acked)


@pytest.mark.parametrize("kind,op", [("short", "write"), ("ENOSPC", "write"), ("EMFILE", "open"),
                                     ("EIO", "sync")])
def test_a_failed_checkpoint_leaves_the_old_one_and_no_temporary_file(tmp_path, faults, kind, op):
    directory = str(tmp_path / "data")
    path = os.path.join(directory, "checkpoint")
    with FileStore(directory, CONFIG) as store:
        acked: dict = {}
        following, _ = append_until_refused(store, acked, 0)
        store.checkpoint()
        before = checkpoint.load(path)
        faults.add(Fault("checkpoint", op, KINDS[kind]))
        following, refused = append_until_refused(store, acked, following)
        assert refused is None, "a checkpoint fault must not stop appends"
        if kind == "short":
            store.checkpoint()
            assert checkpoint.load(path).derived_end > before.derived_end
        else:
            with pytest.raises(OSError) as error:
                store.checkpoint()
            assert error.value.errno == KINDS[kind]
            assert checkpoint.load(path) == before
            assert not os.path.exists(path + ".tmp")
            faults.lift()
            store.checkpoint()
            assert checkpoint.load(path).derived_end == store.dispatcher.dispatched_end
    check_acknowledged(directory, acked)


def test_queue_files_whose_fsync_failed_are_synced_by_the_next_checkpoint(tmp_path, faults):
    """A checkpoint never claims derived data that was not fsynced: files it could not sync are
    due again at the next one."""
    directory = str(tmp_path / "data")
    with FileStore(directory, CONFIG) as store:
        append_until_refused(store, {}, 0)
        faults.add(Fault("consumequeue", "sync", errno.EIO))
        with pytest.raises(OSError):
            store.checkpoint()
        faults.lift()
        synced = faults.add(Fault("consumequeue", "sync"))  # no error: counts the fsyncs
        store.checkpoint()
        assert synced.calls >= 1, "the files whose fsync failed were forgotten"


@pytest.mark.parametrize("kind,op", [("short", "write"), ("ENOSPC", "write"), ("EMFILE", "open"),
                                     ("EIO", "sync")])
def test_preallocation_failures_remove_the_partial_file_and_are_retried(tmp_path, faults, kind, op, caplog):
    directory = str(tmp_path / "data")
    commitlog = os.path.join(directory, "commitlog")
    faults.add(Fault("preallocate", op, KINDS[kind]))
    acked: dict = {}
    eager = StoreConfig(**{**CONFIG.__dict__, "preallocate": "eager"})
    with caplog.at_level(logging.WARNING), FileStore(directory, eager) as store:
        following, refused = append_until_refused(store, acked, 0)
        assert refused is None and len(store.log.segments()) > 3, "appends must roll on without it"
        store.log.preallocator.wait_ready(WAIT)
        assert not os.path.exists(os.path.join(commitlog, "next.tmp"))
        warnings = [r for r in caplog.records if "could not prepare" in r.getMessage()]
        if kind == "short":
            assert warnings == [] and os.path.exists(os.path.join(commitlog, "next.prealloc"))
        else:
            assert len(warnings) == 1, "a failing preallocation is logged once per episode"
            assert not os.path.exists(os.path.join(commitlog, "next.prealloc"))
            faults.lift()
            following, refused = append_until_refused(store, acked, following)  # rolls retry it
            store.log.preallocator.wait_ready(WAIT)
            assert os.path.exists(os.path.join(commitlog, "next.prealloc"))
    check_acknowledged(directory, acked)


@pytest.mark.parametrize("kind", ["ENOSPC", "EIO"])
def test_a_failed_compaction_snapshot_leaves_no_temporary_file(tmp_path, faults, kind):
    with FileStore(str(tmp_path / "data"), CONFIG) as store:
        store.enable_compaction("c")
        for i in range(20):
            result = store.append("c", f"value {i}".encode(), keys=(f"key{i % 5}",))
        assert store.wait_visible(result.end_offset, timeout=WAIT)
        faults.add(Fault("compaction", "write", KINDS[kind]))
        with pytest.raises(OSError):
            store.compact("c")
        snapshot_dir = os.path.join(store.directory, "compacted", "c")
        assert [name for name in os.listdir(snapshot_dir) if name.endswith(".tmp")] == []
        faults.lift()
        assert store.compact("c") == 5


def test_a_store_that_cannot_be_created_leaves_nothing_locked(tmp_path, faults):
    directory = str(tmp_path / "data")
    faults.add(Fault("layout", "write", errno.ENOSPC))
    with pytest.raises(OSError) as error:
        FileStore(directory, CONFIG)
    assert error.value.errno == errno.ENOSPC and not os.path.exists(os.path.join(directory, "store.json.tmp"))
    faults.lift()
    with FileStore(directory, replace(CONFIG)) as store:
        store.wait_durable(store.append("t", b"fine").end_offset, timeout=WAIT)


def test_under_the_async_policy_a_failing_fsync_degrades_and_is_retried(tmp_path, faults):
    directory = str(tmp_path / "data")
    config = replace(CONFIG, flush="async", flush_interval_ms=10)
    with FileStore(directory, config) as store:
        health = Health()
        store.add_health_listener(health)
        first = store.append("t", b"durable")
        assert store.wait_durable(first.end_offset, timeout=WAIT)
        faults.add(Fault("commitlog", "sync", errno.EIO))
        stuck = store.append("t", b"written, not yet durable")
        with pytest.raises(StoreDegradedError, match="EIO"):
            store.wait_durable(stuck.end_offset, timeout=WAIT)
        assert store.durable_offset < stuck.end_offset
        with pytest.raises(StoreDegradedError):
            store.append("t", b"refused")
        faults.lift()
        health.wait_for(lambda reasons: reasons[-1] is None)
        assert store.wait_durable(stuck.end_offset, timeout=WAIT)
        assert [m.body for m in store.read("t", 0, 0, 10)] == [b"durable", b"written, not yet durable"]


def test_a_checkpoint_of_many_dirty_queue_files_syncs_them_with_one_call(tmp_path, faults):
    """With thousands of queues (one per persistent session), one fsync per queue file would
    make each checkpoint take minutes: past ``SYNC_FILES_ONE_BY_ONE`` dirty files it is one
    ``syncfs``, and if that fails every file is still due at the next checkpoint."""
    from store.file_store import SYNC_FILES_ONE_BY_ONE
    directory = str(tmp_path / "data")
    with FileStore(directory, CONFIG) as store:
        queues = SYNC_FILES_ONE_BY_ONE * 3
        appended = store.append_batch([Message(f"q{i}", b"x") for i in range(queues)])
        assert store.wait_durable(appended[-1].end_offset, WAIT)
        faults.add(Fault("consumequeue", "sync", errno.EIO))
        with pytest.raises(OSError):
            store.checkpoint()
        faults.lift()
        synced = faults.add(Fault("consumequeue", "sync"))  # no error: counts the calls
        store.checkpoint()
        assert synced.calls == 1, f"{synced.calls} sync calls for {queues} dirty queue files"
        synced.calls = 0
        [appended] = store.append_batch([Message("q0", b"y")])
        assert store.wait_durable(appended.end_offset, WAIT)
        store.checkpoint()
        assert synced.calls == 1, "a few dirty files are synced one by one"


def test_a_dispatch_writes_only_the_queues_it_touched(tmp_path, monkeypatch):
    """Queues with a few buffered entries wait for the checkpoint; a dispatch must not look at
    all of them again, or its cost grows with the number of queues (one per MQTT session)."""
    from store.consume_queue import ConsumeQueue
    directory = str(tmp_path / "data")
    with FileStore(directory, CONFIG) as store:
        appended = store.append_batch([Message(f"q{i}", b"x") for i in range(2_000)])
        assert store.wait_durable(appended[-1].end_offset, WAIT)
        looked_at = []
        write_pending = ConsumeQueue.write_pending
        monkeypatch.setattr(ConsumeQueue, "write_pending",
                            lambda queue, force: looked_at.append(queue.topic) or write_pending(queue, force))
        [appended] = store.append_batch([Message("q7", b"y")])
        assert store.wait_durable(appended.end_offset, WAIT)
        assert looked_at == ["q7"]


# -- opening on a disk that refuses writes -------------------------------------------------------

def lose_derived_data(directory: str) -> None:
    """What a crash leaves at worst: queue entries and keys not yet written, no checkpoint."""
    for derived in ("consumequeue", "index", "checkpoint"):
        path = os.path.join(directory, derived)
        shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)


START_UP = [  # (site, op, errno, what the crash or stop left)
    ("checkpoint", "write", "ENOSPC", "a clean stop"),
    ("checkpoint", "rename", "EIO", "a clean stop"),
    ("consumequeue", "write", "ENOSPC", "lost derived data"),
    ("consumequeue", "mkdir", "ENOSPC", "lost derived data"),
    ("index", "allocate", "ENOSPC", "lost derived data"),
    ("index", "open", "EMFILE", "lost derived data"),
]


@pytest.mark.parametrize("site,op,kind,left", START_UP, ids=["-".join(case[:3]) for case in START_UP])
def test_a_store_opened_on_a_disk_that_refuses_writes_serves_reads_and_resumes(
        tmp_path, faults, site, op, kind, left):
    """Every write opening makes (the checkpoint, queue entries and keys that recovery replays,
    a queue directory) is put off: the store opens degraded, serves every acknowledged record,
    refuses appends, and writes what it put off once the disk takes writes, without reopening."""
    directory = str(tmp_path / "data")
    acked: dict = {}
    with FileStore(directory, CONFIG) as store:
        following, refused = append_until_refused(store, acked, 0, 120)
        assert refused is None
    if left == "lost derived data":
        lose_derived_data(directory)
    fault = faults.add(Fault(site, op, KINDS[kind]))
    with FileStore(directory, CONFIG) as store:
        health = Health()
        store.add_health_listener(health)
        assert fault.failed, f"opening made no {site} {op}"
        assert store.degraded is not None and kind in store.degraded
        with pytest.raises(StoreDegradedError, match=kind):
            store.append("t", b"refused while degraded")
        for i, result in acked.items():  # from memory where the files could not be written
            assert [m.body for m in store.read("t", 0, result.queue_offset, 1)] == [message(i).body]
        faults.lift()
        health.wait_for(lambda reasons: reasons == [None])
        assert checkpoint.load(os.path.join(directory, "checkpoint")) is not None
        following, refused = append_until_refused(store, acked, following, 40)
        assert refused is None, f"the store did not resume: {refused}"
    check_acknowledged(directory, acked)


def test_keys_put_off_at_open_are_indexed_before_any_newer_one(tmp_path, faults):
    """Keys recovery could not index wait, in order; a checkpoint taken meanwhile does not claim
    them, so a crash before they are indexed replays them again."""
    directory = str(tmp_path / "data")
    acked: dict = {}
    with FileStore(directory, CONFIG) as store:
        following, _ = append_until_refused(store, acked, 0, 40)
    lose_derived_data(directory)
    faults.add(Fault("index", "allocate", errno.ENOSPC))
    with FileStore(directory, CONFIG) as store:
        first = min(result.phys_offset for result in acked.values())
        assert store.dispatcher.derived_end == first
        assert checkpoint.load(os.path.join(directory, "checkpoint")).derived_end == first
    with FileStore(directory, CONFIG) as store:  # "crashed" (closed while degraded): replayed again
        health = Health()
        store.add_health_listener(health)
        assert store.recovery.replayed_records == len(acked) and store.degraded is not None
        faults.lift()
        health.wait_for(lambda reasons: reasons == [None])
        assert store.wait_durable(store.append("t", b"next", msg_id="next").end_offset, WAIT)
        assert [m.msg_id for m in store.lookup_id("next", ["t"])] == ["next"]
    check_acknowledged(directory, acked)


@pytest.mark.parametrize("kind", ["EIO", "ENOSPC"])
def test_a_torn_tail_that_cannot_be_cut_is_overwritten(tmp_path, faults, kind, caplog):
    directory = str(tmp_path / "data")
    acked: dict = {}
    with FileStore(directory, CONFIG) as store:
        following, _ = append_until_refused(store, acked, 0, 40)
        end = store.log.end_offset
        segment = store.log.segments()[-1].path
    with open(segment, "r+b") as file:  # a crash in the middle of the next write
        file.seek(end - int(os.path.basename(segment)))
        file.write(b"\xff" * 300)
    os.remove(os.path.join(directory, "checkpoint"))
    faults.add(Fault("commitlog", "truncate", KINDS[kind]))
    with caplog.at_level(logging.WARNING), FileStore(directory, CONFIG) as store:
        assert store.recovery.truncated_bytes == 300 and store.log.end_offset == end
        assert any("could not cut a torn tail of 300 bytes" in r.getMessage() for r in caplog.records)
        faults.lift()
        following, refused = append_until_refused(store, acked, following, 40)
        assert refused is None
    check_acknowledged(directory, acked)


def test_a_reopened_key_index_adds_into_blocks_reserved_before_on_a_full_disk(mount_tmpfs):
    """Blocks are reserved a chunk ahead of the entries in use; after a restart on a full disk
    the index adds entries into them (reserving them again needs no space) instead of failing
    for want of the next chunk. A real small tmpfs: the fault layer cannot tell reserved blocks."""
    disk = mount_tmpfs("4m")
    directory = str(disk / "index")
    with KeyIndex(directory, slot_count=97, max_entries=100_000) as index:
        for offset in range(2000):  # the first add reserved a chunk ahead for the rest
            index.add(b"k%d" % offset, offset, 1)
    fill_disk(disk / "filler")
    with KeyIndex(directory, slot_count=97, max_entries=100_000) as index:
        for offset in range(2000, 3000):
            index.add(b"k%d" % offset, offset, 1)
        assert index.lookup(b"k2999") == [2999] and index.lookup(b"k0") == [0]


