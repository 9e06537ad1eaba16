"""Fixtures shared by every test directory: ``sluice_server`` starts `sluice serve` as a real process."""
from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from protocols.app import READY_LINE

ROOT = Path(__file__).resolve().parents[1]
SLUICE = [sys.executable, "-m", "protocols.cli"]
CONFIG = """
[store]
segment_size = 4_194_304
[auth]
default_password = "sluice"
"""


class Server:
    """A `sluice serve` child process and the endpoints it printed."""

    def __init__(self, data_dir: Path, *extra: str, config: str = CONFIG) -> None:
        """Start `sluice serve` on ``data_dir``; ports are 0 unless ``extra`` names them."""
        config_file = data_dir.parent / "sluice.toml"
        config_file.write_text(config)
        ports = [] if "--native-port" in extra else ["--native-port", "0", "--admin-port", "0"]
        ports += [] if "--mqtt-port" in extra else ["--mqtt-port", "0"]
        ports += [] if "--mqtt-ws-port" in extra else ["--mqtt-ws-port", "0"]
        self.process = subprocess.Popen(
            [*SLUICE, "serve", "--config", str(config_file), "--data-dir", str(data_dir), *ports, *extra],
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
        self.mqtt = re.search(r"MQTT TCP\s+(\S+)", text).group(1)
        """host:port of the MQTT TCP listener."""
        self.mqtt_ws = re.search(r"MQTT WS\s+(\S+)", text).group(1)
        """ws:// URL of the MQTT WebSocket listener."""

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



@pytest.fixture
def sluice_server() -> Iterator[Callable[..., Server]]:
    """``start(data_dir, *flags, config=TOML)`` runs `sluice serve`; all are killed at the end."""
    started: list[Server] = []

    def start(data_dir: Path, *extra: str, config: str = CONFIG) -> Server:
        server = Server(data_dir, *extra, config=config)
        started.append(server)
        return server
    yield start
    for server in started:
        server.kill()
