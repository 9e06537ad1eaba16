"""``python -m bench features``: what RocketMQ 5 message features cost.

- **Delayed messages**: delayed sends per second beside plain durable sends of the same size,
  alternating, medians of rounds (a delayed send is one durable append to the timer's topic);
  then ``pending`` messages due over ``spread_s`` seconds are scheduled, and a consumer reads
  them as they fall due: how late each arrived against the due time stamped in its body
  (p50, p99, max), and how many came early (must be none) or never.
- **FIFO groups**: consuming (and acking) messages spread over 1,000 message groups with a
  FIFO consumer group, beside the same workload without groups and a plain group.
- **SQL92 filters**: the broker's CPU per message and subscription when 1, 10 and 100 consumer
  groups, each with its own SQL92 expression, read a topic whose messages none of them match,
  beside the same with tag filters: the difference is what evaluating SQL92 costs.
- **Transactions**: transactional messages sent and committed per second (two requests and
  three durable appends each: half, message, outcome) beside plain durable sends, alternating,
  medians of rounds.

The load generator is this process, separate from the broker (``sluice serve --flush sync``).
"""
from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .native_workloads import percentiles
from .processes import ServerUnavailable, group_cpu_seconds
from .report import MeasuredSection, Measurement, run_measurements
from .sluice_server import SluiceServer, sluice_server

Log = Callable[[str], None]


@dataclass(frozen=True)
class Settings:
    sends: int = 20_000
    """Messages per send-rate run."""
    rounds: int = 3
    window: int = 256
    """Sends in flight at once."""
    size: int = 100
    pending: int = 100_000
    spread_s: float = 30.0
    filter_messages: int = 20_000
    message_groups: int = 1_000
    subscription_counts: tuple[int, ...] = (1, 10, 100)

    @classmethod
    def smoke(cls) -> Settings:
        return cls(sends=500, rounds=1, pending=2_000, spread_s=3.0, filter_messages=200)


def _against_sluice(workdir: Path, log: Log,
                    measure: Callable[[SluiceServer], Coroutine[Any, Any, list[str]]]) -> list[str]:
    """Run ``measure`` against a fresh `sluice serve` in ``workdir``; its result lines, or why
    it was skipped."""
    try:
        with sluice_server(workdir, log) as server:
            return asyncio.run(measure(server))
    except ServerUnavailable as error:
        return [f"skipped: {error}"]


# ----------------------------------------------------------------------------- delayed

async def _send_all(server: SluiceServer, topic: str, count: int, size: int, window: int,
                    due: Callable[[int], int]) -> float:
    """Send ``count`` messages with ``window`` in flight; the body starts with the due time.
    Returns messages per second."""
    from sluice.client import ClientConfig, Message, Producer

    config = ClientConfig(server.endpoint, *server.credentials, request_timeout=60)
    padding = b"x" * max(0, size - 14)
    async with Producer(config, [topic]) as producer:
        next_index = 0

        async def sender() -> None:
            nonlocal next_index
            while next_index < count:
                index = next_index
                next_index += 1
                when = due(index)
                await producer.send(Message(topic, b"%013d:" % when + padding, delivery_timestamp=when))
        started = time.perf_counter()
        await asyncio.gather(*(sender() for _ in range(window)))
        return count / (time.perf_counter() - started)


async def _receive_lateness(server: SluiceServer, topic: str, count: int, timeout: float) -> tuple[list[int], int]:
    """Receive ``count`` messages; (arrival minus due time in ms per message, messages missing)."""
    from sluice.client import ClientConfig, SimpleConsumer

    config = ClientConfig(server.endpoint, *server.credentials, request_timeout=60)
    lateness: list[int] = []
    deadline = time.monotonic() + timeout
    async with SimpleConsumer(config, "bench-delayed", {topic: "*"}, await_duration=1) as consumer:
        async def reader() -> None:
            while len(lateness) < count and time.monotonic() < deadline:
                messages = await consumer.receive(32)
                now = time.time_ns() // 1_000_000
                lateness.extend(now - int(m.body[:13]) for m in messages)
                await asyncio.gather(*(consumer.ack(m) for m in messages))
        await asyncio.gather(*(reader() for _ in range(4)))
    return lateness, count - len(lateness)


def delayed_messages(settings: Settings, workdir: Path, log: Log) -> tuple[str, list[str]]:
    title = "delayed messages (SDK, 100-byte bodies, sync flush)"
    return title, _against_sluice(workdir / "delayed", log,
                                  lambda server: _delayed(server, settings, log))


async def _delayed(server: SluiceServer, settings: Settings, log: Log) -> list[str]:
    for topic in ("plain", "delayed", "due"):
        server.create_topic(topic, queues=4)
    far = int(time.time() * 1000) + 3_600_000
    plain, delayed = [], []
    for round_ in range(settings.rounds):
        plain.append(await _send_all(server, "plain", settings.sends, settings.size,
                                     settings.window, lambda i: 0))
        delayed.append(await _send_all(server, "delayed", settings.sends, settings.size,
                                       settings.window, lambda i: far + i))
        log(f"delayed round {round_ + 1}: plain {plain[-1]:,.0f} msg/s, delayed {delayed[-1]:,.0f} msg/s")
    lead_s = settings.pending / statistics.median(delayed) * 2 + 3
    start = int(time.time() * 1000 + lead_s * 1000)
    spread_ms = int(settings.spread_s * 1000)
    log(f"scheduling {settings.pending:,} messages due over {settings.spread_s:.0f} s "
        f"from {lead_s:.0f} s ahead")
    scheduling = asyncio.create_task(_send_all(
        server, "due", settings.pending, settings.size, settings.window,
        lambda i: start + i * spread_ms // settings.pending))
    lateness, missing = await _receive_lateness(server, "due", settings.pending,
                                                lead_s + settings.spread_s + 120)
    scheduled_rate = await scheduling
    p50, p99 = percentiles(lateness) if lateness else (float("nan"), float("nan"))
    early = sum(1 for late in lateness if late < 0)
    return [
        f"plain durable sends     {statistics.median(plain):>10,.0f} msg/s (median of {settings.rounds})",
        f"delayed sends           {statistics.median(delayed):>10,.0f} msg/s "
        f"({statistics.median(delayed) / statistics.median(plain):.2f}x plain)",
        f"scheduling {settings.pending:,} pending  {scheduled_rate:>10,.0f} msg/s",
        f"delivery after due time with {settings.pending:,} pending over {settings.spread_s:.0f} s: "
        f"p50 {p50:.0f} ms, p99 {p99:.0f} ms, max {max(lateness, default=0):.0f} ms; "
        f"early {early}, missing {missing}",
    ]


# ----------------------------------------------------------------------------- FIFO

async def _consume_all(server: SluiceServer, topic: str, group: str, count: int) -> float:
    """Receive and ack ``count`` messages with four receivers; messages per second."""
    from sluice.client import ClientConfig, SimpleConsumer

    config = ClientConfig(server.endpoint, *server.credentials, request_timeout=60)
    done = 0
    all_acked = asyncio.Event()
    async with SimpleConsumer(config, group, {topic: "*"}, await_duration=1) as consumer:
        async def reader() -> None:
            nonlocal done
            while True:
                messages = await consumer.receive(32)
                await asyncio.gather(*(consumer.ack(m) for m in messages))
                done += len(messages)
                if done >= count:
                    all_acked.set()
        started = time.perf_counter()
        readers = [asyncio.create_task(reader()) for _ in range(4)]
        try:
            await asyncio.wait_for(all_acked.wait(), 300)
            return count / (time.perf_counter() - started)
        finally:
            for task in readers:
                task.cancel()
            await asyncio.gather(*readers, return_exceptions=True)


async def _fifo(server: SluiceServer, settings: Settings, log: Log) -> list[str]:
    from sluice.client import ClientConfig, Message, Producer

    config = ClientConfig(server.endpoint, *server.credentials, request_timeout=60)
    rates: dict[bool, list[float]] = {True: [], False: []}
    for round_ in range(settings.rounds):
        for fifo in (False, True):
            topic = group = f"fifo-{fifo}-{round_}"
            server.create_topic(topic, queues=8)
            server.create_group(group, fifo=fifo)
            async with Producer(config, [topic]) as producer:
                for start in range(0, settings.sends, settings.window):
                    await asyncio.gather(*(
                        producer.send(Message(topic, b"x" * settings.size, message_group=(
                            f"g{i % settings.message_groups}" if fifo else "")))
                        for i in range(start, min(start + settings.window, settings.sends))))
            rates[fifo].append(await _consume_all(server, topic, group, settings.sends))
            log(f"fifo round {round_ + 1}: {'FIFO' if fifo else 'plain'} {rates[fifo][-1]:,.0f} msg/s")
    plain, ordered = statistics.median(rates[False]), statistics.median(rates[True])
    return [
        f"plain group, no message groups  {plain:>10,.0f} msg/s consumed and acked (median of {settings.rounds})",
        f"FIFO group, {settings.message_groups:,} message groups {ordered:>10,.0f} msg/s ({ordered / plain:.2f}x plain)",
    ]


def fifo_groups(settings: Settings, workdir: Path, log: Log) -> tuple[str, list[str]]:
    title = f"FIFO consumption (SDK, 8 queues, 4 receivers of 32, {settings.sends:,} messages)"
    return title, _against_sluice(workdir / "fifo", log,
                                  lambda server: _fifo(server, settings, log))


# ----------------------------------------------------------------------------- SQL92

def _expression(index: int) -> str:
    """A selective SQL92 filter: four comparisons over five properties, matching nothing here
    (``amount`` stays below 1,000), so every message read is evaluated and settled."""
    return (f"region = 'eu' AND amount BETWEEN {1_000 + index} AND {2_000 + index} "
            f"AND TAGS IN ('card', 'wire') AND (priority IS NULL OR priority > 2)")


async def _scan_cpu(server: SluiceServer, topic: str, filters: list[object]) -> float:
    """Broker CPU seconds for one consumer group per filter to read (and reject) the topic."""
    from sluice.client import ClientConfig, SimpleConsumer

    config = ClientConfig(server.endpoint, *server.credentials, request_timeout=120)
    async with contextlib.AsyncExitStack() as stack:
        consumers = [await stack.enter_async_context(SimpleConsumer(
            config, f"scan-{topic}-{index}", {topic: selector}, await_duration=0))
            for index, selector in enumerate(filters)]
        before = group_cpu_seconds(server.pid) or 0.0
        for consumer in consumers:  # each receive reads the whole queue: nothing matches
            assert await consumer.receive(32) == [], "the filter was meant to match nothing"
        return (group_cpu_seconds(server.pid) or 0.0) - before


async def _filters(server: SluiceServer, settings: Settings, log: Log) -> list[str]:
    from sluice.client import ClientConfig, Message, Producer, Sql92

    config = ClientConfig(server.endpoint, *server.credentials, request_timeout=60)
    count = settings.filter_messages
    lines = []
    for subscriptions in settings.subscription_counts:
        costs = {}
        for kind in ("tag", "sql92"):
            topic = f"filtered-{kind}-{subscriptions}"
            server.create_topic(topic, queues=1)
            async with Producer(config, [topic]) as producer:
                for start in range(0, count, settings.window):
                    await asyncio.gather(*(producer.send(Message(
                        topic, b"x" * settings.size, tag="card" if i % 3 else "cash",
                        properties={"region": "eu" if i % 2 else "us", "amount": str(i % 1000),
                                    "priority": str(i % 5), "customer": f"c{i}", "source": "web"}))
                        for i in range(start, min(start + settings.window, count))))
            filters = ([f"no-such-tag-{i}" for i in range(subscriptions)] if kind == "tag"
                       else [Sql92(_expression(i)) for i in range(subscriptions)])
            costs[kind] = await _scan_cpu(server, topic, filters) / (count * subscriptions) * 1e6
        lines.append(f"{subscriptions:>3} subscription(s): SQL92 {costs['sql92']:6.2f} us, tag "
                     f"{costs['tag']:6.2f} us of broker CPU per message per subscription; SQL92 "
                     f"adds {costs['sql92'] - costs['tag']:5.2f} us")
        log(lines[-1])
    return lines


def sql92_filters(settings: Settings, workdir: Path, log: Log) -> tuple[str, list[str]]:
    title = (f"SQL92 filters in the broker ({settings.filter_messages:,} messages read and rejected "
             "by each group; reading and settling included)")
    return title, _against_sluice(workdir / "filters", log,
                                  lambda server: _filters(server, settings, log))


# ----------------------------------------------------------------------------- transactions

async def _send_committed(server: SluiceServer, topic: str, count: int, size: int, window: int,
                          transactional: bool) -> float:
    """Send ``count`` messages with ``window`` in flight, each in a transaction committed at
    once when ``transactional``; messages per second."""
    from sluice.client import ClientConfig, Message, Producer

    config = ClientConfig(server.endpoint, *server.credentials, request_timeout=60)
    body = b"x" * size
    async with Producer(config, [topic], checker=lambda message: None) as producer:
        remaining = count

        async def sender() -> None:
            nonlocal remaining
            while remaining > 0:
                remaining -= 1
                if transactional:
                    await (await producer.send_in_transaction(Message(topic, body))).commit()
                else:
                    await producer.send(Message(topic, body))
        started = time.perf_counter()
        await asyncio.gather(*(sender() for _ in range(window)))
        return count / (time.perf_counter() - started)


async def _transactions(server: SluiceServer, settings: Settings, log: Log) -> list[str]:
    server.create_topic("plain", queues=4)
    server.create_topic("committed", queues=4, message_type="transaction")
    plain, committed = [], []
    for round_ in range(settings.rounds):
        plain.append(await _send_committed(server, "plain", settings.sends, settings.size,
                                           settings.window, False))
        committed.append(await _send_committed(server, "committed", settings.sends, settings.size,
                                               settings.window, True))
        log(f"transactions round {round_ + 1}: plain {plain[-1]:,.0f} msg/s, "
            f"committed {committed[-1]:,.0f} msg/s")
    ratio = statistics.median(committed) / statistics.median(plain)
    return [
        f"plain durable sends          {statistics.median(plain):>10,.0f} msg/s "
        f"(median of {settings.rounds})",
        f"sent and committed           {statistics.median(committed):>10,.0f} msg/s ({ratio:.2f}x plain)",
    ]


def transactions(settings: Settings, workdir: Path, log: Log) -> tuple[str, list[str]]:
    title = (f"transactional sends (SDK, {settings.window} in flight, 100-byte bodies, sync flush, "
             "each committed by its sender)")
    return title, _against_sluice(workdir / "transactions", log,
                                  lambda server: _transactions(server, settings, log))


MEASUREMENTS: list[Measurement] = [delayed_messages, fifo_groups, sql92_filters, transactions]
"""Run in order; each returns (title, result lines)."""


def run_section(settings: Settings, workdir: Path, log: Log) -> MeasuredSection:
    """Every measurement of the section; ``workdir`` is for measurements that need files."""
    return run_measurements("features benchmark: RocketMQ 5 message features", MEASUREMENTS, settings, workdir, log)
