"""The MQTT benchmark: Sluice's MQTT listener next to Mosquitto and RabbitMQ's MQTT plugin, same
load generator, same run.

Scenarios (100-byte payloads; MQTT 3.1.1, clean sessions; every publisher keeps at most
``window`` messages in flight that its slowest subscriber has not received, QoS 1 ones also at
most ``window`` unacknowledged):

- QoS 0 fan-in: 4 publisher processes to one topic, 1 subscriber.
- QoS 1 fan-in: the same at QoS 1.
- 1,000 devices: 4 publishers at QoS 1 round-robin over ``devices/<id>/telemetry`` (each its
  quarter of the ids), one subscriber to ``devices/+/telemetry`` at QoS 1; and the same with
  10,000 ids.
- fan-out: one publisher at QoS 0 to one topic, 50 subscribers over 2 processes (msg/s counts
  every delivery).
- latency: one publisher paced at 1,000 msg/s, one subscriber; at QoS 0 and QoS 1.

Every run lasts ``warmup`` + ``measured`` seconds. Throughput is what the subscribers received
inside the measured window divided by its length, and one-way latency (the send time is in each
payload; every 8th message, every message when paced) comes from that window too; messages a
subscriber never received are shown as lost. The load generator (``mqtt_load``: raw-socket
clients in spawned processes) is the same for every server. Its own ceiling is measured against
a discard server (``mqtt_discard``): the scenario's publishers alone against a server that only
acks (so bounded by nothing but PUBACKs), then its subscribers alone, flooded with pre-encoded
PUBLISH packets. A broker figure far below both is the broker's, not the generator's.

Each round runs every scenario against Mosquitto, RabbitMQ's MQTT plugin and Sluice
(``--flush sync``) in turn, the first round also against the discard server first; tables show
medians over rounds. Broker CPU per message is read from /proc for the broker's
process group over the measured window. Mosquitto or RabbitMQ is skipped, with the reason
printed, when it is not installed; Sluice until ``sluice serve`` has an MQTT listener.
"""
from __future__ import annotations

import os
import platform
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import mosquitto, mqtt_sluice, rabbitmq_mqtt
from .mqtt_discard import flood_filter
from .mqtt_load import PubSpec, Schedule, SubSpec, run_load
from .native_workloads import percentiles
from .processes import ServerUnavailable, free_ports, group_cpu_seconds, stop_process_group, tail, wait_for_port
from .report import Target, _render_targets, _table, microseconds_text as _us

Log = Callable[[str], None]

MOSQUITTO, RABBIT, SLUICE = "Mosquitto", "RabbitMQ", "Sluice"
BROKERS = (MOSQUITTO, RABBIT, SLUICE)
LATENCY_P50_GOAL = 0.3e-3
"""Sluice's p50 one-way latency at 1,000 msg/s, in seconds (p99: at most RabbitMQ's)."""
TARGETS = 9
"""Issue 15's MQTT targets: four ratios to Mosquitto, 10,000 topics to 1,000, p50 and p99 at
QoS 0 and QoS 1."""
CEILING_WARMUP, CEILING_MEASURED = 0.5, 2.0
"""Seconds of a ceiling run: the generator alone against the discard server is steady sooner."""
MAX_FAILURES = 2
REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Settings:
    rounds: int = 3
    publishers: int = 4
    size: int = 100
    window: int = 64
    devices: int = 1000
    many_devices: int = 10_000
    subscribers: int = 50
    subscriber_processes: int = 2
    """Processes the fan-out subscribers' connections are spread over."""
    latency_rate: int = 1000
    warmup: float = 2.0
    measured: float = 4.0
    """Seconds of each run left out of the statistics, then measured."""
    timeout: float = 60.0
    """Seconds a run may overrun its schedule before it is abandoned."""
    quick: bool = False

    @classmethod
    def smoke(cls) -> Settings:
        return cls(rounds=1, warmup=0.1, measured=0.3, timeout=30.0, quick=True)

    @property
    def schedule(self) -> Schedule:
        return Schedule(self.warmup, self.measured)


@dataclass(frozen=True)
class Load:
    """What one scenario run does: its publishers and subscribers."""

    publishers: list[PubSpec]
    subscribers: list[SubSpec]

    @property
    def connections(self) -> int:
        """Subscriber connections, each of which gets every message."""
        return sum(len(spec.connections) for spec in self.subscribers)


@dataclass(frozen=True)
class Scenario:
    key: str
    label: str
    build: Callable[[Settings, str], Load]
    """Makes the run's load; the string is unique per run, for client ids and topics."""
    latency: bool = False


def fan_in(s: Settings, tag: str, qos: int, clean: bool = True) -> Load:
    """``clean`` False: the subscriber keeps a persistent session (the cluster section's)."""
    topic = f"bench/{tag}"
    return Load([PubSpec(f"{tag}-pub{i}", (topic,), qos, size=s.size, window=s.window) for i in range(s.publishers)],
                [SubSpec(((f"{tag}-sub", topic, qos),), clean=clean)])


def devices(s: Settings, tag: str, count: int) -> Load:
    """Publisher ``i`` owns every ``publishers``-th device id and goes round them; ids are
    zero-padded so that every topic has the same length."""
    width = len(str(count - 1))
    topics = [f"devices/{device:0{width}d}/telemetry" for device in range(count)]
    return Load([PubSpec(f"{tag}-pub{i}", tuple(topics[i::s.publishers]), 1, size=s.size, window=s.window)
                 for i in range(s.publishers)],
                [SubSpec(((f"{tag}-sub", "devices/+/telemetry", 1),))])


def fan_out(s: Settings, tag: str) -> Load:
    topic = f"bench/{tag}"
    processes = max(1, min(s.subscriber_processes, s.subscribers))
    subscribers = [SubSpec(tuple((f"{tag}-sub{i}", topic, 0) for i in range(process, s.subscribers, processes)))
                   for process in range(processes)]
    return Load([PubSpec(f"{tag}-pub", (topic,), 0, size=s.size, window=s.window)], subscribers)


def latency(s: Settings, tag: str, qos: int) -> Load:
    topic = f"bench/{tag}"
    return Load([PubSpec(f"{tag}-pub", (topic,), qos, size=s.size, window=s.window, rate=s.latency_rate)],
                [SubSpec(((f"{tag}-sub", topic, qos),), sample_every=1)])


def _scenarios(s: Settings) -> list[Scenario]:
    return [
        Scenario("fanin0", f"QoS 0 fan-in {s.publishers} pub -> 1 sub", lambda s, t: fan_in(s, t, 0)),
        Scenario("fanin1", f"QoS 1 fan-in {s.publishers} pub (window {s.window}) -> 1 sub",
                 lambda s, t: fan_in(s, t, 1)),
        Scenario("devices", f"QoS 1 {s.devices:,} device topics -> devices/+/telemetry",
                 lambda s, t: devices(s, t, s.devices)),
        Scenario("many", f"QoS 1 {s.many_devices:,} device topics -> devices/+/telemetry",
                 lambda s, t: devices(s, t, s.many_devices)),
        Scenario("fanout", f"QoS 0 fan-out 1 pub -> {s.subscribers} subs", fan_out),
        Scenario("lat0", f"latency QoS 0 at {s.latency_rate:,} msg/s", lambda s, t: latency(s, t, 0), True),
        Scenario("lat1", f"latency QoS 1 at {s.latency_rate:,} msg/s", lambda s, t: latency(s, t, 1), True),
    ]


# -- results ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Result:
    """One scenario run against one server."""

    msg_per_s: float
    received: int
    """Inside the measured window."""
    lost: int
    p50: float
    p99: float
    """One-way latency percentiles in seconds."""
    broker_us_per_msg: float | None
    client_us_per_msg: float


@dataclass(frozen=True)
class Ceiling:
    """The generator's own rates for a scenario, against the discard server."""

    publish_msg_per_s: float
    receive_msg_per_s: float
    connections: int
    """Deliveries per publish in the scenario."""

    @property
    def deliveries_per_s(self) -> float:
        """The lower of what the publishers could feed and the subscribers could take."""
        return min(self.publish_msg_per_s * self.connections, self.receive_msg_per_s)


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
            ceiling = statistics.median_low(c.deliveries_per_s for c in ceilings)
            line = [scenario.label, f"{publish:,.0f}", f"{receive:,.0f}"]
            for server in BROKERS:
                row = self.row(server, scenario.key)
                line.append(f"{row.median().msg_per_s / ceiling:.0%}" if row and ceiling else "-")
            lines.append(line)
        if not lines:
            return ""
        header = ["generator ceiling (discard server)", "publishers msg/s", "subscribers msg/s",
                  *(f"{server} / ceiling" for server in BROKERS)]
        return _table(header, lines, right=lambda i: i >= 1)

    def _comparison(self) -> str:
        lines = []
        for scenario in self.scenarios:
            rows = [self.row(server, scenario.key) for server in BROKERS]
            mosq, sluice = rows[0], rows[2]
            if sluice is None or not any(rows[:2]):
                continue
            cells = [_figure(row, scenario) for row in rows]
            ratio = "-"
            if mosq and not scenario.latency and mosq.median().msg_per_s:
                ratio = f"{sluice.median().msg_per_s / mosq.median().msg_per_s:.2f}x"
            lines.append([scenario.label, *cells, ratio])
        if not lines:
            return ""
        return _table(["scenario", "Mosquitto", "RabbitMQ MQTT", "Sluice", "Sluice/Mosquitto"], lines,
                      right=lambda i: i >= 1)


def _figure(row: Row | None, scenario: Scenario) -> str:
    if row is None:
        return "-"
    if scenario.latency:
        p50, p99 = row.latency()
        return f"{p50 * 1e3:,.2f} / {p99 * 1e3:,.2f} ms"
    return f"{row.median().msg_per_s:,.0f} msg/s"


def _render_rows(rows: list[Row]) -> str:
    header = ["server", "scenario", "runs", "msg/s", "msg/s min..max", "lost", "p50", "p99",
              "broker CPU/msg", "clients CPU/msg"]
    lines = []
    for row in rows:
        median = row.median()
        rates = [r.msg_per_s for r in row.results]
        p50, p99 = row.latency()
        broker = [r.broker_us_per_msg for r in row.results if r.broker_us_per_msg is not None]
        lines.append([row.server, row.scenario.label, str(len(row.results)), f"{median.msg_per_s:,.0f}",
                      f"{min(rates):,.0f}..{max(rates):,.0f}", f"{median.lost:,}", _ms(p50), _ms(p99),
                      _us(statistics.median_low(broker) if broker else None),
                      _us(statistics.median_low(r.client_us_per_msg for r in row.results))])
    return _table(header, lines, right=lambda i: i >= 2)


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:,.3f} ms"


# -- servers ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Server:
    name: str
    port: int | tuple[str, int]
    """A loopback port, or (host, port) of a cluster node."""
    group: int | None
    """Process group whose CPU time each run reports."""
    output: Path | None = None


def measure(server: Server, load: Load, settings: Settings) -> Result:
    """Run ``load`` against ``server`` and sum it up."""
    probe = (lambda: group_cpu_seconds(server.group)) if server.group else None
    run = run_load(server.port, load.publishers, load.subscribers, settings.timeout, settings.schedule, probe)
    if run.window_received == 0:
        raise RuntimeError(f"the subscribers received nothing in the measured window "
                           f"({run.received:,} of {run.expected:,} messages in all)")
    p50, p99 = percentiles(run.latencies_ns)
    broker = None if run.probed is None else run.probed / run.window_received * 1e6
    return Result(run.msg_per_s, run.window_received, run.lost, p50 / 1e9, p99 / 1e9, broker,
                  run.client_cpu / max(1, run.received) * 1e6)


def ceiling(discard_port: int, load: Load, settings: Settings) -> Ceiling:
    """The generator's rates for ``load`` against the discard server: its publishers alone (bounded
    by PUBACKs only), then its subscribers alone, flooded."""
    schedule = Schedule(min(settings.warmup, CEILING_WARMUP), min(settings.measured, CEILING_MEASURED))
    published = run_load(discard_port, load.publishers, [], settings.timeout, schedule)
    flooded = [SubSpec(tuple((client_id, flood_filter(qos, settings.size), qos)
                             for client_id, _, qos in spec.connections), sample_every=0)
               for spec in load.subscribers]
    received = run_load(discard_port, [], flooded, settings.timeout, schedule)
    return Ceiling(published.publish_msg_per_s, received.msg_per_s, load.connections)


@contextmanager
def discard_server() -> Iterator[int]:
    """The discard server on a free loopback port, for the generator's ceiling."""
    (port,) = free_ports(1)
    process = subprocess.Popen([sys.executable, "-m", "bench.mqtt_discard", str(port)], cwd=REPO_ROOT,
                               stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_for_port(port, time.monotonic() + 30, process, "discard server")
        yield port
    finally:
        stop_process_group(process, 5.0)


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
            discard = stack.enter_context(discard_server())
            servers = [server for server in (self._mosquitto(stack), self._rabbitmq(stack), self._sluice(stack))
                       if server]
            for server in servers:
                for scenario in self.scenarios:
                    self.report.rows[(server.name, scenario.key)] = Row(server.name, scenario)
            for index in range(self.settings.rounds):
                for scenario in self.scenarios:
                    if not scenario.latency and index == 0:
                        self._ceiling(discard, scenario, index)
                    for server in servers:
                        self._measure(server, scenario, index)
        self.report.targets = self._targets()
        if self.settings.quick:
            self.report.notes.append("--quick is a smoke run: its runs are too short for the figures "
                                     "or PASS/MISS to mean anything")
        return self.report

    def _start(self, stack: ExitStack, name: str, context: Any) -> Any:
        """Enter a broker's context; None, with the reason noted, when it is unavailable."""
        try:
            return stack.enter_context(context)
        except ServerUnavailable as error:
            first = str(error).splitlines()[0]
            self.log(f"[mqtt] {name} skipped: {error}")
            self.report.notes.append(f"{name} skipped: {first}")
            return None

    def _mosquitto(self, stack: ExitStack) -> Server | None:
        broker = self._start(stack, MOSQUITTO, mosquitto.throwaway_broker(self.workdir, self.log))
        if broker is None:
            return None
        self.report.notes.append(
            f"Mosquitto {broker.version}: persistence false, max_inflight_messages {mosquitto.MAX_INFLIGHT}, "
            f"max_queued_messages {mosquitto.MAX_QUEUED:,}, set_tcp_nodelay true (bench/mosquitto.py says why)")
        return Server(MOSQUITTO, broker.port, broker.pid, broker.output)

    def _rabbitmq(self, stack: ExitStack) -> Server | None:
        node = self._start(stack, RABBIT, rabbitmq_mqtt.throwaway_mqtt_node(self.workdir, self.log))
        if node is None:
            return None
        self.report.notes.append(
            f"RabbitMQ {node.version}: the rabbitmq_mqtt plugin, mqtt.prefetch {rabbitmq_mqtt.PREFETCH} "
            f"(bench/rabbitmq_mqtt.py says why); messages are not persisted for clean sessions")
        return Server(RABBIT, node.port, node.pid, node.output)

    def _sluice(self, stack: ExitStack) -> Server | None:
        server = self._start(stack, SLUICE, mqtt_sluice.sluice_mqtt_server(self.workdir, self.log))
        if server is None:
            return None
        self.report.notes.append("Sluice: sluice serve --flush sync (a PUBACK means on disk; "
                                 "Mosquitto runs in memory)")
        return Server(SLUICE, server.port, server.pid, server.output)

    def _tag(self, scenario: Scenario, index: int) -> str:
        return f"{scenario.key}-r{index}-{os.getpid()}"

    def _ceiling(self, discard: int, scenario: Scenario, index: int) -> None:
        key = ("generator", scenario.key)
        if self.failures[key] >= MAX_FAILURES:
            return
        try:
            result = ceiling(discard, scenario.build(self.settings, self._tag(scenario, index) + "c"), self.settings)
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
        load = scenario.build(self.settings, self._tag(scenario, index))
        try:
            result = measure(server, load, self.settings)
        except (RuntimeError, OSError) as error:
            self._failed(key, scenario, index, error, server.output)
            return
        self.report.rows[key].results.append(result)
        if result.lost and any(spec.qos for spec in load.publishers):
            self.report.notes.append(f"{server.name} {scenario.label} lost {result.lost:,} QoS 1 messages "
                                     f"in round {index + 1}")
        self._progress(index, f"{server.name}, {scenario.label}: {result.msg_per_s:,.0f} msg/s "
                              f"({result.received:,} in the window, {result.lost:,} lost), p50 {_ms(result.p50)} "
                              f"p99 {_ms(result.p99)}, CPU/msg broker {_us(result.broker_us_per_msg)} "
                              f"clients {_us(result.client_us_per_msg)}")

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
        """Issue 15's targets, each where its figures were measured."""
        targets = []
        for key, goal in (("fanin0", 0.5), ("fanin1", 0.6), ("devices", 0.6), ("fanout", 1.0)):
            target = self._ratio_target(f"Sluice/Mosquitto {self._label(key)}", SLUICE, key, MOSQUITTO, key, goal)
            targets += [target] if target else []
        target = self._ratio_target(f"Sluice {self._label('many')} / {self.settings.devices:,} topics",
                                    SLUICE, "many", SLUICE, "devices", 0.9)
        targets += [target] if target else []
        for key in ("lat0", "lat1"):
            sluice, rabbit = self.report.row(SLUICE, key), self.report.row(RABBIT, key)
            if sluice is None:
                continue
            p50, p99 = sluice.latency()
            targets.append(Target(f"Sluice {self._label(key)}, p50", _ms(p50), f"<= {_ms(LATENCY_P50_GOAL)}",
                                  p50 <= LATENCY_P50_GOAL))
            if rabbit is not None:
                theirs = rabbit.latency()[1]
                targets.append(Target(f"Sluice {self._label(key)}, p99", _ms(p99), f"<= {_ms(theirs)} (RabbitMQ)",
                                      p99 <= theirs))
        if len(targets) < TARGETS:
            self.report.notes.append(f"{TARGETS - len(targets)} of issue 15's {TARGETS} MQTT targets could not be "
                                     f"checked: a broker or a run they compare is missing (see above)")
        return targets

    def _ratio_target(self, name: str, server: str, key: str, base_server: str, base_key: str,
                      goal: float) -> Target | None:
        row, base = self.report.row(server, key), self.report.row(base_server, base_key)
        if row is None or base is None or not base.median().msg_per_s:
            return None
        ratio = row.median().msg_per_s / base.median().msg_per_s
        return Target(name, f"{ratio:.2f}x", f">= {goal:.2f}x", ratio >= goal)

    def _label(self, key: str) -> str:
        return next(scenario.label for scenario in self.scenarios if scenario.key == key)


def _title(s: Settings) -> str:
    return "\n".join([
        f"mqtt benchmark: Sluice vs Mosquitto and RabbitMQ's MQTT plugin on this machine, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}; MQTT 3.1.1 clean sessions, {s.size}-byte payloads",
        f"{s.rounds} round(s), each scenario: generator ceiling (first round), Mosquitto, RabbitMQ, Sluice; "
        f"figures are medians. Each run: {s.warmup:g} s warm-up, then {s.measured:g} s measured; every publisher "
        f"keeps at most {s.window} messages its slowest subscriber has not received (QoS 1: and not acknowledged)",
        "msg/s: received by the subscriber(s) in the measured window; lost: published, never received; "
        "p50/p99: one-way publish-to-receive latency in the measured window",
        "CPU/msg: CPU time per received message of the broker's processes (measured window) and of the "
        "load processes (whole run)",
    ])


def run_section(settings: Settings, workdir: Path, log: Log) -> MqttReport:
    """Run the MQTT benchmark in ``workdir`` and return its report."""
    return MqttBench(settings, workdir, log).run()
