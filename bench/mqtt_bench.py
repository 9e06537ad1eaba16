"""The MQTT benchmark: Sluice's MQTT listener next to Mosquitto, same load generator, same run.

Scenarios (100-byte payloads; MQTT 3.1.1, clean sessions):

- QoS 0 fan-in: 4 publisher processes to one topic, 1 subscriber.
- QoS 1 fan-in: the same with QoS 1, each publisher keeping 64 publishes unacknowledged.
- 1,000 devices: 4 publishers at QoS 1 (window 64) round-robin over ``devices/<id>/telemetry``
  for 1,000 ids, one subscriber to ``devices/+/telemetry`` at QoS 1.
- fan-out: one publisher at QoS 0 to one topic, 50 subscribers (msg/s is all deliveries).
- latency: one publisher at a fixed 1,000 msg/s with its send time in the payload, one
  subscriber computing one-way latency (same host, one monotonic clock); at QoS 0 and QoS 1.

Throughput is what the subscriber(s) received, from the first message to the last; messages
published but never received are shown as lost. The load generator (``mqtt_load``: raw-socket
clients in spawned processes) is the same for every server, and its own ceiling is measured
each round against a discard server (``mqtt_discard``): the publishers of each scenario against
a server that only acks, and its subscribers against one that floods them with pre-encoded
PUBLISH packets. A broker figure far below both is the broker's, not the generator's.

Each round runs every scenario against the discard server, then Mosquitto, then Sluice; tables
show medians over rounds. Broker CPU per message is read from /proc for the broker's process
group. Mosquitto is skipped, with the reason printed, when it is not installed; Sluice until
``sluice serve`` has an MQTT listener.
"""
from __future__ import annotations

import os
import platform
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from . import mosquitto, mqtt_sluice
from .mqtt_discard import flood_filter
from .mqtt_load import LoadRun, PubSpec, SubSpec, run_load
from .native_workloads import percentiles
from .processes import ServerUnavailable, free_ports, group_cpu_seconds, stop_process_group, tail, wait_for_port
from .report import Target, _render_targets, _table, microseconds_text as _us

Log = Callable[[str], None]

MOSQUITTO, SLUICE, CEILING = "Mosquitto", "Sluice", "generator"
THROUGHPUT_GOAL = 0.5
"""Sluice's msg/s in every throughput scenario, as a share of Mosquitto's."""
LATENCY_GOAL = 1e-3
"""Sluice's p50 one-way latency at 1,000 msg/s, in seconds."""
MAX_FAILURES = 2
REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Settings:
    rounds: int = 3
    publishers: int = 4
    size: int = 100
    window: int = 64
    fan_in_messages: int = 50_000
    """Per publisher, QoS 0 fan-in."""
    qos1_messages: int = 25_000
    """Per publisher, QoS 1 fan-in and devices."""
    devices: int = 1000
    fan_out_messages: int = 10_000
    """Published once; each of ``subscribers`` receives every one."""
    subscribers: int = 50
    subscriber_processes: int = 2
    """Processes the fan-out subscribers' connections are spread over."""
    latency_rate: int = 1000
    latency_seconds: float = 5.0
    timeout: float = 120.0
    """Seconds one run may take before it is abandoned."""
    quick: bool = False

    @classmethod
    def smoke(cls) -> Settings:
        return cls(rounds=1, fan_in_messages=2_000, qos1_messages=1_000, fan_out_messages=500,
                   latency_seconds=0.5, timeout=30.0, quick=True)


@dataclass(frozen=True)
class Load:
    """What one scenario run does: its publishers and subscribers."""

    publishers: list[PubSpec]
    subscribers: list[SubSpec]


@dataclass(frozen=True)
class Scenario:
    key: str
    label: str
    build: Callable[[Settings, str], Load]
    """Makes the run's load; the string is unique per run, for client ids and topics."""
    qos: int
    latency: bool = False


def fan_in(s: Settings, tag: str, qos: int, messages: int) -> Load:
    topic = f"bench/{tag}"
    return Load([PubSpec(f"{tag}-pub{i}", (topic,), qos, messages, s.size, s.window) for i in range(s.publishers)],
                [SubSpec(((f"{tag}-sub", topic, qos),), messages * s.publishers)])


def fan_in_qos0(s: Settings, tag: str) -> Load:
    return fan_in(s, tag, 0, s.fan_in_messages)


def fan_in_qos1(s: Settings, tag: str) -> Load:
    return fan_in(s, tag, 1, s.qos1_messages)


def devices(s: Settings, tag: str) -> Load:
    """Publisher ``i`` owns every ``publishers``-th device id and goes round them."""
    topics = [f"devices/{device}/telemetry" for device in range(s.devices)]
    return Load([PubSpec(f"{tag}-pub{i}", tuple(topics[i::s.publishers]), 1, s.qos1_messages, s.size, s.window)
                 for i in range(s.publishers)],
                [SubSpec(((f"{tag}-sub", "devices/+/telemetry", 1),), s.qos1_messages * s.publishers)])


def fan_out(s: Settings, tag: str) -> Load:
    topic = f"bench/{tag}"
    processes = max(1, min(s.subscriber_processes, s.subscribers))
    subscribers = []
    for process in range(processes):
        ids = range(process, s.subscribers, processes)
        subscribers.append(SubSpec(tuple((f"{tag}-sub{i}", topic, 0) for i in ids), s.fan_out_messages * len(ids)))
    return Load([PubSpec(f"{tag}-pub", (topic,), 0, s.fan_out_messages, s.size)], subscribers)


def latency(s: Settings, tag: str, qos: int) -> Load:
    topic = f"bench/{tag}"
    messages = max(1, int(s.latency_rate * s.latency_seconds))
    return Load([PubSpec(f"{tag}-pub", (topic,), qos, messages, s.size, rate=s.latency_rate)],
                [SubSpec(((f"{tag}-sub", topic, qos),), messages, timestamps=True)])


def _scenarios(s: Settings) -> list[Scenario]:
    return [
        Scenario("fanin0", f"QoS 0 fan-in {s.publishers} pub -> 1 sub", fan_in_qos0, 0),
        Scenario("fanin1", f"QoS 1 fan-in {s.publishers} pub (window {s.window}) -> 1 sub", fan_in_qos1, 1),
        Scenario("devices", f"QoS 1 {s.devices:,} device topics -> devices/+/telemetry", devices, 1),
        Scenario("fanout", f"QoS 0 fan-out 1 pub -> {s.subscribers} subs", fan_out, 0),
        Scenario("lat0", f"latency QoS 0 at {s.latency_rate:,} msg/s", lambda s, t: latency(s, t, 0), 0, True),
        Scenario("lat1", f"latency QoS 1 at {s.latency_rate:,} msg/s", lambda s, t: latency(s, t, 1), 1, True),
    ]


# -- results ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Result:
    """One scenario run against one server."""

    msg_per_s: float
    received: int
    lost: int
    p50: float
    p99: float
    """One-way latency percentiles in seconds (latency scenarios only, else 0)."""
    broker_us_per_msg: float | None
    client_us_per_msg: float


@dataclass(frozen=True)
class Ceiling:
    """The generator's own rates for a scenario, against the discard server."""

    publish_msg_per_s: float
    receive_msg_per_s: float


@dataclass
class Row:
    server: str
    scenario: Scenario
    results: list[Result] = field(default_factory=list)

    def median(self) -> Result:
        ordered = sorted(self.results, key=lambda result: result.msg_per_s)
        return ordered[(len(ordered) - 1) // 2]

    def latency(self) -> tuple[float, float]:
        return (statistics.median_low(r.p50 for r in self.results), statistics.median_low(r.p99 for r in self.results))


@dataclass
class MqttReport:
    title: str
    scenarios: list[Scenario]
    rows: dict[tuple[str, str], Row] = field(default_factory=dict)
    ceilings: dict[str, list[Ceiling]] = field(default_factory=dict)
    targets: list[Target] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def row(self, server: str, key: str) -> Row | None:
        row = self.rows.get((server, key))
        return row if row and row.results else None

    def render(self) -> str:
        rows = [row for row in self.rows.values() if row.results]
        parts = [self.title, "", _render_rows(rows) if rows else "no broker runs (see the notes)"]
        for table in (self._ceiling_table(), self._comparison()):
            if table:
                parts += ["", table]
        if self.targets:
            parts += ["", _render_targets(self.targets)]
        if self.notes:
            parts += [""] + [f"note: {note}" for note in self.notes]
        return "\n".join(parts)

    def _ceiling_table(self) -> str:
        lines = []
        for scenario in self.scenarios:
            ceilings = self.ceilings.get(scenario.key)
            if not ceilings:
                continue
            publish = statistics.median_low(c.publish_msg_per_s for c in ceilings)
            receive = statistics.median_low(c.receive_msg_per_s for c in ceilings)
            line = [scenario.label, f"{publish:,.0f}", f"{receive:,.0f}"]
            for server in (MOSQUITTO, SLUICE):
                row = self.row(server, scenario.key)
                line.append(f"{row.median().msg_per_s / min(publish, receive):.0%}" if row else "-")
            lines.append(line)
        if not lines:
            return ""
        header = ["generator ceiling (discard server)", "publishers msg/s", "subscribers msg/s",
                  "Mosquitto / ceiling", "Sluice / ceiling"]
        return _table(header, lines, right=lambda i: i >= 1)

    def _comparison(self) -> str:
        lines = []
        for scenario in self.scenarios:
            mosq, sluice = self.row(MOSQUITTO, scenario.key), self.row(SLUICE, scenario.key)
            if not (mosq and sluice):
                continue
            m, s = mosq.median(), sluice.median()
            if scenario.latency:
                lines.append([scenario.label, _latency_text(mosq), _latency_text(sluice), "-"])
            else:
                lines.append([scenario.label, f"{m.msg_per_s:,.0f} msg/s", f"{s.msg_per_s:,.0f} msg/s",
                              f"{s.msg_per_s / m.msg_per_s:.2f}x" if m.msg_per_s else "-"])
        if not lines:
            return ""
        return _table(["scenario", "Mosquitto", "Sluice", "Sluice/Mosquitto"], lines, right=lambda i: i >= 1)


def _render_rows(rows: list[Row]) -> str:
    header = ["server", "scenario", "runs", "msg/s", "msg/s min..max", "lost", "p50", "p99",
              "broker CPU/msg", "clients CPU/msg"]
    lines = []
    for row in rows:
        median = row.median()
        rates = [r.msg_per_s for r in row.results]
        p50, p99 = row.latency() if row.scenario.latency else (None, None)
        broker = [r.broker_us_per_msg for r in row.results if r.broker_us_per_msg is not None]
        lines.append([row.server, row.scenario.label, str(len(row.results)), f"{median.msg_per_s:,.0f}",
                      f"{min(rates):,.0f}..{max(rates):,.0f}", f"{median.lost:,}", _ms(p50), _ms(p99),
                      _us(statistics.median_low(broker) if broker else None),
                      _us(statistics.median_low(r.client_us_per_msg for r in row.results))])
    return _table(header, lines, right=lambda i: i >= 2)


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:,.3f} ms"


def _latency_text(row: Row) -> str:
    p50, p99 = row.latency()
    return f"p50 {p50 * 1e3:,.3f} / p99 {p99 * 1e3:,.3f} ms"


# -- servers ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Server:
    name: str
    port: int
    group: int | None
    """Process group whose CPU time each run reports."""
    output: Path | None = None


def measure(server: Server, load: Load, timeout: float) -> Result:
    """Run ``load`` against ``server`` and sum it up."""
    before = group_cpu_seconds(server.group) if server.group else None
    run = run_load(server.port, load.publishers, load.subscribers, timeout)
    after = group_cpu_seconds(server.group) if server.group else None
    if run.received == 0:
        raise RuntimeError(f"the subscribers received none of {run.expected:,} messages")
    qos1 = any(spec.qos for spec in load.publishers)
    if qos1 and run.lost:
        raise RuntimeError(f"QoS 1: the subscribers received {run.received:,} of {run.expected:,} messages")
    p50, p99 = percentiles(run.latencies_ns)
    broker = None if before is None or after is None else (after - before) / run.received * 1e6
    return Result(run.msg_per_s, run.received, run.lost, p50 / 1e9, p99 / 1e9, broker,
                  run.client_cpu / run.received * 1e6)


def ceiling(discard_port: int, load: Load, timeout: float) -> Ceiling:
    """The generator's rates for ``load`` against the discard server: its publishers alone
    (publish msg/s), then its subscribers flooded with as many messages as they expect."""
    published: LoadRun = run_load(discard_port, load.publishers, [], timeout)
    flooded = [SubSpec(tuple((client_id, flood_filter(spec.expected // len(spec.connections), qos, _size(load)), qos)
                             for client_id, _, qos in spec.connections), spec.expected)
               for spec in load.subscribers]
    received = run_load(discard_port, [], flooded, timeout)
    return Ceiling(published.publish_msg_per_s, received.msg_per_s)


def _size(load: Load) -> int:
    return load.publishers[0].size if load.publishers else 100


class MqttBench:
    def __init__(self, settings: Settings, workdir: Path, log: Log) -> None:
        self.settings = settings
        self.workdir = workdir
        self.log = log
        self.started = time.perf_counter()
        self.scenarios = _scenarios(settings)
        self.report = MqttReport(_title(settings), self.scenarios)
        self.failures: Counter[tuple[str, str]] = Counter()

    def run(self) -> MqttReport:
        with ExitStack() as stack:
            discard = self._discard(stack)
            servers = [server for server in (self._mosquitto(stack), self._sluice(stack)) if server]
            for server in servers:
                for scenario in self.scenarios:
                    self.report.rows[(server.name, scenario.key)] = Row(server.name, scenario)
            for index in range(self.settings.rounds):
                for scenario in self.scenarios:
                    if not scenario.latency:
                        self._ceiling(discard, scenario, index)
                    for server in servers:
                        self._measure(server, scenario, index)
        self.report.targets = self._targets()
        if self.settings.quick:
            self.report.notes.append("--quick is a smoke run: its counts are too small for the figures "
                                     "or PASS/MISS to mean anything")
        return self.report

    def _discard(self, stack: ExitStack) -> int:
        (port,) = free_ports(1)
        process = subprocess.Popen([sys.executable, "-m", "bench.mqtt_discard", str(port)], cwd=REPO_ROOT,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
        stack.callback(stop_process_group, process, 5.0)
        wait_for_port(port, time.monotonic() + 30, process, "discard server")
        return port

    def _mosquitto(self, stack: ExitStack) -> Server | None:
        try:
            broker = stack.enter_context(mosquitto.throwaway_broker(self.workdir, self.log))
        except ServerUnavailable as error:
            self.log(f"[mqtt] Mosquitto skipped: {error}")
            self.report.notes.append(f"Mosquitto skipped: {str(error).splitlines()[0]}")
            return None
        self.report.notes.append(
            f"Mosquitto {broker.version}: persistence false, max_inflight_messages {mosquitto.MAX_INFLIGHT}, "
            f"max_queued_messages {mosquitto.MAX_QUEUED:,}, set_tcp_nodelay true (bench/mosquitto.py says why)")
        return Server(MOSQUITTO, broker.port, broker.pid, broker.output)

    def _sluice(self, stack: ExitStack) -> Server | None:
        try:
            server = stack.enter_context(mqtt_sluice.sluice_mqtt_server(self.workdir, self.log))
        except ServerUnavailable as error:
            first = str(error).splitlines()[0]
            self.log(f"[mqtt] {first}")
            self.report.notes.append(first)
            return None
        self.report.notes.append("Sluice: sluice serve --flush sync (a PUBACK means on disk; "
                                 "Mosquitto runs in memory)")
        return Server(SLUICE, server.port, server.pid, server.output)

    def _tag(self, scenario: Scenario, index: int) -> str:
        return f"{scenario.key}-r{index}-{os.getpid()}"

    def _ceiling(self, discard: int, scenario: Scenario, index: int) -> None:
        key = (CEILING, scenario.key)
        if self.failures[key] >= MAX_FAILURES:
            return
        try:
            result = ceiling(discard, scenario.build(self.settings, self._tag(scenario, index) + "-c"),
                             self.settings.timeout)
        except (RuntimeError, OSError) as error:
            self._failed(key, scenario, index, error, None)
            return
        self.report.ceilings.setdefault(scenario.key, []).append(result)
        self._progress(index, f"generator ceiling, {scenario.label}: publishers {result.publish_msg_per_s:,.0f} "
                              f"msg/s, subscribers {result.receive_msg_per_s:,.0f} msg/s")

    def _measure(self, server: Server, scenario: Scenario, index: int) -> None:
        key = (server.name, scenario.key)
        if self.failures[key] >= MAX_FAILURES:
            return
        try:
            result = measure(server, scenario.build(self.settings, self._tag(scenario, index)), self.settings.timeout)
        except (RuntimeError, OSError) as error:
            self._failed(key, scenario, index, error, server.output)
            return
        self.report.rows[key].results.append(result)
        latency = f", p50 {_ms(result.p50)} p99 {_ms(result.p99)}" if scenario.latency else ""
        self._progress(index, f"{server.name}, {scenario.label}: {result.msg_per_s:,.0f} msg/s "
                              f"({result.received:,} received, {result.lost:,} lost){latency}, CPU/msg broker "
                              f"{_us(result.broker_us_per_msg)} clients {_us(result.client_us_per_msg)}")

    def _progress(self, index: int, text: str) -> None:
        elapsed = time.perf_counter() - self.started
        self.log(f"[mqtt {elapsed:6.1f}s] round {index + 1}/{self.settings.rounds}  {text}")

    def _failed(self, key: tuple[str, str], scenario: Scenario, index: int, error: Exception,
                output: Path | None) -> None:
        self.failures[key] += 1
        more = "no further runs of it" if self.failures[key] >= MAX_FAILURES else "it runs again next round"
        self.log(f"[mqtt] {key[0]} {scenario.label} failed, {more}: {error}")
        if output is not None:
            self.log(f"[mqtt] end of the {key[0]} output:\n{tail([output], 30)}")
        lines = [line for line in str(error).splitlines() if line.strip()]
        self.report.notes.append(f"{key[0]} {scenario.label} failed in round {index + 1}: {lines[0]}"
                                 + (f" ... {lines[-1].strip()}" if len(lines) > 1 else ""))

    def _targets(self) -> list[Target]:
        targets = []
        for scenario in self.scenarios:
            mosq, sluice = self.report.row(MOSQUITTO, scenario.key), self.report.row(SLUICE, scenario.key)
            if sluice is None:
                continue
            if scenario.latency:
                p50 = sluice.latency()[0]
                targets.append(Target(f"Sluice {scenario.label}, p50", _ms(p50), f"< {_ms(LATENCY_GOAL)}",
                                      p50 < LATENCY_GOAL))
            elif mosq is not None:
                ratio = sluice.median().msg_per_s / mosq.median().msg_per_s
                targets.append(Target(f"Sluice/Mosquitto {scenario.label}", f"{ratio:.2f}x",
                                      f">= {THROUGHPUT_GOAL:.2f}x", ratio >= THROUGHPUT_GOAL))
        return targets


def _title(s: Settings) -> str:
    return "\n".join([
        f"mqtt benchmark: Sluice vs Mosquitto on this machine, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}; MQTT 3.1.1, {s.size}-byte payloads",
        f"{s.rounds} round(s), each: generator ceiling, Mosquitto, Sluice; figures are medians. "
        f"Runs: fan-in {s.publishers} x {s.fan_in_messages:,} (QoS 0) / {s.publishers} x {s.qos1_messages:,} (QoS 1), "
        f"fan-out {s.fan_out_messages:,} x {s.subscribers} subscribers, latency {s.latency_seconds:g} s each",
        "msg/s: received by the subscriber(s), first message to last; lost: published, never received; "
        "p50/p99: one-way publish-to-receive latency",
        "CPU/msg: CPU time per received message of the broker's processes and of the load processes",
    ])


def run_section(settings: Settings, workdir: Path, log: Log) -> MqttReport:
    """Run the MQTT benchmark in ``workdir`` and return its report."""
    return MqttBench(settings, workdir, log).run()
