"""The push engine: every push subscription's delivery (``delivery.Delivering``) over one
shared HTTP client with a bounded connection pool, started and stopped with the broker.

The composition root starts it with the broker, so in a replica group it runs on the leader
only (followers start no broker). It follows the registry: a created subscription starts, a
paused one stops popping, a deleted one stops and its group's position is removed. Requests
go only where ``core.sink_policy`` allows: host names are checked on every address they resolve
to, literal addresses before each request, and redirects are not followed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator

import aiohttp
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from core.push_model import PushSubscription
from core.push_subscriptions import PushSubscriptions
from core.service import Broker
from core.vhost_queue_reader import VhostQueueReader

from .delivery import Delivering
from .guard import GuardedResolver
from .options import PushOptions
from .stats import PushStats

log = logging.getLogger(__name__)


class PushEngine:
    """Runs every push subscription of ``registry``. Runs on the event loop."""

    def __init__(self, broker: Broker, registry: PushSubscriptions, options: PushOptions,
                 queues: VhostQueueReader | None = None) -> None:
        """``queues``: the virtual hosts' queues, for subscriptions whose source is one."""
        self.broker = broker
        self.queues = queues
        self.registry = registry
        self.options = options
        self._session: aiohttp.ClientSession | None = None
        self._running: dict[str, Delivering] = {}
        self._removing: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        """Load the subscriptions and start delivering."""
        connector = aiohttp.TCPConnector(limit=self.options.max_connections,
                                         resolver=GuardedResolver(self.registry.policy),
                                         ttl_dns_cache=10)
        self._session = aiohttp.ClientSession(connector=connector, auto_decompress=False)
        await self.registry.load()
        self.registry.on_change(self._changed)
        for subscription, secret in self.registry.all():
            self._start(subscription, secret)

    async def stop(self) -> None:
        """Stop every subscription (what is in flight is delivered again after a restart)."""
        running, self._running = list(self._running.values()), {}
        await asyncio.gather(*(d.stop() for d in running), *self._removing,
                             return_exceptions=True)
        if self._session is not None:
            await self._session.close()

    def stats(self, name: str) -> PushStats:
        """What subscription ``name`` has done since the broker started."""
        running = self._running.get(name)
        return running.current_stats() if running is not None else PushStats(state="stopped")

    def _start(self, subscription: PushSubscription, secret: str) -> None:
        assert self._session is not None
        try:
            delivering = Delivering(self.broker, self._session, self.registry.policy,
                                    subscription, secret, self.queues)
        except Exception as error:  # noqa: BLE001 - one bad subscription must not stop the rest
            log.error("push subscription %s cannot start: %s", subscription.name, error)
            return
        self._running[subscription.name] = delivering
        delivering.start()

    def _changed(self, name: str, subscription: PushSubscription | None, secret: str) -> None:
        running = self._running.get(name)
        if subscription is None:
            if running is not None:
                del self._running[name]
                task = asyncio.ensure_future(running.remove())
                self._removing.add(task)
                task.add_done_callback(self._removing.discard)
        elif running is None:
            self._start(subscription, secret)
        else:
            running.set_paused(subscription)

    def metrics(self) -> Iterator[Metric]:
        """Prometheus series of every subscription, by name."""
        counters = {name: CounterMetricFamily(f"sluice_push_{name}", text, labels=["subscription"])
                    for name, text in _COUNTERS}
        gauges = {name: GaugeMetricFamily(f"sluice_push_{name}", text, labels=["subscription"])
                  for name, text in _GAUGES}
        latency = GaugeMetricFamily("sluice_push_latency_ms", "Milliseconds from store time to "
                                    "the receiver's 2xx over recent deliveries, by quantile",
                                    labels=["subscription", "quantile"])
        for name, delivering in sorted(self._running.items()):
            stats = delivering.current_stats()
            for field, family in counters.items():
                family.add_metric([name], getattr(stats, field))
            for field, family in gauges.items():
                family.add_metric([name], getattr(stats, field))
            for quantile in (0.5, 0.99):
                value = stats.percentile(quantile)
                if value is not None:
                    latency.add_metric([name, str(quantile)], value)
        yield from counters.values()
        yield from gauges.values()
        yield latency


_COUNTERS = (("delivered", "Messages a push subscription delivered (2xx) since the broker started"),
             ("failed", "Push attempts that got no 2xx (errors, timeouts, other statuses) since "
                        "the broker started"),
             ("dead_lettered", "Messages a push subscription moved to its dead-letter topic "
                               "since the broker started"),
             ("replies", "Reply events a push subscription stored since the broker started"))
_GAUGES = (("retrying", "Messages of a push subscription waiting for their next attempt"),
           ("lag", "Messages of a push subscription's topic or queue not yet delivered"))
