"""`sluice demo` (what `make demo` runs): broker, simulator and Spark job come up together,
window aggregates reach the dashboard's stream, and Ctrl+C stops all of it with one line."""
from __future__ import annotations

import base64
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
from http.client import HTTPConnection
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def test_the_demo_runs_the_pipeline_end_to_end_and_stops_cleanly(tmp_path):
    admin, native, mqtt = free_ports(3)
    demo = subprocess.Popen(
        [sys.executable, "-m", "sluice.cli", "demo", "--data-dir", str(tmp_path / "demo"),
         "--admin-port", str(admin), "--native-port", str(native), "--mqtt-port", str(mqtt),
         "--devices", "20", "--rate", "100", "--window", "5 seconds", "--watermark", "5 seconds"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines: queue.Queue[str | None] = queue.Queue()
    output: list[str] = []

    def pump() -> None:
        for line in demo.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    try:
        while True:
            line = lines.get(timeout=120)
            assert line is not None, "the demo ended early:\n" + "".join(output)
            output.append(line)
            if line.startswith("[demo] dashboard:"):
                break
        assert f"http://127.0.0.1:{admin}/dashboard" in line

        connection = HTTPConnection("127.0.0.1", admin, timeout=180)
        token = base64.b64encode(b"sluice:sluice").decode()
        connection.request("GET", "/topics/telemetry.results/tail", headers={"Authorization": f"Basic {token}"})
        response = connection.getresponse()
        assert response.status == 200
        while "body" not in (message := json.loads(response.readline())):
            pass  # heartbeats until Spark publishes its first windows
        result = json.loads(message["body"])
        assert result["device"].startswith("d") and result["readings"] >= 1
        assert message["subject"] == f"telemetry.results/{result['device']}"
        connection.close()
    finally:
        # Ctrl+C in a terminal: SIGINT to the demo's process group (its children have their own).
        os.killpg(demo.pid, signal.SIGINT)
        code = demo.wait(timeout=120)
        while (line := lines.get(timeout=30)) is not None:
            output.append(line)
    assert code == 0, "".join(output[-50:])
    assert "Traceback" not in "".join(output), "".join(output[-50:])
    stopping = next(i for i, line in enumerate(output) if line.startswith("[demo] stopping"))
    assert output[stopping + 1:] == [], "one line, then nothing, while everything stops"
    with pytest.raises(ConnectionRefusedError):  # the broker is gone with it
        socket.create_connection(("127.0.0.1", admin), timeout=5)
