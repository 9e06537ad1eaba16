"""A failing disk, then SIGKILL: nothing acknowledged is lost, nothing corrupt is served.

``crash_writer.py`` appends from several threads and prints ``ACK ...`` only after
``wait_durable``. Here its store file operations fail (``store.faults``: short writes, ENOSPC,
EMFILE, EIO at the commit log, consume queues and key index), or its data directory is a real
tmpfs that fills up. The store turns degraded (``DEGRADED``), appends fail fast (``FAIL``), and
the child is killed either while the disk still fails or after the fault was lifted and appends
resumed (``RESUMED``). The store is then reopened in this process: every acknowledged message is
there byte for byte in its queues and by id, queues and log agree, and ``verify`` is clean (the
checks of ``test_sigkill.py``). No sleeps: the test waits on lines from the child.
"""
from __future__ import annotations

import errno
import importlib.util
import json
import os
import queue
import random
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field

import pytest

from store.file_store import FileStore
from store.reader import StoreReader

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
WRITER = os.path.join(HERE, "crash_writer.py")


def _load(name: str, path: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = sys.modules[name] = importlib.util.module_from_spec(spec)  # dataclasses look it up
    spec.loader.exec_module(module)
    return module


sigkill = _load("sluice_crash_sigkill", os.path.join(HERE, "test_sigkill.py"))
crash_writer = sigkill.crash_writer
CONFIG = sigkill.CONFIG
SEED = sigkill.SEED
LINE_TIMEOUT_S = 60.0  # a child that prints nothing for this long has hung: the test fails

pytestmark = pytest.mark.crash


@dataclass
class Run:
    """What one writer printed before it was killed."""

    acks: list = field(default_factory=list)
    degraded: list[str] = field(default_factory=list)
    failed: int = 0
    resumed: bool = False
    acks_after_resume: int = 0


class Writer:
    """A crash_writer child whose stdout lines are read on a thread and awaited with a timeout."""

    def __init__(self, data_dir: str, seed: int, start: int, faults: list[dict] | None, log_path: str) -> None:
        env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
        argv = [sys.executable, WRITER, data_dir, str(seed), str(start)]
        if faults is not None:
            argv.append(json.dumps(faults))
        self.log_path = log_path
        with open(log_path, "wb") as stderr:
            self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=stderr, env=env, cwd=REPO)
        self.lines: queue.Queue[bytes | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()
        self.run = Run()

    def _pump(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def until(self, done) -> None:
        """Read lines into ``self.run`` until ``done(run)``; fail if the child hangs or exits."""
        while not done(self.run):
            try:
                line = self.lines.get(timeout=LINE_TIMEOUT_S)
            except queue.Empty:
                self.proc.kill()
                pytest.fail(f"writer printed nothing for {LINE_TIMEOUT_S}s; stderr:\n{self.stderr()}")
            if line is None or not line.endswith(b"\n"):
                pytest.fail(f"writer ended ({self.proc.wait()}) before it was killed; stderr:\n{self.stderr()}")
            self._note(line.decode().rstrip("\n"))

    def _note(self, line: str) -> None:
        kind, _, rest = line.partition(" ")
        if kind == "ACK":
            index, phys, topic, queue_id, queue_offset = rest.split()
            self.run.acks.append(sigkill.Ack(int(index), int(phys), topic, int(queue_id), int(queue_offset)))
            self.run.acks_after_resume += self.run.resumed
        elif kind == "DEGRADED":
            self.run.degraded.append(rest)
        elif kind == "FAIL":
            self.run.failed += 1
        elif kind == "RESUMED":
            self.run.resumed = True
        else:
            assert line == "READY", f"unexpected line {line!r}"

    def lift(self) -> None:
        self.proc.stdin.write(b"LIFT\n")
        self.proc.stdin.flush()

    def kill(self) -> Run:
        """SIGKILL the child; every complete ACK line it printed before dying counts."""
        os.kill(self.proc.pid, signal.SIGKILL)
        assert self.proc.wait() == -signal.SIGKILL, self.stderr()
        while (line := self.lines.get(timeout=LINE_TIMEOUT_S)) is not None:
            if line.endswith(b"\n"):
                self._note(line.decode().rstrip("\n"))
        self.proc.stdin.close()
        self.proc.stdout.close()
        return self.run

    def stderr(self) -> str:
        with open(self.log_path, "rb") as file:
            return file.read().decode(errors="replace")


def check_store(data_dir: str, acked: dict) -> None:
    """The durability contract, then `verify`."""
    with FileStore(data_dir, CONFIG) as store:
        sigkill.verify(store, acked)
    reader = StoreReader(data_dir)
    try:
        assert reader.verify() == []
    finally:
        reader.close()


def collect(acked: dict, run: Run) -> None:
    for ack in run.acks:
        assert ack.index not in acked, f"message {ack.index} acknowledged twice"
        acked[ack.index] = ack


FAULTS = [
    ("commitlog", "write", "short"), ("commitlog", "write", "ENOSPC"), ("commitlog", "sync", "EIO"),
    ("commitlog", "open", "EMFILE"), ("consumequeue", "write", "ENOSPC"), ("consumequeue", "open", "EMFILE"),
    ("index", "allocate", "ENOSPC"), ("index", "open", "EMFILE"),
]


def fault_spec(site: str, op: str, kind: str, rng: random.Random) -> list[dict]:
    """The fault: after a random amount of traffic for writes, after some calls otherwise."""
    if kind == "short":
        return [{"site": site, "op": op}]
    code = getattr(errno, kind)
    if op == "write":  # queue entries are 20 bytes; records average about 3 KB
        room = rng.randint(4_000, 16_000) if site == "consumequeue" else rng.randint(100_000, 400_000)
        return [{"site": site, "op": op, "error": code, "after_bytes": room}]
    return [{"site": site, "op": op, "error": code, "after_calls": rng.randint(0, 3)}]


@pytest.mark.parametrize("site,op,kind", FAULTS, ids=["-".join(case) for case in FAULTS])
def test_sigkill_while_the_disk_fails_and_after_it_recovers_loses_nothing_acknowledged(tmp_path, site, op, kind):
    data_dir = str(tmp_path / "data")
    rng = random.Random(f"{SEED}/{site}/{op}/{kind}")
    acked: dict = {}
    for number, lift in enumerate((False, True)):
        writer = Writer(data_dir, rng.randrange(1 << 30), number * crash_writer.INDEX_SPAN,
                        fault_spec(site, op, kind, rng), str(tmp_path / f"writer-{number}.stderr"))
        if kind == "short":  # short writes are finished by the store: nothing fails
            writer.until(lambda run: len(run.acks) >= 300)
        elif not lift:  # killed while the disk still fails
            writer.until(lambda run: run.degraded and run.failed)
        else:  # the disk recovers: appends resume by themselves, then the kill
            writer.until(lambda run: run.degraded)
            writer.lift()
            writer.until(lambda run: run.resumed and run.acks_after_resume >= 100)
        run = writer.kill()
        if kind != "short":
            assert kind in run.degraded[0], run.degraded
        else:
            assert not run.degraded
        collect(acked, run)
        check_store(data_dir, acked)
    assert len(acked) > 100, "the writer acknowledged too little for the test to mean much"


@pytest.fixture
def small_tmpfs(mount_tmpfs):
    """A 2 MiB tmpfs; the test is skipped where mounting is not permitted."""
    return mount_tmpfs("2m")


def test_a_real_disk_that_fills_up_then_sigkill_loses_nothing_acknowledged(tmp_path, small_tmpfs):
    data_dir = str(small_tmpfs / "data")
    acked: dict = {}
    writer = Writer(data_dir, SEED, 0, None, str(tmp_path / "writer-full.stderr"))
    writer.until(lambda run: run.degraded and run.failed)
    run = writer.kill()
    assert "ENOSPC" in run.degraded[0] and "the disk is full" in run.degraded[0], run.degraded
    assert len(run.acks) > 50, "the disk filled before the writer got going"
    collect(acked, run)
    done = subprocess.run([sys.executable, "-m", "sluice.cli", "store", "verify", data_dir],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr  # a torn tail is what a kill leaves
    assert all(line == "ok" or "torn tail of" in line and line.endswith("cut at the next start")
               for line in done.stdout.splitlines()), done.stdout
    check_store(data_dir, acked)  # opened on the disk that is still full
    subprocess.run(["mount", "-o", "remount,size=64m", str(small_tmpfs)], check=True)
    check_store(data_dir, acked)
    writer = Writer(data_dir, SEED + 1, crash_writer.INDEX_SPAN, None, str(tmp_path / "writer-room.stderr"))
    writer.until(lambda run: len(run.acks) >= 100)  # with room again, appends are acknowledged
    collect(acked, writer.kill())
    check_store(data_dir, acked)


KEY_INDEX_ON_A_FULL_DISK = """
import errno, os, sys
from store.key_index import KeyIndex

directory = sys.argv[1]
os.makedirs(os.path.join(directory, "index"))
with open(os.path.join(directory, "filler"), "wb", buffering=0) as filler:
    for chunk in (1 << 20, 4096):
        try:
            while True:
                filler.write(bytes(chunk))
        except OSError:
            pass
index = KeyIndex(os.path.join(directory, "index"), slot_count=10007, max_entries=100_000)
try:
    for offset in range(100_000):
        index.add_many([b"key %d" % offset], offset, 0)
except OSError as error:
    print(errno.errorcode[error.errno])
"""


def test_a_key_index_on_a_full_disk_fails_with_an_error_not_sigbus(small_tmpfs):
    """Key index files are mapped into memory: a page first touched on a full disk would kill
    the process with SIGBUS. Blocks are reserved before pages are touched, so it is ENOSPC."""
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, "-c", KEY_INDEX_ON_A_FULL_DISK, str(small_tmpfs)],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=120)
    assert done.returncode == 0, f"ended with {done.returncode} (-7 is SIGBUS): {done.stderr}"
    assert done.stdout.strip() == "ENOSPC"
