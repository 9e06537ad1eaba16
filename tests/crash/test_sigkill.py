"""SIGKILL durability: the store's durability contract, checked against a real killed process.

DESIGN.md, "Durability contract": under the ``sync`` flush policy anything acknowledged to a
producer survives SIGKILL of the process and is readable after restart; a torn tail is
truncated; nothing corrupt is delivered.

``crash_writer.py`` appends from several threads and prints ``ACK ...`` only after
``wait_durable``. The test kills it after a random number of acknowledgements, keeps every
complete line it printed before dying, reopens the store in this process and checks that every
message acknowledged in any round so far is there, byte for byte, in its queue, in the fan-out
queue and in the key index, and that the consume queues agree with the log in both directions.
No sleeps: the test waits on lines from the child (a watchdog kills a hung child).
"""
from __future__ import annotations

import importlib.util
import os
import random
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

import pytest

from store import record
from store.api import StoreConfig
from store.file_store import FileStore

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
WRITER = os.path.join(HERE, "crash_writer.py")

_spec = importlib.util.spec_from_file_location("sluice_crash_writer", WRITER)
crash_writer = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(crash_writer)

CONFIG = StoreConfig(**crash_writer.CONFIG_KWARGS)
ROUNDS = 32
SEED = int(os.environ.get("SLUICE_CRASH_SEED", "20240517"))
WATCHDOG_S = 60.0  # a child that stops printing for this long is killed and the test fails

pytestmark = pytest.mark.crash


@dataclass(frozen=True)
class Ack:
    index: int
    phys: int
    topic: str
    queue_id: int
    queue_offset: int


@dataclass
class Round:
    acks: list[Ack]
    target: int
    start: int


def run_writer(data_dir: str, seed: int, start: int, target: int, log_path: str) -> Round:
    """Run the writer until ``target`` ACK lines arrived, SIGKILL it, collect every complete line."""
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    with open(log_path, "wb") as stderr:
        proc = subprocess.Popen([sys.executable, WRITER, data_dir, str(seed), str(start)],
                                stdout=subprocess.PIPE, stderr=stderr, env=env, cwd=REPO)
    hung = threading.Event()

    def watchdog() -> None:
        hung.set()
        proc.kill()

    timer = threading.Timer(WATCHDOG_S, watchdog)
    timer.daemon = True
    timer.start()
    acks: list[Ack] = []
    killed = ready = False
    try:
        for line in proc.stdout:
            if not line.endswith(b"\n"):
                break  # torn last line: the child died while printing it; not acknowledged
            if line == b"READY\n":
                assert not ready and not acks, "READY printed twice or after an ACK"
                ready = True
            else:
                tag, index, phys, topic, queue_id, queue_offset = line.decode().split()
                assert tag == "ACK" and ready, f"unexpected line {line!r}"
                acks.append(Ack(int(index), int(phys), topic, int(queue_id), int(queue_offset)))
            if not killed and len(acks) >= target:
                os.kill(proc.pid, signal.SIGKILL)
                killed = True
        returncode = proc.wait()
    finally:
        timer.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
    with open(log_path, "rb") as file:
        stderr_text = file.read().decode(errors="replace")
    assert not hung.is_set(), f"writer hung (no line for {WATCHDOG_S}s); stderr:\n{stderr_text}"
    assert killed, (f"writer exited with {returncode} after {len(acks)} of {target} ACKs "
                    f"(ready={ready}); stderr:\n{stderr_text}")
    assert returncode == -signal.SIGKILL, f"writer ended with {returncode}; stderr:\n{stderr_text}"
    indices = [ack.index for ack in acks]
    assert len(set(indices)) == len(indices), "an index was acknowledged twice"
    assert all(start <= i < start + crash_writer.INDEX_SPAN for i in indices)
    return Round(acks, target, start)


def check_message(message: record.StoredMessage, index: int) -> None:
    """``message`` is exactly message ``index`` of the writer."""
    planned = crash_writer.plan(index)
    assert message.msg_id == planned.msg_id
    assert message.topic == planned.topic and message.queue_id == planned.queue_id, message
    assert message.keys == (planned.key,), message
    assert message.tag == planned.tag, message
    assert message.properties == (planned.properties or {}), message
    assert message.body == planned.body, f"body of {message} differs from message {index}"
    assert [(t, q) for t, q, _ in message.dispatch] == list(planned.extra_queues), message


def check_acknowledged(store: FileStore, acked: dict[int, Ack]) -> None:
    """Every acknowledged message is readable at its offset, in its queues and by id."""
    for index, ack in acked.items():
        message = store.read_at(ack.phys)
        assert message.phys_offset == ack.phys
        assert (message.topic, message.queue_id, message.queue_offset) == \
               (ack.topic, ack.queue_id, ack.queue_offset), f"{message} vs {ack}"
        check_message(message, index)
        in_queue = store.read(ack.topic, ack.queue_id, ack.queue_offset, max_count=1)
        assert [m.phys_offset for m in in_queue] == [ack.phys], f"queue entry of {ack}"
        assert in_queue[0].body == message.body
        for topic, queue_id, queue_offset in message.dispatch:
            copy = store.read(topic, queue_id, queue_offset, max_count=1)
            assert [m.phys_offset for m in copy] == [ack.phys], f"fan-out entry of {ack}"
        found = store.lookup_id(f"m{index}", [ack.topic])
        assert [m.phys_offset for m in found] == [ack.phys], f"lookup_id(m{index}) for {ack}"


def scan_log(store: FileStore) -> dict[int, record.StoredMessage]:
    """Every record of the commit log by offset; the segments must hold whole records only."""
    records: dict[int, record.StoredMessage] = {}
    segments = store.log.segments()
    for before, after in zip(segments, segments[1:]):
        assert before.end == after.base, f"gap between segments {before.name} and {after.name}"
    for segment in segments:
        data = os.pread(segment.fd, segment.size, 0)
        assert len(data) == segment.size
        pos = 0
        while pos < len(data):
            message = record.decode(data, pos, segment.base + pos, segment.name)
            records[message.phys_offset] = message
            pos += message.size
    return records


def check_queues_against_log(store: FileStore, records: dict[int, record.StoredMessage]) -> None:
    """Consume queues point at the right records, and every record is in its queues."""
    referenced: dict[tuple[str, int, int], int] = {}
    for topic, queue_id in store.queues():
        low, high = store.queue_range(topic, queue_id)
        assert low == 0 and 0 <= high
        seen: set[int] = set()
        offset = low
        while offset < high:
            batch = store.read(topic, queue_id, offset, max_count=256)
            assert batch, f"{topic}/{queue_id}: nothing readable at {offset} of [{low}, {high})"
            for message in batch:
                assert message.phys_offset in records, f"{topic}/{queue_id}@{offset} -> {message}"
                if topic == crash_writer.FANOUT_TOPIC:
                    assert (topic, queue_id, offset) in message.dispatch, f"{topic}/{queue_id}@{offset}"
                else:
                    assert (message.topic, message.queue_id, message.queue_offset) == \
                           (topic, queue_id, offset), f"{topic}/{queue_id}@{offset} -> {message}"
                assert message.phys_offset not in seen, \
                    f"{topic}/{queue_id}: two entries point at offset {message.phys_offset}"
                seen.add(message.phys_offset)
                referenced[(topic, queue_id, offset)] = message.phys_offset
                offset += 1
        assert store.read(topic, queue_id, high) == []
    for phys, message in records.items():
        targets = ((message.topic, message.queue_id, message.queue_offset), *message.dispatch)
        for target in targets:
            assert referenced.get(target) == phys, f"{message} is missing from queue entry {target}"
    homes = sum(1 for topic, _, _ in referenced if topic != crash_writer.FANOUT_TOPIC)
    assert homes == len(records), "home-queue entries and log records differ in number"


def verify(store: FileStore, acked: dict[int, Ack]) -> dict[int, record.StoredMessage]:
    assert store.recovery.corrupt_spans == [], store.recovery
    records = scan_log(store)
    ids = [message.msg_id for message in records.values()]
    assert len(set(ids)) == len(ids), "a message id is in the log twice"
    for message in records.values():  # acknowledged or not: whatever survived is intact
        check_message(message, int(message.msg_id[1:]))
    check_queues_against_log(store, records)
    check_acknowledged(store, acked)
    return records


def test_sigkill_rounds_keep_every_acknowledged_message(tmp_path):
    data_dir = str(tmp_path / "data")
    rng = random.Random(SEED)
    acked: dict[int, Ack] = {}
    began = time.monotonic()
    for number in range(ROUNDS):
        start = number * crash_writer.INDEX_SPAN
        target = rng.randint(1, 300)
        result = run_writer(data_dir, rng.randrange(1 << 30), start, target,
                            str(tmp_path / f"writer-{number}.stderr"))
        for ack in result.acks:
            assert ack.index not in acked
            acked[ack.index] = ack
        with FileStore(data_dir, CONFIG) as store:
            report = store.recovery
            records = verify(store, acked)
        print(f"round {number:2d}: target {target:3d}, acked {len(result.acks):4d} "
              f"(total {len(acked):5d}), log records {len(records):5d}, recovery: "
              f"clean={report.clean} scanned={report.scanned_bytes} replayed={report.replayed_records} "
              f"truncated={report.truncated_bytes}, {time.monotonic() - began:.1f}s")
    segments = os.listdir(os.path.join(data_dir, "commitlog"))
    print(f"{ROUNDS} rounds, {len(acked)} acknowledged messages, {len(segments)} segments, "
          f"seed {SEED}, {time.monotonic() - began:.1f}s")
    assert len(segments) > 1, "the commit log never rolled to a second segment"
    assert len(acked) > 1000, "the writer acknowledged too little for the test to mean much"


def _damage_tail(data_dir: str, end: int, rng: random.Random, with_garbage: bool, with_half: bool) -> int:
    """Leave what a crash mid-write leaves: garbage and/or the first half of a valid record
    after the last record (at commit-log offset ``end``) and no clean checkpoint; return the
    bytes of damage."""
    commitlog = os.path.join(data_dir, "commitlog")
    last = max(name for name in os.listdir(commitlog) if name.isdigit())
    garbage = rng.randbytes(rng.randint(1, 300)).rstrip(b"\0") + b"\x5a" if with_garbage else b""
    half = b""
    if with_half:
        p = crash_writer.plan(999_999_999)
        full = record.encode(end + len(garbage), p.queue_id, 10**6, 1, 1, p.topic.encode(),
                             p.msg_id.encode(), b"", record.encode_keys((p.key,)), b"", b"",
                             b"x" * 500)
        half = full[:len(full) // 2]
    damage = garbage + half
    with open(os.path.join(commitlog, last), "r+b") as file:
        file.seek(end - int(last))
        file.write(damage)
        file.flush()
        os.fsync(file.fileno())
    os.remove(os.path.join(data_dir, "checkpoint"))
    return len(damage)


@pytest.mark.parametrize("with_garbage,with_half", [(True, True), (False, True), (True, False)],
                         ids=["garbage+half-record", "half-record", "garbage"])
def test_torn_tail_is_truncated_and_appends_resume(tmp_path, with_garbage, with_half):
    data_dir = str(tmp_path / "data")
    rng = random.Random(f"{SEED}/torn/{with_garbage}/{with_half}")
    acked = {ack.index: ack for ack in
             run_writer(data_dir, rng.randrange(1 << 30), 0, 200, str(tmp_path / "writer.stderr")).acks}
    with FileStore(data_dir, CONFIG) as store:
        verify(store, acked)
        end = store.log.end_offset
    damage = _damage_tail(data_dir, end, rng, with_garbage, with_half)

    start = crash_writer.INDEX_SPAN
    with FileStore(data_dir, CONFIG) as store:
        assert store.recovery.truncated_bytes == damage, store.recovery
        records = verify(store, acked)
        assert max(m.phys_offset + m.size for m in records.values()) == store.log.end_offset
        for index in range(start, start + 40):  # appends after the repair
            p = crash_writer.plan(index)
            result = store.append(p.topic, p.body, queue_id=p.queue_id, tag=p.tag, keys=(p.key,),
                                  properties=p.properties, msg_id=p.msg_id,
                                  extra_queues=p.extra_queues)
            assert store.wait_durable(result.end_offset, timeout=30)
            acked[index] = Ack(index, result.phys_offset, result.topic, result.queue_id,
                               result.queue_offset)
            check_message(store.read_at(result.phys_offset), index)
        verify(store, acked)

    with FileStore(data_dir, CONFIG) as store:  # and they survive a clean restart
        assert store.recovery.clean and store.recovery.truncated_bytes == 0
        verify(store, acked)

    # and a kill after the repair
    more = run_writer(data_dir, rng.randrange(1 << 30), 2 * crash_writer.INDEX_SPAN, 50,
                      str(tmp_path / "writer-2.stderr"))
    acked.update((ack.index, ack) for ack in more.acks)
    with FileStore(data_dir, CONFIG) as store:
        verify(store, acked)
