"""`sluice demo`: the broker, the device simulator, the telemetry job and the dashboard together.

Three child processes, each in its own session so that Ctrl+C reaches only the demo, which
then stops them in order (simulator, job, broker). Their output is echoed with a prefix. The
job reads the broker's data directory, as Spark beside a broker does; the broker writes its
queue entries out every ``CHECKPOINT_INTERVAL_MS`` so that the job sees readings that soon.
The data directory keeps the store, the job's Parquet output and its checkpoint: running the
demo again resumes where it stopped.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path


RESULTS_TOPIC = "telemetry.results"
TELEMETRY_TOPIC = "devices"
START_TIMEOUT_S = 60
STOP_TIMEOUT_S = 30
CHECKPOINT_INTERVAL_MS = 250


def add_demo_command(commands: argparse._SubParsersAction) -> None:
    """Register `demo` under ``commands``."""
    text = ("Run the whole telemetry pipeline on this machine: `sluice serve` on DIR/broker, "
            "`sluice simulate` publishing device readings over MQTT to topic devices, and "
            "`sluice analytics telemetry` reading DIR/broker with Spark, aggregating into DIR/analytics and "
            f"back into topic {RESULTS_TOPIC}, shown live at http://127.0.0.1:ADMIN_PORT/dashboard "
            "(user sluice, password sluice). Stop with Ctrl+C; running it again resumes.")
    demo = commands.add_parser("demo", help="Broker, simulator, Spark job and dashboard together.",
                               description=text)
    demo.add_argument("--data-dir", default="demo-data", metavar="DIR",
                      help="store, Spark output and checkpoint (default: %(default)s)")
    demo.add_argument("--devices", type=int, default=200, help="fleet size (default: %(default)s)")
    demo.add_argument("--rate", type=float, default=200.0,
                      help="readings per second from the fleet (default: %(default)s)")
    demo.add_argument("--window", default="10 seconds",
                      help="aggregation window (default: %(default)s)")
    demo.add_argument("--watermark", default="10 seconds",
                      help="how late a reading may arrive (default: %(default)s)")
    demo.add_argument("--admin-port", type=int, default=8080, help="dashboard and admin API port")
    demo.add_argument("--native-port", type=int, default=8081, help="native gRPC port")
    demo.add_argument("--mqtt-port", type=int, default=1883, help="MQTT port")
    demo.set_defaults(handler=_demo)


class Child:
    """A child process in its own session whose output lines are echoed with ``name`` until
    ``muted`` is set (once the demo stops on request: what children say while stopping is
    of no interest)."""

    def __init__(self, name: str, command: list[str], events: queue.Queue,
                 muted: threading.Event) -> None:
        self.name = name
        self._muted = muted
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, text=True, start_new_session=True,
                                        env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self._events = events
        threading.Thread(target=self._echo, daemon=True).start()

    def _echo(self) -> None:
        for line in self.process.stdout:
            if not self._muted.is_set():
                print(f"[{self.name}] {line}", end="", flush=True)
            self._events.put((self.name, line))
        self._events.put((self.name, None))

    def stop(self, sig: signal.Signals) -> None:
        """Send ``sig``; kill after ``STOP_TIMEOUT_S`` seconds."""
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                print(f"[demo] {self.name} did not stop in {STOP_TIMEOUT_S} s; killing it", flush=True)
                self.process.kill()
                self.process.wait()


def _demo(args: argparse.Namespace) -> int:
    root = Path(args.data_dir).resolve()
    root.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, _interrupt)  # stop the children on SIGTERM too
    sluice = [sys.executable, "-m", "sluice.cli"]
    events: queue.Queue = queue.Queue()
    muted = threading.Event()
    children: list[Child] = []
    config = root / "sluice.toml"
    config.write_text(f"[store]\ncheckpoint_interval_ms = {CHECKPOINT_INTERVAL_MS}\n")
    try:
        broker = Child("broker", [*sluice, "serve", "--config", str(config), "--data-dir", str(root / "broker"),
                                  "--admin-port", str(args.admin_port), "--native-port",
                                  str(args.native_port), "--mqtt-port", str(args.mqtt_port),
                                  "--mqtt-ws-port", "-1", "--amqp-port", "-1"], events, muted)
        children.append(broker)
        if not _wait_ready(events):
            print("[demo] error: the broker did not start (its output is above)", file=sys.stderr)
            return 1
        admin = f"http://127.0.0.1:{args.admin_port}"
        for topic in (TELEMETRY_TOPIC, RESULTS_TOPIC):
            _create_topic(admin, topic)
        children.append(Child("simulator", [
            *sluice, "simulate", "--mqtt", f"127.0.0.1:{args.mqtt_port}", "--devices", str(args.devices),
            "--rate", str(args.rate), "--count", "0"], events, muted))
        if not _wait_for_messages(root / "broker", TELEMETRY_TOPIC):
            print(f"[demo] error: no telemetry reached topic {TELEMETRY_TOPIC} in {START_TIMEOUT_S} s "
                  "(the simulator's output is above)", file=sys.stderr)
            return 1
        children.append(Child("job", [
            *sluice, "analytics", "telemetry", "--data-dir", str(root / "broker"),
            "--results-endpoint", f"127.0.0.1:{args.native_port}",
            "--topic", TELEMETRY_TOPIC, "--results-topic", RESULTS_TOPIC,
            "--output", str(root / "analytics"), "--checkpoint", str(root / "checkpoint"),
            "--window", args.window, "--watermark", args.watermark], events, muted))
        print(f"[demo] dashboard: {admin}/dashboard (user sluice, password sluice); "
              "Spark needs about 20 s before the first results. Ctrl+C stops everything.", flush=True)
        while True:
            name, line = events.get()
            if line is None:
                print(f"[demo] error: {name} stopped (its output is above); stopping the demo",
                      file=sys.stderr)
                return 1
    except KeyboardInterrupt:
        muted.set()
        print("[demo] stopping the simulator, the Spark job and the broker", flush=True)
        return 0
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl+C must not cut this short
        for child in reversed(children):
            child.stop(signal.SIGINT if child.name == "job" else signal.SIGTERM)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _wait_ready(events: queue.Queue) -> bool:
    # Imported here: the broker's modules would slow every other `sluice` command's start.
    from ..server.app import READY_LINE

    while True:
        try:
            name, line = events.get(timeout=START_TIMEOUT_S)
        except queue.Empty:
            return False
        if line is None:
            return False
        if line.startswith(READY_LINE):
            return True


def _wait_for_messages(data_dir: Path, topic: str) -> bool:
    """Whether ``topic`` has stored messages in ``data_dir`` within ``START_TIMEOUT_S``: the job
    would wait for them without end, so a simulator that cannot publish is reported here. Looks
    every 100 ms: the broker is another process."""
    from store.reader import StoreReader

    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        reader = StoreReader(str(data_dir))
        try:
            if any(name == topic for name, _ in reader.queues()):
                return True
        finally:
            reader.close()
        time.sleep(0.1)
    return False


def _create_topic(admin: str, name: str) -> None:
    """Create ``name`` with 4 queues unless it exists."""
    token = base64.b64encode(b"sluice:sluice").decode()
    request = urllib.request.Request(
        f"{admin}/topics", data=json.dumps({"name": name, "queue_count": 4}).encode(), method="POST",
        headers={"Content-Type": "application/json", "Authorization": f"Basic {token}"})
    try:
        urllib.request.urlopen(request, timeout=30).read()
    except urllib.error.HTTPError as error:
        if error.code != 409:
            raise
