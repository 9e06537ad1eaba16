"""Load generation for the native benchmark: one publisher and one consumer process per run.

Every run moves a fixed number of messages through one broker: the consumer process connects and
subscribes first, then the publisher process sends them all; the run ends when the consumer has
acknowledged the last one. Both processes are separate from the broker and from the benchmark's
own process (spawned, not forked: gRPC does not survive a fork). Both read ``time.monotonic()``,
which on Linux is one system-wide clock, so the end-to-end time spans the two processes.

The client side of each broker lives in ``rabbit_clients`` and ``sluice_clients``: module-level
``publish(job, results)`` and ``consume(job, results)`` functions that return their report (the
consumer first puts ``READY`` on ``results`` once subscribed). CPU time is counted too: the
broker's whole process group from /proc, each client's own process from ``time.process_time``,
since on a shared machine CPU per message moves less than wall-clock rates do.
"""
from __future__ import annotations

import multiprocessing
import queue
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from .processes import group_cpu_seconds

READY = "ready"
_SPAWN = multiprocessing.get_context("spawn")
_START_TIMEOUT = 60.0
"""Time for a child to import its client library, connect and subscribe."""


@dataclass(frozen=True)
class Job:
    """What one publisher/consumer pair does. Plain data: it is pickled into both children."""

    target: str
    """Where the broker is: an AMQP URL or a native endpoint ``host:port``."""
    destination: str
    """The queue (RabbitMQ) or topic (Sluice) of this run; fresh for every run."""
    size: int
    messages: int
    window: int
    """Sends in flight at once: unconfirmed publishes, or awaited sends running concurrently."""
    prefetch: int
    """Messages the consumer holds unacknowledged at most (prefetch count, or receive batch)."""
    pack: int = 0
    """Bodies per packed message (packed stream workload only)."""
    credentials: tuple[str, str] = ("", "")
    """Native: access key and secret key (RabbitMQ's are in its URL)."""
    timeout: float = 300.0
    """Seconds the whole run may take before it is abandoned as stuck."""


@dataclass(frozen=True)
class Published:
    """The publisher's side of a run. Times are ``time.monotonic()`` values."""

    started: float
    finished: float
    messages: int
    sends: int
    """Send calls made: ``messages``, or fewer when each call carries a packed batch."""
    p50: float
    p99: float
    """Send latency percentiles in seconds: from a send call until the broker confirmed it durable."""
    cpu: float = 0.0
    """CPU seconds the publisher process used for the run (filled in by ``run_pair``)."""


@dataclass(frozen=True)
class Consumed:
    """The consumer's side of a run."""

    finished: float
    messages: int
    cpu: float = 0.0


@dataclass(frozen=True)
class Run:
    """One run's figures."""

    messages: int
    payload_bytes: int
    publish_seconds: float
    seconds: float
    """End to end: from the first send until the consumer acknowledged the last message."""
    p50: float
    p99: float
    broker_cpu: float | None
    """CPU seconds of the broker's processes during the run; None where it cannot be read."""
    client_cpu: float
    """CPU seconds of publisher and consumer together."""

    @property
    def msg_per_s(self) -> float:
        return self.messages / self.seconds if self.seconds > 0 else 0.0

    @property
    def publish_msg_per_s(self) -> float:
        return self.messages / self.publish_seconds if self.publish_seconds > 0 else 0.0

    @property
    def broker_us_per_msg(self) -> float | None:
        return None if self.broker_cpu is None else self.broker_cpu / self.messages * 1e6

    @property
    def client_us_per_msg(self) -> float:
        return self.client_cpu / self.messages * 1e6


def make_body(size: int) -> bytes:
    """A body of ``size`` bytes (not all zeros)."""
    return bytes(i % 251 for i in range(size))


def percentiles(latencies: list[float] | list[int], points: Sequence[float] = (0.50, 0.99)) -> list[float]:
    """Nearest-rank percentiles of ``latencies`` (sorted in place); zeros when it is empty."""
    if not latencies:
        return [0.0 for _ in points]
    latencies.sort()
    last = len(latencies) - 1
    return [float(latencies[min(last, int(point * len(latencies)))]) for point in points]


Child = Callable[[Job, Any], Published | Consumed]


def run_pair(publish: Child, consume: Child, job: Job, broker_group: int | None = None) -> Run:
    """Run ``consume`` and, once it is subscribed, ``publish`` in two fresh processes.

    ``broker_group`` is the broker's process group, whose CPU time the run reports.
    """
    cpu_before = group_cpu_seconds(broker_group) if broker_group else None
    results = _SPAWN.Queue()
    consumer = _SPAWN.Process(target=_child, args=(consume, job, results), name="bench-consumer")
    publisher = _SPAWN.Process(target=_child, args=(publish, job, results), name="bench-publisher")
    children = [consumer]
    consumer.start()
    try:
        _expect(results, READY, time.monotonic() + _START_TIMEOUT, children)
        children.append(publisher)
        publisher.start()
        deadline = time.monotonic() + _START_TIMEOUT + job.timeout
        reports = [_expect(results, (Published, Consumed), deadline, children) for _ in range(2)]
        for child in children:
            child.join(_START_TIMEOUT)
    finally:
        for child in children:
            if child.is_alive():
                child.terminate()
                child.join()
        results.close()
    cpu_after = group_cpu_seconds(broker_group) if broker_group else None
    published = next(r for r in reports if isinstance(r, Published))
    consumed = next(r for r in reports if isinstance(r, Consumed))
    if consumed.messages != job.messages:
        raise RuntimeError(f"consumer received {consumed.messages} of {job.messages} messages")
    broker_cpu = cpu_after - cpu_before if cpu_before is not None and cpu_after is not None else None
    return Run(consumed.messages, consumed.messages * job.size, published.finished - published.started,
               consumed.finished - published.started, published.p50, published.p99, broker_cpu,
               published.cpu + consumed.cpu)


def _child(work: Child, job: Job, results: Any) -> None:
    """Entry point of a spawned child: run ``work`` and put its report, with the CPU time it
    took, on ``results``; report a failure as its traceback."""
    try:
        started = time.process_time()
        report = work(job, results)
        results.put(replace(report, cpu=time.process_time() - started))
    except BaseException:
        results.put(("error", getattr(work, "__module__", "?") + "." + work.__name__,
                     traceback.format_exc()))
        raise SystemExit(1) from None


def _expect(results: Any, kind: str | tuple[type, ...], deadline: float,
            children: list[multiprocessing.process.BaseProcess]) -> Any:
    """The next report from the children, which must be ``kind``; raises on error or timeout."""
    while True:
        try:
            report = results.get(timeout=max(0.0, min(1.0, deadline - time.monotonic())))
        except queue.Empty:
            dead = [child for child in children if not child.is_alive() and child.exitcode != 0]
            if dead:
                raise RuntimeError(f"{dead[0].name} died with exit code {dead[0].exitcode}") from None
            if time.monotonic() >= deadline:
                raise RuntimeError(f"no report from the benchmark clients in time "
                                   f"(waiting for {kind!r})") from None
            continue
        if isinstance(report, tuple) and report and report[0] == "error":
            raise RuntimeError(f"{report[1]} failed:\n{report[2]}")
        if report == kind if isinstance(kind, str) else isinstance(report, kind):
            return report
        raise RuntimeError(f"unexpected report {report!r} (waiting for {kind!r})")
