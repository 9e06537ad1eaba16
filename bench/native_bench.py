"""The native benchmark: Sluice next to RabbitMQ, both started by this run, on the same machine.

Workload, the same for both brokers: persistent messages of 100 B and 1 KiB sent to a durable
destination, each send confirmed once durable (RabbitMQ publisher confirms with ``window``
unconfirmed publishes; Sluice ``window`` concurrent awaited ``Producer.send`` calls against a
broker with sync flush), and a consumer acknowledging each message (RabbitMQ manual acks with
prefetch; Sluice ``SimpleConsumer`` receive and ack). A run publishes ``messages`` and ends when
the consumer has acknowledged the last; msg/s is end to end. Send latency is from a send call
until its confirm.

Sluice alone also runs a batched stream: ``Producer.send_packed`` of ``pack`` 100-byte bodies
per request, read back by a ``PullConsumer`` that unpacks every batch (target >= 1M msg/s).

Rounds alternate RabbitMQ, then Sluice, ``rounds`` times, and the tables show medians, since a
shared machine is noisy; CPU time per message, of the broker and of its clients, is shown too,
as it moves less than rates do. Each broker is started once for the section, as a child process,
on free loopback ports; publisher and consumer are two further processes per run. A broker that
is not installed (or not built yet) is skipped with the reason in the notes.
"""
from __future__ import annotations

import os
import platform
import statistics
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import ModuleType

from . import rabbitmq
from .native_workloads import Child, Job, Run, run_pair
from .processes import ServerUnavailable, tail
from .report import Target, _render_targets, _table, microseconds_text as _us
from .sluice_server import sluice_server

Log = Callable[[str], None]

SIZES = (100, 1024)
PACKED_SIZE = 100
PACKED_TARGET = 1_000_000
RABBIT, SLUICE, PACKED = "RabbitMQ", "Sluice", "Sluice packed"
MAX_FAILURES = 2
"""Failed runs after which a workload is not run again."""


@dataclass(frozen=True)
class Settings:
    """How much each run moves and how often it is repeated."""

    messages: int = 20_000
    """Messages per run of the confirmed send/ack workload."""
    packed_messages: int = 5_000_000
    """Bodies per run of the packed stream workload."""
    pack: int = 5_000
    """Bodies per ``send_packed`` call."""
    rounds: int = 3
    window: int = 256
    """Sends in flight: unconfirmed publishes (RabbitMQ), concurrent awaited sends (Sluice)."""
    prefetch: int = 256
    """Unacknowledged deliveries the consumer may hold."""
    packed_window: int = 4
    """Concurrent ``send_packed`` calls."""
    sizes: tuple[int, ...] = SIZES
    quick: bool = False

    @classmethod
    def smoke(cls, messages: int | None = None) -> Settings:
        """A smoke run of a few seconds per broker (plus their start-up), 100-byte bodies only."""
        return cls(messages=messages or 1_000, packed_messages=100_000, pack=1_000, rounds=1,
                   sizes=(100,), quick=True)


def size_label(size: int) -> str:
    return f"{size // 1024} KiB" if size % 1024 == 0 else f"{size} B"


@dataclass
class Row:
    """One line of the results table: one broker and workload, run once per round."""

    broker: str
    workload: str
    size: int
    runs: list[Run] = field(default_factory=list)

    def median(self) -> Run:
        ordered = sorted(self.runs, key=lambda run: run.msg_per_s)
        return ordered[(len(ordered) - 1) // 2]

    def latency(self) -> tuple[float, float]:
        """Median over runs of each run's p50, and of each run's p99 (seconds)."""
        return (statistics.median_low(run.p50 for run in self.runs),
                statistics.median_low(run.p99 for run in self.runs))

    def cpu(self) -> tuple[float | None, float]:
        """Median over runs of broker and of client CPU microseconds per message."""
        broker = [run.broker_us_per_msg for run in self.runs if run.broker_us_per_msg is not None]
        return (statistics.median_low(broker) if broker else None,
                statistics.median_low(run.client_us_per_msg for run in self.runs))


@dataclass
class NativeReport:
    """What the native section measured, ready to print."""

    title: str
    rows: dict[str, Row] = field(default_factory=dict)
    targets: list[Target] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def median(self, key: str) -> Run | None:
        row = self.rows.get(key)
        return row.median() if row and row.runs else None

    def render(self) -> str:
        rows = [row for row in self.rows.values() if row.runs]
        parts = [self.title, "", _render_rows(rows) if rows else "no runs (see the notes)"]
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
        for size in SIZES:
            rabbit, sluice = self.rows.get(_key(RABBIT, size)), self.rows.get(_key(SLUICE, size))
            if not (rabbit and rabbit.runs and sluice and sluice.runs):
                continue
            r, s = rabbit.median(), sluice.median()
            lines.append([size_label(size), f"{r.msg_per_s:,.0f}", f"{s.msg_per_s:,.0f}",
                          f"{s.msg_per_s / r.msg_per_s:.2f}x", _latency_text(rabbit), _latency_text(sluice),
                          f"{_us(rabbit.cpu()[0])} / {_us(sluice.cpu()[0])}"])
        if not lines:
            return ""
        header = ["size", "RabbitMQ msg/s", "Sluice msg/s", "Sluice/RabbitMQ", "RabbitMQ send p50/p99",
                  "Sluice send p50/p99", "broker CPU/msg RabbitMQ / Sluice"]
        return _table(header, lines, right=lambda i: i >= 1)


def _render_rows(rows: list[Row]) -> str:
    header = ["broker", "workload", "size", "runs", "msg/s", "msg/s min..max", "publish msg/s",
              "send p50", "send p99", "broker CPU/msg", "clients CPU/msg"]
    lines = []
    for row in rows:
        median = row.median()
        rates = [run.msg_per_s for run in row.runs]
        p50, p99 = row.latency()
        broker_cpu, client_cpu = row.cpu()
        lines.append([row.broker, row.workload, size_label(row.size), str(len(row.runs)),
                      f"{median.msg_per_s:,.0f}", f"{min(rates):,.0f}..{max(rates):,.0f}",
                      f"{median.publish_msg_per_s:,.0f}", _ms(p50), _ms(p99), _us(broker_cpu),
                      _us(client_cpu)])
    return _table(header, lines, right=lambda i: i >= 3)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.2f} ms"


def _latency_text(row: Row) -> str:
    p50, p99 = row.latency()
    return f"{p50 * 1e3:,.1f} / {p99 * 1e3:,.1f} ms"


def _key(broker: str, size: int) -> str:
    return f"{broker}-{size}"


def _nothing(_destination: str) -> None:
    pass


@dataclass(frozen=True)
class _Broker:
    """A started broker, the client functions that drive it, and what a run needs set up."""

    name: str
    target: str
    publish: Child
    consume: Child
    group: int | None = None
    """The broker's process group, whose CPU time each run reports."""
    credentials: tuple[str, str] = ("", "")
    create: Callable[[str], None] = _nothing
    """Makes a run's destination before the clients start (RabbitMQ's clients declare it)."""
    delete: Callable[[str], None] = _nothing
    output: Path | None = None
    """The broker's console output, whose end is printed when a run fails."""


class NativeBench:
    """One run of the native section in ``workdir``."""

    def __init__(self, settings: Settings, workdir: Path, log: Log) -> None:
        self.settings = settings
        self.workdir = workdir
        self.log = log
        self.started = time.perf_counter()
        self.report = NativeReport(_title(settings))
        self.failures: Counter[str] = Counter()

    def run(self) -> NativeReport:
        with ExitStack() as brokers:
            rabbit, sluice = self._start_brokers(brokers)
            packed = None
            if sluice is not None:
                clients = sluice_clients()
                packed = replace(sluice, name=PACKED, publish=clients.publish_packed,
                                 consume=clients.consume_packed)
            self._declare_rows(rabbit, sluice)
            for index in range(self.settings.rounds):
                for size in self.settings.sizes:
                    for broker in (rabbit, sluice):
                        if broker is not None:
                            self._measure(broker, size, index, self._job(broker, size, index))
                if packed is not None:
                    self._measure(packed, PACKED_SIZE, index, self._packed_job(packed, index))
        self.report.targets = self._targets()
        if self.settings.quick:
            self.report.notes.append("--quick is a smoke run: its counts are too small for the figures "
                                     "or PASS/MISS to mean anything")
        return self.report

    # -- brokers ----------------------------------------------------------------------------

    def _start_brokers(self, stack: ExitStack) -> tuple[_Broker | None, _Broker | None]:
        """Start both brokers side by side (RabbitMQ takes seconds to boot); None for one that
        cannot start, with the reason in the notes. Each is stopped when ``stack`` closes."""
        starters = ((RABBIT, self._rabbit), (SLUICE, self._sluice))
        own_stacks = [stack.enter_context(ExitStack()) for _ in starters]
        with ThreadPoolExecutor(len(starters)) as pool:
            futures = [pool.submit(starter, own) for (_, starter), own in zip(starters, own_stacks)]
            started = []
            for (name, _), future in zip(starters, futures):
                try:
                    broker, note = future.result()
                except ServerUnavailable as error:
                    self.log(f"[native] {name} skipped: {error}")
                    broker, note = None, f"{name} skipped: {str(error).splitlines()[0]}"
                started.append(broker)
                self.report.notes.append(note)
        return started[0], started[1]

    def _rabbit(self, stack: ExitStack) -> tuple[_Broker, str]:
        """Runs on a worker thread; touches nothing but ``stack``."""
        from . import rabbit_clients
        node = stack.enter_context(rabbitmq.throwaway_node(self.workdir, self.log))
        return (_Broker(RABBIT, node.url, rabbit_clients.publish, rabbit_clients.consume, node.pid,
                        output=node.directory / "log" / f"{node.node_name}.log"),
                f"RabbitMQ {node.version}: one classic durable queue per run, default exchange, no "
                "plugins; client pika SelectConnection")

    def _sluice(self, stack: ExitStack) -> tuple[_Broker, str]:
        """Runs on a worker thread; touches nothing but ``stack``."""
        server = stack.enter_context(sluice_server(self.workdir, self.log))
        clients = sluice_clients()
        return (_Broker(SLUICE, server.endpoint, clients.publish, clients.consume, server.pid,
                        server.credentials, server.create_topic, server.delete_topic,
                        server.directory / "server-output.log"),
                "Sluice: sync flush (a send returns after fsync), one topic of one queue per run, "
                "authenticated clients of the native SDK (gRPC)")

    # -- runs -------------------------------------------------------------------------------

    def _declare_rows(self, rabbit: _Broker | None, sluice: _Broker | None) -> None:
        s, rows = self.settings, self.report.rows
        for size in s.sizes:
            if rabbit:
                rows[_key(RABBIT, size)] = Row(RABBIT, f"confirm window {s.window}, ack each, prefetch "
                                                       f"{s.prefetch}", size)
            if sluice:
                rows[_key(SLUICE, size)] = Row(SLUICE, f"{s.window} sends in flight, ack each", size)
        if sluice:
            rows[_key(PACKED, PACKED_SIZE)] = Row(SLUICE, f"send_packed({s.pack:,} bodies) x "
                                                          f"{s.packed_window} in flight, PullConsumer",
                                                  PACKED_SIZE)

    def _job(self, broker: _Broker, size: int, index: int) -> Job:
        s = self.settings
        return Job(broker.target, f"bench-{size}-{index}", size, s.messages, s.window, s.prefetch,
                   credentials=broker.credentials, timeout=_timeout(s.messages))

    def _packed_job(self, broker: _Broker, index: int) -> Job:
        s = self.settings
        messages = max(1, s.packed_messages // s.pack) * s.pack
        return Job(broker.target, f"bench-packed-{index}", PACKED_SIZE, messages, s.packed_window,
                   s.prefetch, pack=s.pack, credentials=broker.credentials, timeout=_timeout(messages / 100))

    def _measure(self, broker: _Broker, size: int, index: int, job: Job) -> None:
        """One run of ``broker``'s workload. A failure is logged and noted; after MAX_FAILURES
        the workload is not run again (a broker that is down would only fail slowly each time)."""
        key = _key(broker.name, size)
        if self.failures[key] >= MAX_FAILURES:
            return
        row = self.report.rows[key]
        try:
            broker.create(job.destination)
            run = run_pair(broker.publish, broker.consume, job, broker.group)
            broker.delete(job.destination)
        except (RuntimeError, OSError) as error:
            self.failures[key] += 1
            more = "no further runs of it" if self.failures[key] >= MAX_FAILURES else "it runs again next round"
            self.log(f"[native] {broker.name} [{size_label(size)}] run failed, {more}: {error}")
            if broker.output is not None:
                self.log(f"[native] end of the {broker.name} broker's output:\n{tail([broker.output], 30)}")
            lines = [line for line in str(error).splitlines() if line.strip()]
            self.report.notes.append(f"{broker.name} failed in round {index + 1}: {lines[0]}"
                                     + (f" ... {lines[-1].strip()}" if len(lines) > 1 else ""))
            return
        row.runs.append(run)
        elapsed = time.perf_counter() - self.started
        self.log(f"[native {elapsed:6.1f}s] round {index + 1}/{self.settings.rounds}  {row.broker} "
                 f"{row.workload} [{size_label(size)}]: {run.msg_per_s:,.0f} msg/s end to end, publish "
                 f"{run.publish_msg_per_s:,.0f} msg/s, send p50 {_ms(run.p50)} p99 {_ms(run.p99)}, "
                 f"CPU/msg broker {_us(run.broker_us_per_msg)} clients {_us(run.client_us_per_msg)} "
                 f"({run.messages:,} in {run.seconds:.2f}s)")

    # -- targets ----------------------------------------------------------------------------

    def _targets(self) -> list[Target]:
        targets = []
        row = self.report.rows.get(_key(PACKED, PACKED_SIZE))
        if row and row.runs:
            end_to_end = row.median().msg_per_s
            publish = statistics.median_low(run.publish_msg_per_s for run in row.runs)
            targets += [
                Target("Sluice send_packed 100 B, end to end msg/s (PullConsumer)", f"{end_to_end:,.0f}",
                       f">= {PACKED_TARGET:,}", end_to_end >= PACKED_TARGET),
                Target("Sluice send_packed 100 B, publish msg/s (durable)", f"{publish:,.0f}",
                       f">= {PACKED_TARGET:,}", publish >= PACKED_TARGET)]
        return targets


def _timeout(messages: float) -> float:
    """Seconds before a run of ``messages`` is abandoned as stuck: 5 minutes, or 200 msg/s."""
    return max(300.0, messages / 200)


def sluice_clients() -> ModuleType:
    """``bench.sluice_clients``, imported only once the SDK is known to be there."""
    from . import sluice_clients as clients
    return clients


def _title(settings: Settings) -> str:
    return "\n".join([
        f"native benchmark: Sluice vs RabbitMQ on this machine, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}",
        f"{settings.rounds} round(s), each RabbitMQ then Sluice; figures are medians. A run sends "
        f"{settings.messages:,} persistent messages, each confirmed durable, and a consumer acks each",
        "msg/s: end to end (first send to last ack); publish msg/s: first send to last confirm; "
        "send p50/p99: send call to its confirm",
        "CPU/msg: CPU time (user + system, all threads) per message of the broker's processes and of "
        "publisher + consumer; it moves less than msg/s when other work shares the machine",
    ])


def run_section(settings: Settings, workdir: Path, log: Log) -> NativeReport:
    """Run the native benchmark in ``workdir`` and return its report."""
    return NativeBench(settings, workdir, log).run()
