"""The ``push`` section: push subscriptions delivering to a local HTTP receiver.

A broker (``sluice serve``, sync flush, ``push.allowed_sinks`` the loopback network), a
receiver in a process of its own (``push_peers receiver``: aiohttp, answers 204) and an MQTT
publisher in another (``push_peers publisher``). Throughput: ``events`` events are stored first,
then a subscription with concurrency 1, 16 or 64 (binary mode) is created and timed until the
receiver has had every one. Latency: a subscription with concurrency 16 exists while the
publisher publishes at ``rate`` events/s, each payload stamped with its publish time; the
receiver measures arrival minus stamp (the same clock: one machine), after ``warmup_s``.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .processes import LOOPBACK, free_ports, stop_process_group, wait_for_port
from .sluice_server import REPO_ROOT, USER, SluiceServer, serve_process

Log = Callable[[str], None]
TARGET_RATE = 5_000.0
"""Events/s at concurrency 64."""
TARGET_P99_MS = 20.0
"""Publish -> receiver p99 at 1,000 events/s."""
CONCURRENCIES = (1, 16, 64)


@dataclass(frozen=True)
class Settings:
    events: int = 20_000
    events_at_1: int = 3_000
    """Concurrency 1 is one request at a time: fewer events give the same rate."""
    rate: int = 1_000
    seconds: int = 20
    warmup_s: int = 3

    @classmethod
    def smoke(cls) -> Settings:
        return cls(events=1_000, events_at_1=300, rate=200, seconds=3, warmup_s=1)


@dataclass
class Report:
    settings: Settings
    rates: dict[int, float] = field(default_factory=dict)
    latencies_ms: list[float] = field(default_factory=list)

    def render(self) -> str:
        s = self.settings
        lines = ["push benchmark: events POSTed to a local aiohttp receiver (another process), "
                 "binary CloudEvents, Standard Webhooks signed"]
        for concurrency, rate in self.rates.items():
            events = s.events_at_1 if concurrency == 1 else s.events
            verdict = ("   target >= 5,000/s: " + ("PASS" if rate >= TARGET_RATE else "MISS")
                       if concurrency == 64 else "")
            lines.append(f"  concurrency {concurrency:>3}   {rate:>9,.0f} events/s   "
                         f"({events:,} events){verdict}")
        if self.latencies_ms:
            p50, p99 = _quantile(self.latencies_ms, 0.5), _quantile(self.latencies_ms, 0.99)
            verdict = "PASS" if p99 <= TARGET_P99_MS else "MISS"
            lines.append(f"  publish -> receiver at {s.rate:,}/s   p50 {p50:,.1f} ms   p99 "
                         f"{p99:,.1f} ms   ({len(self.latencies_ms):,} events after {s.warmup_s} s "
                         f"of warm-up)   target p99 <= 20 ms: {verdict}")
        return "\n".join(lines)


def run_section(settings: Settings, workdir: Path, log: Log) -> Report:
    report = Report(settings)
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "push.toml"
    config.write_text('[push]\nallowed_sinks = "127.0.0.0/8"\n')
    receiver_port = free_ports(1)[0]
    receiver = subprocess.Popen([sys.executable, "-m", "bench.push_peers", "receiver",
                                 str(receiver_port)], cwd=REPO_ROOT, start_new_session=True)
    try:
        wait_for_port(receiver_port, time.monotonic() + 60, receiver, "push receiver")
        with serve_process(workdir, wait_for=("--native-port", "--admin-port", "--mqtt-port"),
                           extra=("--config", str(config))) as running:
            server = SluiceServer(running.ports["--native-port"], running.ports["--admin-port"],
                                  running.password, running.directory, running.pid)
            mqtt = f"{LOOPBACK}:{running.ports['--mqtt-port']}"
            sink = f"http://{LOOPBACK}:{receiver_port}"
            for concurrency in CONCURRENCIES:
                events = settings.events_at_1 if concurrency == 1 else settings.events
                report.rates[concurrency] = _throughput(server, mqtt, sink, concurrency, events, log)
            report.latencies_ms = _latency(server, mqtt, sink, settings, log)
    finally:
        stop_process_group(receiver)
    return report


def _throughput(server: SluiceServer, mqtt: str, sink: str, concurrency: int, events: int,
                log: Log) -> float:
    topic = f"burst{concurrency}"
    server.create_topic(topic, queues=8)
    _publish(server, mqtt, topic, events, 0)
    _call(sink + "/reset", method="POST")
    started = time.perf_counter()
    _admin(server, "/push-subscriptions", {"name": f"bench-{concurrency}", "topic": topic,
                                           "sink": sink + "/hook", "concurrency": concurrency})
    while _call(sink + "/stats")["count"] < events:
        time.sleep(0.05)
    rate = events / (time.perf_counter() - started)
    log(f"push: concurrency {concurrency}: {rate:,.0f} events/s")
    _admin(server, f"/push-subscriptions/bench-{concurrency}", method="DELETE")
    return rate


def _latency(server: SluiceServer, mqtt: str, sink: str, settings: Settings, log: Log) -> list[float]:
    topic = "paced"
    server.create_topic(topic, queues=8)
    _admin(server, "/push-subscriptions", {"name": "bench-paced", "topic": topic,
                                           "sink": sink + "/hook", "concurrency": 16})
    _call(sink + "/reset", method="POST")
    count = settings.rate * (settings.seconds + settings.warmup_s)
    _publish(server, mqtt, topic, count, settings.rate)
    while _call(sink + "/stats")["count"] < count:
        time.sleep(0.1)
    latencies = _call(sink + "/stats")["latencies"][settings.rate * settings.warmup_s:]
    log(f"push: paced {settings.rate}/s: p50 {statistics.median(latencies):.1f} ms")
    return latencies


def _publish(server: SluiceServer, mqtt: str, topic: str, count: int, rate: float) -> None:
    process = subprocess.Popen([sys.executable, "-m", "bench.push_peers", "publisher", mqtt,
                                topic, str(count), str(rate)], cwd=REPO_ROOT,
                               stdin=subprocess.PIPE, start_new_session=True, text=True)
    try:
        process.communicate(f"{USER} {server.password}\n", timeout=600)
    finally:
        stop_process_group(process)
    if process.returncode:
        raise RuntimeError(f"the push benchmark's publisher failed ({process.returncode})")


def _admin(server: SluiceServer, path: str, body: object = None, method: str = "POST") -> None:
    server._admin(method, path, body)


def _call(url: str, method: str = "GET") -> dict:
    request = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)
    with urllib.request.urlopen(request, timeout=30) as response:
        text = response.read()
    return json.loads(text) if text else {}


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
