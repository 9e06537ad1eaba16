"""Crash-test writer: appends to a FileStore forever and reports every acknowledged message.

    python tests/crash/crash_writer.py DATA_DIR SEED START_INDEX [FAULTS]

Opens ``FileStore(DATA_DIR, CONFIG)`` (``sync`` flush, small segments, queue and index files so
that rolls happen often), prints ``READY``, then appends from several threads until it is
killed. Message ``i`` (numbered from START_INDEX, taken from one shared counter) is fully
determined by ``i`` alone (see ``plan``), so the checking process can regenerate it. A thread
appends either one message or a batch of 2-5 (``append_batch``), waits until the store says the
last one is durable and only then prints, for each message of the batch, one line

    ACK <i> <phys_offset> <topic> <queue_id> <queue_offset>

Lines are written under one lock and flushed at once, so they never interleave; a line that is
printed has been acknowledged. SEED only drives the threads' choices (batch or single, batch
size), never the content of a message. A thread stops at START_INDEX + INDEX_SPAN so one run
never uses indices of the next one.

FAULTS (JSON, a list of ``store.faults.Fault`` fields) makes store file operations fail as a
failing disk does, once the store is open. The store then turns degraded: the writer prints ``DEGRADED <reason>``, and
``FAIL <i>`` for the first message of each refused append (not acknowledged, never retried),
and its threads wait until the store writes again (``RESUMED``). A line ``LIFT`` on stdin
removes the faults. A real full disk (a small tmpfs) behaves the same without FAULTS.
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import sys
import threading
import traceback
from typing import NamedTuple

CONFIG_KWARGS = dict(flush="sync", segment_size=64 << 10, queue_entries_per_file=64,
                     index_slot_count=1009, index_max_entries=512, checkpoint_interval_ms=20)
WRITER_THREADS = 4
INDEX_SPAN = 1_000_000
FANOUT_TOPIC = "fanout"
MAX_BODY = 65_000  # a record of this body still fits one 64 KiB segment (header and names < 536 B)


class Planned(NamedTuple):
    """Everything an append of message ``i`` carries."""

    topic: str
    queue_id: int
    key: str
    msg_id: str
    tag: str
    properties: dict[str, str] | None
    body: bytes
    extra_queues: tuple[tuple[str, int], ...]


def plan(i: int) -> Planned:
    """Message ``i``, a pure function of ``i``."""
    rng = random.Random(i)
    roll = rng.random()
    if roll < 0.02:
        size = rng.randint(30_000, MAX_BODY)  # close to a segment: forces a roll every time
    elif roll < 0.05:
        size = 0
    else:
        size = rng.randint(1, 6000)
    fanout = rng.random() < 0.3
    digest = hashlib.blake2b(str(i).encode()).digest()
    body = (digest * (size // len(digest) + 1))[:size]
    return Planned(
        topic=f"t{i % 3}",
        queue_id=i % 4,
        key=f"k{i}",
        msg_id=f"m{i}",
        tag=f"tag{i % 5}" if i % 2 else "",
        properties={"i": str(i), "kind": "crash"} if i % 7 == 0 else None,
        body=body,
        extra_queues=((FANOUT_TOPIC, i % 2),) if fanout else (),
    )


def _message(i: int):
    from store.api import Message

    p = plan(i)
    return Message(topic=p.topic, body=p.body, queue_id=p.queue_id, tag=p.tag, keys=(p.key,),
                   properties=p.properties, msg_id=p.msg_id, extra_queues=p.extra_queues)


def install_faults(spec: str):
    """Serve store file operations from a FaultyFileOps with the faults of ``spec``; a ``LIFT``
    line on stdin removes them."""
    from store import fileops
    from store.faults import Fault, FaultyFileOps

    ops = FaultyFileOps(*(Fault(**fields) for fields in json.loads(spec)))
    fileops.install(ops)

    def lift_on_request() -> None:
        for line in sys.stdin:
            if line.strip() == "LIFT":
                ops.lift()

    threading.Thread(target=lift_on_request, name="crash-writer-lift", daemon=True).start()


def main(argv: list[str]) -> int:
    from store.api import StoreConfig
    from store.errors import StoreDegradedError
    from store.file_store import FileStore

    data_dir, seed, start = argv[1], int(argv[2]), int(argv[3])
    store = FileStore(data_dir, StoreConfig(**CONFIG_KWARGS))
    if len(argv) > 4:
        install_faults(argv[4])  # once open: the faults hit the store at work
    out = sys.stdout.buffer
    out_lock = threading.Lock()
    health = threading.Condition()

    def report_health(reason: str | None) -> None:
        with health:
            line = b"RESUMED\n" if reason is None else f"DEGRADED {reason}\n".encode()
            with out_lock:
                out.write(line)
                out.flush()
            health.notify_all()

    store.add_health_listener(report_health)
    counter_lock = threading.Lock()
    next_index = [start]
    limit = start + INDEX_SPAN

    def take(count: int) -> list[int]:
        with counter_lock:
            first = next_index[0]
            count = max(0, min(count, limit - first))
            next_index[0] = first + count
        return list(range(first, first + count))

    def writer(number: int) -> None:
        try:
            write_forever(number)
        except BaseException:  # a writer that fails must end the run: the test sees EOF early
            traceback.print_exc()
            sys.stderr.flush()
            os._exit(3)

    def write_forever(number: int) -> None:
        rng = random.Random(f"{seed}/{number}")
        while True:
            indices = take(rng.randint(2, 5) if rng.random() < 0.3 else 1)
            if not indices:
                return
            try:
                results = append_durably(indices)
            except StoreDegradedError:
                with out_lock:
                    out.write(f"FAIL {indices[0]}\n".encode())
                    out.flush()
                with health:
                    health.wait_for(lambda: store.degraded is None)
                continue
            lines = b"".join(
                f"ACK {i} {r.phys_offset} {r.topic} {r.queue_id} {r.queue_offset}\n".encode()
                for i, r in zip(indices, results))
            with out_lock:
                out.write(lines)
                out.flush()

    def append_durably(indices: list[int]) -> list:
        if len(indices) == 1:
            p = plan(indices[0])
            results = [store.append(p.topic, p.body, queue_id=p.queue_id, tag=p.tag,
                                    keys=(p.key,), properties=p.properties, msg_id=p.msg_id,
                                    extra_queues=p.extra_queues)]
        else:
            results = store.append_batch([_message(i) for i in indices])
        if not store.wait_durable(max(r.end_offset for r in results)):
            raise RuntimeError("wait_durable returned False without a timeout")
        return results

    with out_lock:
        out.write(b"READY\n")
        out.flush()
    threads = [threading.Thread(target=writer, args=(n,), name=f"crash-writer-{n}")
               for n in range(WRITER_THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
