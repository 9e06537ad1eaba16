"""``/overview/history``: the broker's traffic, store size and connections over the last hour.

A sampler task, started and stopped with the admin server, reads every ``STEP_S`` seconds what
``/metrics`` reads (the broker's message counters, named queues' deliveries and settlements,
groups' committed offsets, the store's offsets, each protocol's open connections) and keeps the
last ``SAMPLES`` samples in a ring, so memory stays fixed however long the broker runs. Rates
are the change of a counter since the previous sample divided by the time between them; a
counter that went down (an offset reset) counts as no change. Each sample also turns every open
connection's message counts into its rates (``ClientDirectory.sample``), which ``/clients``
shows.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from core.model import Principal
from core.traffic import per_second

from .handlers import DEPS, AdminDeps

log = logging.getLogger(__name__)

STEP_S = 5
SAMPLES = 720
"""One hour of samples, ``STEP_S`` apart."""
PROTOCOLS = ("mqtt", "amqp", "native")
RATES = ("published_per_s", "delivered_per_s", "acked_per_s")


@dataclass(frozen=True)
class Totals:
    """The broker's counters since it started, and its state now."""

    published: int
    """Messages accepted from producers."""
    delivered: int
    """Messages handed to consumers: pulled or received by groups, popped from named queues."""
    acked: int
    """Messages consumers settled: committed by groups, settled in named queues."""
    store_bytes: int | None
    """Commit-log bytes the store holds (None: the store does not say)."""
    connections: dict[str, int]
    """Connections open now, per protocol."""


def totals(d: AdminDeps) -> Totals:
    """Read the counters; runs on the event loop, no I/O."""
    broker, queues = d.broker, d.queues
    counters = getattr(broker, "counters", None) or {}
    published = sum(v for (metric, _), v in counters.items() if metric == "messages_in")
    delivered = sum(v for (metric, _), v in counters.items() if metric == "messages_out")
    acked = sum(q.committed for g in broker.list_groups()
                for q in broker.describe_group(g.name).lag)
    if queues is not None:
        delivered += sum(queues.delivered.values())
        acked += sum(queues.settled.values())
    connections = dict.fromkeys(PROTOCOLS, 0)
    if d.clients is not None:
        connections |= d.clients.connected_by_protocol()
    return Totals(published, delivered, acked, store_bytes(d.store), connections)


def store_bytes(store: Any) -> int | None:
    """The commit-log bytes ``store`` holds: from its oldest record to its readable end."""
    start = getattr(store, "log_start", None)
    if store is None or start is None:
        return None
    return max(0, getattr(store, "visible_offset", store.durable_offset) - start)


@dataclass(frozen=True)
class Sample:
    """One point of the history."""

    t: int
    """Seconds since the epoch."""
    rates: tuple[float, float, float]
    """Published, delivered and acked per second since the previous sample."""
    store_bytes: int | None
    connections: tuple[int, ...]
    """Open connections of each of ``PROTOCOLS``."""


class History:
    """The ring of the last ``size`` samples; ``add`` computes rates from consecutive totals."""

    def __init__(self, size: int = SAMPLES, clock: Callable[[], float] = time.monotonic) -> None:
        self.samples: deque[Sample] = deque(maxlen=size)
        self._clock = clock
        self._last: tuple[float, Totals] | None = None

    def add(self, now: Totals) -> None:
        at = self._clock()
        rates = (0.0, 0.0, 0.0)
        if self._last is not None and at > self._last[0]:
            then, before = self._last
            rates = tuple(per_second(after, earlier, at - then) for after, earlier in (
                (now.published, before.published), (now.delivered, before.delivered),
                (now.acked, before.acked)))  # type: ignore[assignment]
        self._last = (at, now)
        self.samples.append(Sample(int(time.time()), rates, now.store_bytes,
                                   tuple(now.connections.get(p, 0) for p in PROTOCOLS)))

    def as_json(self) -> dict[str, Any]:
        """The answer of ``/overview/history``: the time axis and one list per series."""
        samples = list(self.samples)
        series: dict[str, list[Any]] = {name: [s.rates[n] for s in samples]
                                        for n, name in enumerate(RATES)}
        series["store_bytes"] = [s.store_bytes for s in samples]
        for n, protocol in enumerate(PROTOCOLS):
            series[f"connections_{protocol}"] = [s.connections[n] for s in samples]
        return {"step_s": STEP_S, "t": [s.t for s in samples], "series": series}


HISTORY: web.AppKey[History] = web.AppKey("history", History)
_SAMPLER: web.AppKey[asyncio.Task[None]] = web.AppKey("history_sampler", asyncio.Task)


async def _sample_forever(d: AdminDeps, history: History) -> None:
    failing = False
    while True:
        try:
            history.add(totals(d))
            if d.clients is not None:
                d.clients.sample(time.monotonic())
            failing = False
        except Exception:  # noqa: BLE001 - a failed sample leaves a gap, never stops the sampler
            if not failing:
                log.exception("the overview history could not sample the broker; retrying")
            failing = True
        await asyncio.sleep(STEP_S)


async def start_sampler(app: web.Application) -> None:
    """``on_startup``: sample now and every ``STEP_S`` seconds while the server runs."""
    if app[DEPS].broker is not None:
        app[_SAMPLER] = asyncio.get_running_loop().create_task(
            _sample_forever(app[DEPS], app[HISTORY]), name="admin overview history")


async def stop_sampler(app: web.Application) -> None:
    """``on_cleanup``: stop sampling."""
    task = app.get(_SAMPLER)
    if task is not None:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def overview_history(request: web.Request, principal: Principal) -> dict[str, Any]:
    """The last hour of samples, oldest first."""
    return request.app[HISTORY].as_json()


def install(app: web.Application) -> None:
    """Give ``app`` a history and a sampler that runs while it serves."""
    app[HISTORY] = History()
    app.on_startup.append(start_sampler)
    app.on_cleanup.append(stop_sampler)
