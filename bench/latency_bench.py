"""The ``latency`` section: from an MQTT publish to its window aggregate on the dashboard.

What ``sluice demo`` runs, measured: a broker (``sluice serve``, sync flush), the simulator
publishing ``rate`` readings per second over MQTT QoS 1, and the telemetry job
(``analytics.telemetry_job.start``, the same queries as ``sluice analytics telemetry``) reading the
broker's data directory (queue entries written out every 250 ms) and publishing window
aggregates back into the broker over the native endpoint. The
benchmark reads that topic exactly as the dashboard does (``GET /topics/{topic}/tail``), and
each result carrying a newer reading than any before gives one sample: arrival time minus the
reading's own timestamp (set by the simulator when it published). It also reports the results
query's micro-batch durations from Spark's progress reports. Samples from the first
``warmup_s`` seconds (Spark starting, the first batches catching up) are left out; on a loaded
machine, where Spark's first results take longer than that, the measurement starts with the
first result to reach the dashboard instead. The simulator publishes until ``seconds`` have been
measured, so a slow start shortens nothing.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.client import HTTPConnection
from pathlib import Path

from .processes import LOOPBACK, stop_process_group
from .sluice_server import REPO_ROOT, SluiceServer, serve_process

Log = Callable[[str], None]
TARGET_P50_MS = 1000.0
RESULTS = "telemetry.results"
CHECKPOINT_INTERVAL_MS = 250
"""The results topic and how often the broker writes queue entries out, as ``sluice demo`` has them."""


@dataclass(frozen=True)
class Settings:
    rate: int = 1000
    devices: int = 1000
    seconds: int = 60
    warmup_s: int = 30
    window: str = "10 seconds"
    watermark: str = "10 seconds"
    first_result_timeout_s: int = 900
    """How long the first result may take to reach the dashboard before the run fails."""

    @classmethod
    def smoke(cls) -> Settings:
        """A short run: measured from the first result on (the smoke checks that it reports)."""
        return cls(rate=200, devices=50, seconds=5, warmup_s=0, first_result_timeout_s=600)


@dataclass
class Report:
    settings: Settings
    latencies_ms: list[float] = field(default_factory=list)
    batch_ms: list[float] = field(default_factory=list)
    input_rows: int = 0

    def render(self) -> str:
        s = self.settings
        lines = [f"latency benchmark: MQTT publish -> window aggregate on the dashboard stream, "
                 f"{s.rate:,} readings/s from {s.devices:,} devices for {s.seconds} s "
                 f"(after {s.warmup_s} s of warm-up), {s.window} windows, local[2] Spark"]
        if not self.latencies_ms or not self.batch_ms:
            return "\n".join(lines + ["  no results reached the dashboard stream: MISS"])
        p50 = statistics.median(self.latencies_ms)
        batch_p50 = statistics.median(self.batch_ms)
        verdict = "PASS" if batch_p50 < TARGET_P50_MS else "MISS"
        lines += [
            f"  publish -> dashboard   p50 {p50:>7,.0f} ms   p90 {_quantile(self.latencies_ms, 0.9):>7,.0f} ms"
            f"   max {max(self.latencies_ms):>7,.0f} ms   ({len(self.latencies_ms)} samples)",
            f"  results micro-batch    p50 {batch_p50:>7,.0f} ms   p90 {_quantile(self.batch_ms, 0.9):>7,.0f} ms"
            f"   ({len(self.batch_ms)} batches, {self.input_rows:,} rows)   target p50 < "
            f"{TARGET_P50_MS:,.0f} ms  {verdict}",
        ]
        return "\n".join(lines)


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class DashboardStream:
    """Reads the results topic's tail stream in a thread; one latency sample per newer reading."""

    def __init__(self, admin_port: int, user: str, password: str) -> None:
        import base64

        self.samples: list[tuple[float, float]] = []  # (arrival, latency ms)
        self.first_sample = threading.Event()
        self._newest = 0
        self._connection = HTTPConnection(LOOPBACK, admin_port, timeout=60)
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        self._connection.request("GET", f"/topics/{RESULTS}/tail?minutes=0",
                                 headers={"Authorization": f"Basic {token}"})
        self._response = self._connection.getresponse()
        if self._response.status != 200:
            raise RuntimeError(f"tail stream refused: {self._response.status} {self._response.read()!r}")
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            while line := self._response.readline():
                now = time.time() * 1000
                message = json.loads(line)
                if "body" not in message:
                    continue
                newest = json.loads(message["body"]).get("latest_ts", 0)
                if newest > self._newest:
                    self._newest = newest
                    self.samples.append((now, now - newest))
                    self.first_sample.set()
        except (OSError, ValueError, AttributeError):
            pass  # http.client's ways of saying the connection was closed at the end of the run

    def close(self) -> None:
        self._connection.close()


def run_section(settings: Settings, workdir: Path, log: Log) -> Report:
    """Broker, job and simulator up; measure; everything stopped again."""
    from .analytics_bench import _spark

    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "sluice.toml"
    config.write_text(f"[store]\ncheckpoint_interval_ms = {CHECKPOINT_INTERVAL_MS}\n")
    report = Report(settings)
    with serve_process(workdir, wait_for=("--native-port", "--admin-port", "--mqtt-port"),
                       extra=("--mqtt-ws-port", "-1", "--config", str(config)), password="bench") as broker:
        server = SluiceServer(broker.ports["--native-port"], broker.ports["--admin-port"],
                              broker.password, broker.directory, broker.pid)
        server.create_topic("devices", 4)
        server.create_topic(RESULTS, 4)
        spark = _spark()
        queries = []
        simulator = None
        stream = None
        try:
            from analytics.telemetry_job import JobSettings, ResultsTopic, start

            user, password = server.credentials
            simulator = subprocess.Popen(
                [sys.executable, "-m", "sluice.cli", "simulate", "--mqtt",
                 f"{LOOPBACK}:{broker.ports['--mqtt-port']}", "--user", user, "--password", password,
                 "--devices", str(settings.devices), "--rate", str(settings.rate), "--count", "0"],
                cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
            started = time.time() * 1000
            queries = start(spark, {"path": str(broker.directory / "data"), "subscribe": "devices"},
                            str(workdir / "out"), str(workdir / "checkpoint"),
                            JobSettings(settings.window, settings.watermark),
                            results=ResultsTopic(server.endpoint, RESULTS, user, password))
            results_query = next(q for q in queries if q.name == "telemetry-results")
            stream = DashboardStream(server.admin_port, user, password)
            log(f"[latency] simulator publishing {settings.rate:,}/s; waiting for the first result")
            first_ms = _await_first_result(stream, simulator, settings.first_result_timeout_s)
            measured_from = max(started + settings.warmup_s * 1000, first_ms)
            log(f"[latency] first result after {(first_ms - started) / 1000:,.0f} s; measuring "
                f"{settings.seconds} s from {(measured_from - started) / 1000:,.0f} s")
            _sleep_until(measured_from + settings.seconds * 1000, simulator)
            _await_measured_batch(results_query, measured_from, simulator, settings.first_result_timeout_s)
            report.latencies_ms = [latency for arrival, latency in stream.samples if arrival >= measured_from]
            for progress in results_query.recentProgress:
                if os.environ.get("SLUICE_BENCH_PROGRESS"):
                    log(f"[latency] {progress['batchId']}: {progress['numInputRows']} rows "
                        f"{json.dumps(progress['durationMs'])}")
                if _epoch_ms(progress["timestamp"]) >= measured_from and progress["numInputRows"]:
                    report.batch_ms.append(progress["durationMs"]["triggerExecution"])
                    report.input_rows += progress["numInputRows"]
            log(f"[latency] {len(report.latencies_ms)} samples, {len(report.batch_ms)} micro-batches")
        finally:
            if simulator is not None and simulator.poll() is None:
                stop_process_group(simulator, 10)
            if stream is not None:
                stream.close()
            for query in queries:
                query.stop()
            spark.stop()
    return report


def _await_first_result(stream: DashboardStream, simulator: subprocess.Popen, timeout_s: float) -> float:
    """The arrival time (epoch ms) of the first result on the dashboard stream."""
    deadline = time.monotonic() + timeout_s
    while not stream.first_sample.wait(1.0):
        _check_running(simulator)
        if time.monotonic() > deadline:
            raise RuntimeError(f"no result reached the dashboard stream within {timeout_s} s")
    return stream.samples[0][0]


def _sleep_until(epoch_ms: float, simulator: subprocess.Popen) -> None:
    """Wait for the end of the measured window while the simulator keeps publishing."""
    while (left := epoch_ms - time.time() * 1000) > 0:
        time.sleep(min(1.0, left / 1000))
        _check_running(simulator)


def _await_measured_batch(query, measured_from: float, simulator: subprocess.Popen,
                          timeout_s: float) -> None:
    """Wait until a results micro-batch that began inside the measured window has completed
    (on a loaded machine one batch can outlast the window)."""
    deadline = time.monotonic() + timeout_s
    while not any(_epoch_ms(p["timestamp"]) >= measured_from and p["numInputRows"]
                  for p in query.recentProgress):
        if time.monotonic() > deadline:
            raise RuntimeError(f"no results micro-batch completed within {timeout_s} s of the window")
        time.sleep(1.0)
        _check_running(simulator)


def _check_running(simulator: subprocess.Popen) -> None:
    if simulator.poll() is not None:
        raise RuntimeError(f"the simulator failed: {simulator.stderr.read().decode()[-2000:]}")


def _epoch_ms(timestamp: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp() * 1000
