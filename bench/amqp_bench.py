"""The AMQP benchmark: Sluice's AMQP 0-9-1 listener next to RabbitMQ, same clients, same run.

Scenarios, every one with persistent messages (``delivery_mode=2``), publisher confirms (each
publisher keeps at most ``window`` publishes unconfirmed), durable queues, manual acks as
deliveries arrive and consumer prefetch ``prefetch``; 1 KiB payloads:

- one durable queue: one publisher to the default exchange, one consumer;
- 256 durable queues: ``publishers`` publisher processes, each going round its share of the
  queues, and ``consumer_processes`` consumer processes, each consuming its share;
- topic fan-out: one publisher to a topic exchange bound by 50 durable queues (patterns
  ``bench.*.<i>``-like, all matching), consumed by ``consumer_processes`` processes; msg/s is
  all deliveries;
- latency: one publisher paced at 1,000 msg/s into one durable queue, one consumer; one-way
  latency from the publish (stamped in the payload) to the delivery, p50 and p99.

The load generator (``amqp_load``: pika in spawned processes) is the same for both brokers.
Topology is declared before each run by this process over a pika ``BlockingConnection``, with
names fresh for the run, and deleted after it. Figures leave out a warm-up (``warmup`` of each
run's messages). Rounds alternate RabbitMQ, then Sluice, scenario by scenario, and tables show
medians over rounds; broker CPU per message is read from /proc for each broker's process group.
RabbitMQ is skipped, with the reason printed, when it is not installed.
"""
from __future__ import annotations

import os
import platform
import statistics
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pika

from . import rabbitmq
from .amqp_load import PubSpec, SubSpec, run_load
from .native_workloads import percentiles
from .processes import LOOPBACK, ServerUnavailable, group_cpu_seconds, tail
from .report import Target, _render_targets, _table, microseconds_text as _us
from .sluice_server import serve_process

Log = Callable[[str], None]

RABBIT, SLUICE = "RabbitMQ", "Sluice"
THROUGHPUT_GOAL = 1.0
"""Sluice's msg/s in every throughput scenario, as a share of RabbitMQ's."""
MAX_FAILURES = 2


@dataclass(frozen=True)
class Settings:
    rounds: int = 3
    size: int = 1024
    window: int = 256
    """Unconfirmed publishes per publisher, at most."""
    prefetch: int = 100
    single_messages: int = 20_000
    queues: int = 256
    queue_messages: int = 10_000
    """Per publisher process in the 256-queue scenario."""
    publishers: int = 4
    consumer_processes: int = 2
    fan_out_queues: int = 50
    fan_out_messages: int = 2_000
    """Published once; each of the ``fan_out_queues`` queues gets every one."""
    latency_rate: int = 1000
    latency_seconds: float = 10.0
    warmup: float = 0.2
    timeout: float = 180.0
    quick: bool = False

    @classmethod
    def smoke(cls) -> Settings:
        return cls(rounds=1, single_messages=1_000, queues=16, queue_messages=250, fan_out_queues=10,
                   fan_out_messages=100, latency_seconds=1.0, timeout=60.0, quick=True)


@dataclass(frozen=True)
class Topology:
    """What a run declares: an exchange (``""``: the default one) and queues with their binding
    keys (none: the default exchange routes by name)."""

    exchange: str
    exchange_type: str
    bindings: dict[str, str]
    queues: tuple[str, ...]
    queue_arguments: dict[str, str] = field(default_factory=dict)
    """``x-`` arguments of every queue (``x-queue-type``)."""


@dataclass(frozen=True)
class Load:
    topology: Topology
    publishers: list[PubSpec]
    consumers: list[SubSpec]


@dataclass(frozen=True)
class Scenario:
    key: str
    label: str
    build: Callable[[Settings, str], Load]
    latency: bool = False


def _split(items: tuple[str, ...], parts: int) -> list[tuple[str, ...]]:
    parts = max(1, min(parts, len(items)))
    return [items[i::parts] for i in range(parts)]


def one_queue(s: Settings, tag: str) -> Load:
    name = f"bench-{tag}"
    return Load(Topology("", "direct", {}, (name,)),
                [PubSpec("", (name,), s.single_messages, s.size, s.window)],
                [SubSpec((name,), s.single_messages, s.prefetch, s.warmup)])


def many_queues(s: Settings, tag: str) -> Load:
    names = tuple(f"bench-{tag}-{i}" for i in range(s.queues))
    publishers = [PubSpec("", share, s.queue_messages, s.size, s.window) for share in _split(names, s.publishers)]
    routed = Counter({name: 0 for name in names})
    for spec in publishers:  # message j of a publisher goes to routing_keys[j % len(routing_keys)]
        whole, extra = divmod(spec.messages, len(spec.routing_keys))
        routed.update({name: whole + (k < extra) for k, name in enumerate(spec.routing_keys)})
    consumers = [SubSpec(share, sum(routed[name] for name in share), s.prefetch, s.warmup)
                 for share in _split(names, s.consumer_processes)]
    return Load(Topology("", "direct", {}, names), publishers, consumers)


def fan_out(s: Settings, tag: str) -> Load:
    exchange = f"bench-{tag}"
    names = tuple(f"bench-{tag}-{i}" for i in range(s.fan_out_queues))
    patterns = ("bench.#", "bench.*.x", "*.fan.*", "#.x", "bench.fan.x")
    bindings = {name: patterns[i % len(patterns)] for i, name in enumerate(names)}
    consumers = [SubSpec(share, s.fan_out_messages * len(share), s.prefetch, s.warmup)
                 for share in _split(names, s.consumer_processes)]
    return Load(Topology(exchange, "topic", bindings, names),
                [PubSpec(exchange, ("bench.fan.x",), s.fan_out_messages, s.size, s.window)], consumers)


def latency(s: Settings, tag: str) -> Load:
    name = f"bench-{tag}"
    messages = max(1, int(s.latency_rate * s.latency_seconds))
    return Load(Topology("", "direct", {}, (name,)),
                [PubSpec("", (name,), messages, s.size, s.window, rate=s.latency_rate)],
                [SubSpec((name,), messages, s.prefetch, s.warmup)])


def _scenarios(s: Settings) -> list[Scenario]:
    return [
        Scenario("single", "1 durable queue, 1 pub -> 1 consumer", one_queue),
        Scenario("queues", f"{s.queues} durable queues, {s.publishers} pub -> {s.consumer_processes} consumers",
                 many_queues),
        Scenario("fanout", f"topic exchange -> {s.fan_out_queues} queues", fan_out),
        Scenario("latency", f"latency at {s.latency_rate:,} msg/s", latency, latency=True),
    ]


# -- topology ---------------------------------------------------------------------------------

@contextmanager
def declared(url: str, topology: Topology) -> Iterator[None]:
    """Declare ``topology`` (durable) for one run; delete its queues and exchange afterwards."""
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        channel = connection.channel()
        if topology.exchange:
            channel.exchange_declare(topology.exchange, topology.exchange_type, durable=True)
        for name in topology.queues:
            channel.queue_declare(name, durable=True, arguments=topology.queue_arguments or None)
            if topology.exchange:
                channel.queue_bind(name, topology.exchange, topology.bindings[name])
        yield
        for name in topology.queues:
            channel.queue_delete(name)
        if topology.exchange:
            channel.exchange_delete(topology.exchange)
    finally:
        if connection.is_open:
            connection.close()


# -- results ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Result:
    """One scenario run against one broker."""

    msg_per_s: float
    publish_msg_per_s: float
    """Confirmed publishes per second, first publish to last confirm, warm-up included."""
    received: int
    p50: float
    p99: float
    """One-way latency percentiles in seconds, after the warm-up."""
    broker_us_per_msg: float | None
    client_us_per_msg: float


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

    def broker_cpu(self) -> float | None:
        values = [r.broker_us_per_msg for r in self.results if r.broker_us_per_msg is not None]
        return statistics.median_low(values) if values else None


@dataclass
class AmqpReport:
    title: str
    scenarios: list[Scenario]
    rows: dict[tuple[str, str], Row] = field(default_factory=dict)
    targets: list[Target] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def row(self, server: str, key: str) -> Row | None:
        row = self.rows.get((server, key))
        return row if row and row.results else None

    def render(self) -> str:
        rows = [row for row in self.rows.values() if row.results]
        parts = [self.title, "", _render_rows(rows) if rows else "no broker runs (see the notes)"]
        comparison = self._comparison()
        if comparison:
            parts += ["", comparison]
        if self.targets:
            parts += ["", _render_targets(self.targets)]
        if self.notes:
            parts += [""] + [f"note: {note}" for note in self.notes]
        return "\n".join(parts)

    def _comparison(self) -> str:
        lines = []
        for scenario in self.scenarios:
            rabbit, sluice = self.row(RABBIT, scenario.key), self.row(SLUICE, scenario.key)
            if not (rabbit and sluice):
                continue
            if scenario.latency:
                ratio = sluice.latency()[1] / rabbit.latency()[1] if rabbit.latency()[1] else 0.0
                lines.append([scenario.label, _latency_text(rabbit), _latency_text(sluice), f"p99 {ratio:.2f}x"])
            else:
                r, s = rabbit.median().msg_per_s, sluice.median().msg_per_s
                lines.append([scenario.label, f"{r:,.0f} msg/s", f"{s:,.0f} msg/s", f"{s / r:.2f}x" if r else "-"])
            lines.append(["  broker CPU per message", _us(rabbit.broker_cpu()), _us(sluice.broker_cpu()), ""])
        if not lines:
            return ""
        return _table(["scenario", "RabbitMQ", "Sluice", "Sluice/RabbitMQ"], lines, right=lambda i: i >= 1)


def _render_rows(rows: list[Row]) -> str:
    header = ["broker", "scenario", "runs", "msg/s", "msg/s min..max", "p50", "p99", "broker CPU/msg",
              "clients CPU/msg"]
    lines = []
    for row in rows:
        median = row.median()
        rates = [r.msg_per_s for r in row.results]
        p50, p99 = row.latency()
        lines.append([row.server, row.scenario.label, str(len(row.results)), f"{median.msg_per_s:,.0f}",
                      f"{min(rates):,.0f}..{max(rates):,.0f}", _ms(p50), _ms(p99), _us(row.broker_cpu()),
                      _us(statistics.median_low(r.client_us_per_msg for r in row.results))])
    return _table(header, lines, right=lambda i: i >= 2)


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:,.2f} ms"


def _latency_text(row: Row) -> str:
    p50, p99 = row.latency()
    return f"p50 {p50 * 1e3:,.2f} / p99 {p99 * 1e3:,.2f} ms"


# -- brokers ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Broker:
    name: str
    url: str
    group: int
    """Process group whose CPU time each run reports."""
    output: Path


def measure(broker: Broker, load: Load, timeout: float) -> Result:
    """Declare ``load``'s topology on ``broker``, run it, and sum it up."""
    with declared(broker.url, load.topology):
        before = group_cpu_seconds(broker.group)
        run = run_load(broker.url, load.publishers, load.consumers, timeout)
        after = group_cpu_seconds(broker.group)
    if run.received != run.expected:
        raise RuntimeError(f"the consumers received {run.received:,} of {run.expected:,} messages")
    p50, p99 = percentiles(run.latencies_ns)
    cpu = None if before is None or after is None else (after - before) / run.received * 1e6
    return Result(run.msg_per_s, run.publish_msg_per_s, run.received, p50 / 1e9, p99 / 1e9, cpu,
                  run.client_cpu / run.received * 1e6)


class AmqpBench:
    def __init__(self, settings: Settings, workdir: Path, log: Log) -> None:
        self.settings = settings
        self.workdir = workdir
        self.log = log
        self.started = time.perf_counter()
        self.scenarios = _scenarios(settings)
        self.report = AmqpReport(_title(settings), self.scenarios)
        self.failures: Counter[tuple[str, str]] = Counter()

    def run(self) -> AmqpReport:
        with ExitStack() as stack:
            brokers = [broker for broker in (self._rabbit(stack), self._sluice(stack)) if broker]
            for broker in brokers:
                for scenario in self.scenarios:
                    self.report.rows[(broker.name, scenario.key)] = Row(broker.name, scenario)
            for index in range(self.settings.rounds):
                for scenario in self.scenarios:
                    for broker in brokers:
                        self._measure(broker, scenario, index)
        self.report.targets = self._targets()
        if self.settings.quick:
            self.report.notes.append("--quick is a smoke run: its counts are too small for the figures "
                                     "or PASS/MISS to mean anything")
        return self.report

    def _rabbit(self, stack: ExitStack) -> Broker | None:
        try:
            node = stack.enter_context(rabbitmq.throwaway_node(self.workdir, self.log))
        except ServerUnavailable as error:
            self.log(f"[amqp] RabbitMQ skipped: {error}")
            self.report.notes.append(f"RabbitMQ skipped: {str(error).splitlines()[0]}")
            return None
        self.report.notes.append(f"RabbitMQ {node.version}: classic durable queues, default settings")
        return Broker(RABBIT, node.url, node.pid, node.directory / "server-output.log")

    def _sluice(self, stack: ExitStack) -> Broker | None:
        try:
            running = stack.enter_context(serve_process(self.workdir, wait_for=("--amqp-port",),
                                                        prefix="sluice-amqp-"))
        except (ServerUnavailable, KeyError) as error:
            first = str(error).splitlines()[0]
            self.log(f"[amqp] Sluice skipped: {first}")
            self.report.notes.append(f"Sluice skipped: {first}")
            return None
        port = running.ports["--amqp-port"]
        self.log(f"Sluice up with --flush sync, AMQP on {LOOPBACK}:{port} "
                 f"after {time.monotonic() - running.started:.1f}s")
        self.report.notes.append("Sluice: sluice serve --flush sync (a confirm means on disk, after an fsync)")
        return Broker(SLUICE, f"amqp://guest:guest@{LOOPBACK}:{port}/%2F", running.pid,
                      running.directory / "server-output.log")

    def _measure(self, broker: Broker, scenario: Scenario, index: int) -> None:
        key = (broker.name, scenario.key)
        if self.failures[key] >= MAX_FAILURES:
            return
        tag = f"{scenario.key}-r{index}-{os.getpid()}"
        try:
            result = measure(broker, scenario.build(self.settings, tag), self.settings.timeout)
        except (RuntimeError, OSError, pika.exceptions.AMQPError) as error:
            self._failed(key, scenario, index, error, broker.output)
            return
        self.report.rows[key].results.append(result)
        latency = f", p50 {_ms(result.p50)} p99 {_ms(result.p99)}" if scenario.latency else ""
        elapsed = time.perf_counter() - self.started
        self.log(f"[amqp {elapsed:6.1f}s] round {index + 1}/{self.settings.rounds}  {broker.name}, "
                 f"{scenario.label}: {result.msg_per_s:,.0f} msg/s (publishers "
                 f"{result.publish_msg_per_s:,.0f} confirmed/s){latency}, CPU/msg broker "
                 f"{_us(result.broker_us_per_msg)} clients {_us(result.client_us_per_msg)}")

    def _failed(self, key: tuple[str, str], scenario: Scenario, index: int, error: Exception,
                output: Path) -> None:
        self.failures[key] += 1
        more = "no further runs of it" if self.failures[key] >= MAX_FAILURES else "it runs again next round"
        self.log(f"[amqp] {key[0]} {scenario.label} failed, {more}: {error!r}")
        self.log(f"[amqp] end of the {key[0]} output:\n{tail([output], 30)}")
        lines = [line for line in (str(error) or repr(error)).splitlines() if line.strip()]
        self.report.notes.append(f"{key[0]} {scenario.label} failed in round {index + 1}: {lines[0]}"
                                 + (f" ... {lines[-1].strip()}" if len(lines) > 1 else ""))

    def _targets(self) -> list[Target]:
        targets = []
        for scenario in self.scenarios:
            rabbit, sluice = self.report.row(RABBIT, scenario.key), self.report.row(SLUICE, scenario.key)
            if not (rabbit and sluice):
                continue
            if scenario.latency:
                ours, theirs = sluice.latency()[1], rabbit.latency()[1]
                targets.append(Target(f"Sluice {scenario.label}, p99", _ms(ours), f"<= {_ms(theirs)}",
                                      ours <= theirs))
            else:
                ratio = sluice.median().msg_per_s / rabbit.median().msg_per_s
                targets.append(Target(f"Sluice/RabbitMQ {scenario.label}", f"{ratio:.2f}x",
                                      f">= {THROUGHPUT_GOAL:.2f}x", ratio >= THROUGHPUT_GOAL))
        return targets


def _title(s: Settings) -> str:
    return "\n".join([
        f"amqp benchmark: Sluice vs RabbitMQ on this machine, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}; AMQP 0-9-1 through pika, {s.size}-byte persistent messages, "
        f"publisher confirms (window {s.window}), manual acks, prefetch {s.prefetch}",
        f"{s.rounds} round(s), each scenario RabbitMQ then Sluice; figures are medians. Runs: 1 queue "
        f"{s.single_messages:,}, {s.queues} queues {s.publishers} x {s.queue_messages:,}, fan-out "
        f"{s.fan_out_messages:,} x {s.fan_out_queues} queues, latency {s.latency_seconds:g} s; "
        f"the first {s.warmup:.0%} of each run is warm-up",
        "msg/s: delivered to the consumers after warm-up; p50/p99: one-way publish-to-delivery latency",
        "CPU/msg: CPU time per delivered message of the broker's processes and of the client processes",
    ])


def run_section(settings: Settings, workdir: Path, log: Log) -> AmqpReport:
    """Run the AMQP benchmark in ``workdir`` and return its report."""
    return AmqpBench(settings, workdir, log).run()
