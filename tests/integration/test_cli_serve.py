"""`sluice serve` as a real process, driven by the `sluice` admin and data commands.

The server binds port 0 for both listeners and prints the ports it got; the test reads its stdout
until the ready line appears (an event, not a sleep), runs the commands as subprocesses against
it, stops it with SIGTERM, and restarts it on the same data directory.
"""
from __future__ import annotations

import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from protocols.app import READY_LINE

ROOT = Path(__file__).resolve().parents[2]
SLUICE = [sys.executable, "-m", "protocols.cli"]
CONFIG = """
[store]
segment_size = 4_194_304
[auth]
default_password = "sluice"
"""


class Server:
    """A `sluice serve` child process and the endpoints it printed."""

    def __init__(self, data_dir: Path, *extra: str) -> None:
        config = data_dir.parent / "sluice.toml"
        config.write_text(CONFIG)
        self.process = subprocess.Popen(
            [*SLUICE, "serve", "--config", str(config), "--data-dir", str(data_dir),
             "--native-port", "0", "--admin-port", "0", *extra],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env())
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.output: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.process.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def wait_ready(self, timeout: float = 60) -> None:
        """Read stdout until the ready line; fail with stderr if the process ends first."""
        while True:
            line = self.lines.get(timeout=timeout)
            if line is None:
                raise AssertionError(f"sluice serve exited early: {self.process.wait()}\n"
                                     f"{''.join(self.output)}{self.process.stderr.read()}")
            self.output.append(line)
            if line.startswith(READY_LINE):
                break
        text = "".join(self.output)
        self.native = re.search(r"native gRPC\s+(\S+)", text).group(1)
        self.admin = re.search(r"admin API\s+(\S+)", text).group(1)

    def stop(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(timeout=60)
        while (line := self.lines.get(timeout=10)) is not None:
            self.output.append(line)
        return code

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}


def sluice(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([*SLUICE, *args], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env=clean_env())
    if check:
        assert done.returncode == 0, f"sluice {' '.join(args)}: {done.stdout}{done.stderr}"
    return done


@pytest.fixture
def data_dir(tmp_path):
    return tmp_path / "data"


@pytest.fixture
def server(data_dir):
    started = Server(data_dir)
    yield started
    started.kill()


def test_serve_prints_every_endpoint_and_survives_a_restart(server, data_dir):
    server.wait_ready()
    printed = "".join(server.output)
    for what in ("native gRPC", "admin API", "metrics", "/metrics", "/openapi.json", "data dir",
                 str(data_dir), "default user", "sluice / sluice"):
        assert what in printed, what
    admin, native = ["--admin", server.admin], ["--server", server.native]

    assert "created topic orders" in sluice("topic", "create", "orders", "--queues", "2", *admin).stdout
    assert "orders" in sluice("topic", "list", *admin).stdout

    sent = sluice("send", "orders", "order {n}", "--count", "100", *native)
    assert "sent 100 messages" in sent.stdout
    assert "sent 100/100" in sent.stderr  # the progress line
    keyed = sluice("send", "orders", "the keyed one", "--key", "order-7", *native)
    assert keyed.stdout.startswith("sent ")

    consumed = sluice("consume", "orders", "--group", "billing", "--count", "101", "--wait", "20",
                      "--json", *native)
    bodies = [json.loads(line)["body_text"] for line in consumed.stdout.splitlines()]
    assert sorted(bodies) == sorted([f"order {i}" for i in range(100)] + ["the keyed one"])
    assert "received 101 messages" in consumed.stderr

    described = json.loads(sluice("group", "describe", "billing", "--json", *admin).stdout)
    assert described["total_lag"] == 0
    assert sum(q["committed"] for q in described["lag"]) == 101
    assert "billing" in sluice("group", "describe", "billing", *admin).stdout

    assert server.stop() == 0
    assert "Sluice stopped." in "".join(server.output)

    again = Server(data_dir)
    try:
        again.wait_ready()
        admin = ["--admin", again.admin]
        assert "orders" in sluice("topic", "list", *admin).stdout
        topic = json.loads(sluice("topic", "describe", "orders", "--json", *admin).stdout)
        assert topic["messages"] == 101
        read = sluice("consume", "orders", "--earliest", "--wait", "3", "--json", "--server", again.native)
        assert sorted(json.loads(line)["body_text"] for line in read.stdout.splitlines()) == sorted(bodies)
        found = sluice("message", "get", "--topic", "orders", "--key", "order-7", *admin).stdout
        assert "body: the keyed one" in found
        described = json.loads(sluice("group", "describe", "billing", "--json", *admin).stdout)
        assert described["total_lag"] == 0, "committed offsets survive the restart"
        assert "not created (users exist)" in "".join(again.output)
        groups = sluice("group", "list", *admin).stdout
        assert "billing" in groups and "reader" not in groups, "reading by offset joins no group"
        assert again.stop() == 0
    finally:
        again.kill()


def test_admin_commands_need_the_right_credentials(server):
    server.wait_ready()
    admin = ["--admin", server.admin]
    refused = sluice("topic", "list", *admin, "--password", "nope", check=False)
    assert refused.returncode == 1
    assert "401" in refused.stderr and "SLUICE_PASSWORD" in refused.stderr
    sluice("user", "create", "viewer", "--new-password", "pw", *admin)
    forbidden = sluice("user", "list", *admin, "--user", "viewer", "--password", "pw", check=False)
    assert forbidden.returncode == 1 and "403" in forbidden.stderr
    sluice("user", "grant", "viewer", "topic", "*", "subscribe", *admin)
    assert "subscribe" in sluice("user", "permissions", "viewer", *admin).stdout


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_taken_port_names_the_port_and_the_flag(data_dir):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        done = subprocess.run([*SLUICE, "serve", "--data-dir", str(data_dir), "--native-port", "0",
                               "--admin-port", str(port)], cwd=ROOT, capture_output=True, text=True,
                              timeout=60, env=clean_env())
    assert done.returncode == 1
    assert f"port {port}" in done.stderr and "--admin-port" in done.stderr


def test_commands_without_a_broker_say_how_to_start_one():
    closed = free_port()
    listed = sluice("topic", "list", "--admin", f"http://127.0.0.1:{closed}", check=False)
    assert listed.returncode == 1 and "start it with `make run`" in listed.stderr
    sent = sluice("send", "t", "x", "--server", f"127.0.0.1:{closed}", "--connect-timeout", "1",
                  check=False)
    assert sent.returncode == 1 and "start it with `make run`" in sent.stderr


def test_a_bad_config_file_names_the_key(tmp_path):
    config = tmp_path / "bad.toml"
    config.write_text("[store]\nflsuh = 'sync'\n")
    done = sluice("serve", "--config", str(config), check=False)
    assert done.returncode == 2 and "unknown key 'store.flsuh'" in done.stderr
