"""The tierer copies sealed, durable, confirmed segments to object storage, retries a failed step
without leaving duplicates, gates local retention on what is tiered, applies tier retention,
stops when a newer leader writes the tier, and sweeps objects no manifest names."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pyarrow.dataset as ds
import pytest

from store.tier import layout
from store.tier.convert import PAUSE_AT_ENV, PAUSE_FILE_ENV, Worker
from store.tier.manifest import ManifestConflict, load_latest
from store.tier.objects import LocalDirectory, ObjectStoreError, TierLocation
from store.tier.tierer import Tierer, TierStatus
from tests.tier_support import SeaweedFS
from tests.waiting import wait_for

from .conftest import WAIT_S, FaultyDirectory, fill

ROOT = Path(__file__).resolve().parents[3]


def tier_all(tierer: Tierer) -> int:
    count = 0
    while tierer.tier_once() is not None:
        count += 1
    return count


def tiered_rows(objects: FaultyDirectory) -> list[dict]:
    """Every row of the tier's data files named by the newest manifest, topic from the path."""
    manifest = load_latest(objects)
    paths = [os.path.join(objects.root, f.key) for f in manifest.files]
    table = ds.dataset(paths, format="parquet", partitioning="hive",
                       partition_base_dir=os.path.join(objects.root, "data")).to_table()
    return sorted(table.select(["topic", "queue", "offset", "msg_id", "body", "log_offset"]).to_pylist(),
                  key=lambda row: row["log_offset"])


def logged(store, topic: str, queue: int = 0) -> list[tuple[int, str, bytes]]:
    return [(m.queue_offset, m.msg_id, m.body) for m in store.read(topic, queue, 0, 10_000, 1 << 30)]


def test_tiers_sealed_segments_oldest_first_never_the_active_one(file_store, objects) -> None:
    store = file_store()
    fill(store, "orders/eu%1", 100)
    segments = store.log.segments()
    assert len(segments) >= 4
    tierer = Tierer(store, objects)
    assert tierer.pending() == segments[:-1]
    assert tier_all(tierer) == len(segments) - 1
    assert tierer.manifest.tiered_end == segments[-1].base
    assert [s.base for s in tierer.manifest.segments] == [s.base for s in segments[:-1]]
    rows = tiered_rows(objects)
    assert {row["topic"] for row in rows} == {"orders/eu%1"}  # Hive's escaping, undone by pyarrow
    in_log = [entry for entry in logged(store, "orders/eu%1")
              if store.lookup_id(entry[1], ["orders/eu%1"])[0].phys_offset < segments[-1].base]
    assert [(row["offset"], row["msg_id"], row["body"]) for row in rows] == in_log
    status = tierer.status()
    assert (status.pending_segments, status.segments, status.tiered_end) == (0, len(segments) - 1,
                                                                            segments[-1].base)
    assert status.topics["orders/eu%1"].rows == len(rows) and status.last_error is None


def test_only_confirmed_segments_are_tiered(file_store, objects) -> None:
    store = file_store()
    fill(store, "t", 100)
    segments = store.log.segments()
    store.confirm(segments[1].end)  # a replicated store: the rest is not on every replica yet
    tierer = Tierer(store, objects)
    assert tierer.pending() == segments[:2]
    assert tier_all(tierer) == 2
    assert tierer.manifest.tiered_end == segments[1].end
    store.confirm(store.appended_end)
    assert tier_all(tierer) == len(segments) - 3


def test_a_failed_upload_is_retried_without_duplicates(file_store, objects) -> None:
    store = file_store()
    fill(store, "t", 60)
    tierer = Tierer(store, objects)
    objects.fail("put", layout.INDEX)  # data files written, then the index upload fails
    with pytest.raises(ObjectStoreError, match="injected"):
        tierer.tier_once()
    assert tierer.manifest is None and load_latest(objects) is None
    status = tierer.status()
    assert status.errors == 1 and "injected" in status.last_error and status.pending_segments >= 2
    objects.heal()
    objects.fail("put_if_absent", layout.MANIFEST)  # everything uploaded, the commit fails
    with pytest.raises(ObjectStoreError):
        tierer.tier_once()
    assert load_latest(objects) is None
    objects.heal()
    assert tier_all(tierer) == len(store.log.segments()) - 1
    keys = [info.key for info in objects.list(layout.DATA)]
    assert sorted(keys) == sorted(f.key for f in tierer.manifest.files)
    offsets = [row["log_offset"] for row in tiered_rows(objects)]
    assert len(offsets) == len(set(offsets)) and offsets == sorted(offsets)
    assert tierer.status().last_error is None


def test_orphans_below_the_tiered_end_are_swept(file_store, objects) -> None:
    store = file_store()
    fill(store, "t", 60)
    stray = layout.data_key("gone", "2020-01-01", 0)  # a crashed step's object no manifest names
    objects.put(stray, b"not parquet")
    ahead = layout.index_key(1 << 40)  # beyond the tiered end: a step in progress, kept
    objects.put(ahead, b"in progress")
    tierer = Tierer(store, objects)
    tier_all(tierer)
    keys = {info.key for info in objects.list("")}
    assert stray not in keys and ahead in keys
    assert {f.key for f in tierer.manifest.files} <= keys


def test_local_retention_never_deletes_what_is_not_tiered(file_store, objects) -> None:
    store = file_store(retention_max_bytes=4096)
    fill(store, "t", 100)
    segments = store.log.segments()
    tierer = Tierer(store, objects)
    store.tier_floor = lambda: tierer.tiered_end
    assert store.apply_retention().deleted_segments == []  # nothing tiered yet
    assert tierer.tier_once() is not None and tierer.tier_once() is not None
    report = store.apply_retention()
    assert report.deleted_segments == [s.name for s in segments[:2]]
    assert store.log_start == segments[2].base
    tier_all(tierer)
    assert len(store.apply_retention().deleted_segments) == len(segments) - 3


def test_manifests_beyond_the_newest_sixteen_are_deleted(file_store, objects) -> None:
    store = file_store()
    fill(store, "t", 500)
    tierer = Tierer(store, objects)
    count = tier_all(tierer)
    assert count > 16
    versions = [layout.manifest_version(info.key) for info in objects.list(layout.MANIFEST)]
    assert versions == list(range(count - 15, count + 1))


def test_tier_retention_drops_old_files_manifest_first(file_store, objects) -> None:
    store = file_store()
    fill(store, "short", 30)
    fill(store, "forever", 30)
    fill(store, "short", 30)
    tierer = Tierer(store, objects)
    tier_all(tierer)
    before = tierer.manifest
    short = [f for f in before.files if f.topic == "short"]
    newest = max(f.store_ts_max for f in before.files)
    day = 86_400_000
    assert tierer.apply_tier_retention(newest, lambda topic: day if topic == "short" else None) == []
    assert load_latest(objects) == before
    deleted = tierer.apply_tier_retention(newest + 2 * day, lambda topic: day if topic == "short" else None)
    after = load_latest(objects)
    assert after.version == before.version + 1 and after.tiered_end == before.tiered_end
    assert {f.topic for f in after.files} == {"forever"}
    assert set(deleted) >= {f.key for f in short}
    keys = {info.key for info in objects.list("")}
    assert not keys & set(deleted)
    for segment in after.segments:  # a segment left with no file loses its index too
        assert segment.files and segment.index_key in keys
    dropped_segments = {s.base for s in before.segments} - {s.base for s in after.segments}
    assert {layout.index_key(base) for base in dropped_segments} <= set(deleted)


def test_a_newer_epoch_fences_the_old_writer(file_store, objects) -> None:
    store = file_store()
    fill(store, "t", 100)
    old = Tierer(store, objects, epoch=lambda: 1)
    assert old.tier_once() is not None
    new = Tierer(store, objects, epoch=lambda: 2)
    assert new.tier_once() is not None  # takes over from the old leader's manifest
    assert new.manifest.version == 2 and new.manifest.epoch == 2
    keys = {info.key for info in objects.list("")}
    with pytest.raises(ManifestConflict, match="newer leader"):
        old.tier_once()
    assert old.status().fenced
    with pytest.raises(ManifestConflict):
        old.apply_tier_retention(1 << 62, lambda topic: 0)
    assert {info.key for info in objects.list("")} == keys  # the fenced writer deleted nothing
    assert load_latest(objects).version == 2
    with pytest.raises(ManifestConflict, match="newer leader"):
        old.tier_once()  # fenced for good, from what it learnt
    assert new.tier_once() is not None


@pytest.mark.parametrize("pause_at", ["upload", "manifest"])
def test_a_writer_killed_before_its_commit_is_repaired_by_the_next(tmp_path: Path, objects, pause_at: str) -> None:
    data = tmp_path / "killed"
    pause = tmp_path / "paused"
    script = f"""
import sys
from store import FileStore, StoreConfig, Message
from store.tier.objects import LocalDirectory
from store.tier.tierer import Tierer
store = FileStore({str(data)!r}, StoreConfig(segment_size=4096))
store.append_batch([Message("t", b"x" * 100) for _ in range(60)])
store.wait_durable(store.appended_end, 30)
Tierer(store, LocalDirectory({objects.root!r})).tier_once()
"""
    child = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT,
                             env={**os.environ, PAUSE_AT_ENV: pause_at, PAUSE_FILE_ENV: str(pause)})
    try:
        wait_for(pause.exists, f"the tierer to pause at {pause_at}", WAIT_S * 2)
    finally:
        child.kill()
        child.wait()
    assert objects.list(layout.DATA) and not objects.list(layout.MANIFEST)
    assert bool(objects.list(layout.INDEX)) == (pause_at == "manifest")
    from store import FileStore, StoreConfig
    with FileStore(str(data), StoreConfig(segment_size=4096)) as store:
        tierer = Tierer(store, objects)
        tier_all(tierer)
        assert tierer.manifest.version == len(store.log.segments()) - 1
        assert sorted(info.key for info in objects.list(layout.DATA)) == sorted(f.key for f in tierer.manifest.files)


def test_a_worker_process_tiers_the_same_files_as_the_tierers_own_thread(file_store, objects, tmp_path: Path) -> None:
    store = file_store()
    fill(store, "plain", 40)
    fill(store, "typed", 40)
    schemas = {"typed": '{"type": "object", "properties": {"n": {"type": "integer"}}}'}
    in_thread = Tierer(store, objects, body_schema=schemas.get)
    elsewhere = LocalDirectory(str(tmp_path / "worker-tier"))
    in_worker = Tierer(store, elsewhere, worker=Worker(TierLocation(f"file://{elsewhere.root}")),
                       body_schemas=lambda: schemas)
    try:
        assert tier_all(in_thread) == tier_all(in_worker) == len(store.log.segments()) - 1
    finally:
        in_worker.close()
    assert in_worker.manifest.files == in_thread.manifest.files
    assert any(f.body_schema for f in in_worker.manifest.files)
    for tiered in in_thread.manifest.files:
        assert elsewhere.get(tiered.key) == objects.get(tiered.key)
    assert in_worker.status().uploaded_bytes == in_thread.status().uploaded_bytes


def test_a_worker_paused_mid_step_exits_when_its_parent_is_killed(tmp_path: Path, objects) -> None:
    data, pause = tmp_path / "killed", tmp_path / "paused"
    script = f"""
from store import FileStore, StoreConfig, Message
from store.tier.convert import Worker
from store.tier.objects import LocalDirectory, TierLocation
from store.tier.tierer import Tierer
store = FileStore({str(data)!r}, StoreConfig(segment_size=4096))
store.append_batch([Message("t", b"x" * 100) for _ in range(60)])
store.wait_durable(store.appended_end, 30)
Tierer(store, LocalDirectory({objects.root!r}),
       worker=Worker(TierLocation("file://" + {objects.root!r}))).tier_once()
"""
    child = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT,
                             env={**os.environ, PAUSE_AT_ENV: "upload", PAUSE_FILE_ENV: str(pause)})
    try:
        wait_for(pause.exists, "the worker to pause at upload", WAIT_S * 2)
        workers = [pid for pid in running() if _proc_stat(pid)[1] == child.pid]
        assert workers, "the data object was written by a worker process"
    finally:
        child.kill()
        child.wait()
    assert objects.list(layout.DATA) and not objects.list(layout.MANIFEST)
    wait_for(lambda: not set(workers) & set(running()), "the orphaned worker to exit", WAIT_S * 2)


def running() -> list[int]:
    """The processes alive now (zombies left out)."""
    return [int(name) for name in os.listdir("/proc") if name.isdigit() and _proc_stat(int(name))[0] not in "ZX"]


def _proc_stat(pid: int) -> tuple[str, int]:
    """A process's state letter and parent pid ("X", 0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as file:
            fields = file.read().rsplit(")", 1)[1].split()
    except OSError:
        return "X", 0
    return fields[0], int(fields[1])


def test_object_store_down_keeps_segments_until_it_is_back(file_store, seaweedfs_server: SeaweedFS) -> None:
    info = seaweedfs_server.info
    objects = TierLocation(f"s3://{info.bucket}/tierer-{os.getpid()}-{id(file_store)}", info.endpoint).open(
        info.access_key, info.secret_key)
    store = file_store(retention_max_bytes=4096)
    fill(store, "t", 60)
    tierer = Tierer(store, objects)
    store.tier_floor = lambda: tierer.tiered_end
    with seaweedfs_server.down():
        with pytest.raises(ObjectStoreError, match="cannot reach"):
            tierer.tier_once()
        assert "cannot reach" in tierer.status().last_error
        assert store.apply_retention().deleted_segments == []
    assert tier_all(tierer) == len(store.log.segments()) - 1
    assert load_latest(objects) == tierer.manifest
    assert len(store.apply_retention().deleted_segments) == len(tierer.manifest.segments)


def test_a_commit_whose_answer_was_lost_counts_as_done(file_store, objects) -> None:
    store = file_store()
    fill(store, "t", 60)
    tierer = Tierer(store, objects)
    original = objects.put_if_absent

    def put_then_lose_the_answer(key: str, data: bytes) -> bool:
        original(key, data)  # stored; the writer's retry then finds the key taken
        return original(key, data)
    objects.put_if_absent = put_then_lose_the_answer
    assert tierer.tier_once() is not None
    assert tierer.manifest == load_latest(objects) and tierer.manifest.version == 1
    assert not tierer.status().fenced and tierer.status().last_error is None


def test_status_is_json(file_store, objects) -> None:
    store = file_store()
    fill(store, "t", 60)
    tierer = Tierer(store, objects)
    pending = tierer.status()
    assert pending.pending_segments == len(store.log.segments()) - 1 and pending.oldest_pending_age_ms >= 0
    tierer.tier_once()
    document = json.loads(json.dumps(asdict(tierer.status())))
    assert document["enabled"] and document["segments"] == 1 and document["topics"]["t"]["files"] == 1
    assert document["description"] == objects.description and document["last_success_ms"] > 0
    assert json.loads(json.dumps(asdict(TierStatus.disabled())))["enabled"] is False
