"""A one-member etcd on this machine, for trying a cluster out and for tests.

Production runs three etcd members of its own (docs/clustering.md, "In production"); this
starts Debian's ``etcd`` (package ``etcd-server``) with its data under a directory of ours,
waits until it answers ``/health``, and stops it again.
"""
from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import BinaryIO

INSTALL_HINT = "install it with: apt-get install -y etcd-server"


class EtcdNotStarted(RuntimeError):
    """etcd is missing or did not become healthy; the message says what to do."""


def dying_with_parent(command: list[str]) -> list[str]:
    """``command`` wrapped so that it does not outlive the thread that starts it (a test run
    killed by a timeout, a dev cluster whose supervisor died): util-linux's ``setpriv
    --pdeathsig KILL`` execs it with Linux's parent-death signal set. Unwrapped where setpriv
    is missing. (A ``preexec_fn`` would run Python in the forked child, which deadlocks in a
    process whose other threads hold locks, gRPC's among them.)"""
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "KILL", "--", *command] if setpriv else command


def find_etcd() -> str | None:
    return shutil.which("etcd") or next((path for path in ("/usr/bin/etcd", "/usr/local/bin/etcd")
                                         if Path(path).exists()), None)


class LocalEtcd:
    """One etcd member serving clients on ``host:client_port``."""

    def __init__(self, data_dir: Path, client_port: int, peer_port: int, host: str = "127.0.0.1",
                 name: str = "etcd1", more_hosts: tuple[str, ...] = ()) -> None:
        """``more_hosts``: further addresses it serves clients on (the same port), so a test can
        cut one node off from etcd by the address that node uses."""
        self.more_hosts = more_hosts
        self.data_dir = Path(data_dir)
        self.host, self.client_port, self.peer_port, self.name = host, client_port, peer_port, name
        self.process: subprocess.Popen | None = None
        self._log: BinaryIO | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.client_port}"

    def start(self, timeout_s: float = 60.0) -> None:
        binary = find_etcd()
        if binary is None:
            raise EtcdNotStarted(f"etcd is not installed; {INSTALL_HINT}")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        peer = f"http://{self.host}:{self.peer_port}"
        self._log = open(self.data_dir / "etcd.log", "ab")
        self.process = subprocess.Popen(dying_with_parent(
            [binary, "--name", self.name, "--data-dir", str(self.data_dir / "etcd"),
             "--listen-client-urls", ",".join([self.url] + [f"http://{h}:{self.client_port}" for h in self.more_hosts]),
             "--advertise-client-urls", self.url,
             "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
             "--initial-cluster", f"{self.name}={peer}", "--logger=zap", "--log-outputs=stderr",
             "--log-level=warn"]),
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=self._log, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while not self._healthy():
            if self.process.poll() is not None:
                raise EtcdNotStarted(f"etcd exited with status {self.process.returncode}; see "
                                     f"{self.data_dir / 'etcd.log'}")
            if time.monotonic() > deadline:
                self.stop()
                raise EtcdNotStarted(f"etcd did not report healthy within {timeout_s:.0f} s; see "
                                     f"{self.data_dir / 'etcd.log'}")
            time.sleep(0.1)

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=1) as reply:
                return json.load(reply).get("health") == "true"
        except (OSError, ValueError, urllib.error.URLError):
            return False

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> LocalEtcd:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
