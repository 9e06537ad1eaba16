"""Prometheus metrics for ``GET /metrics``, computed from the broker at scrape time.

Each admin server owns its own ``CollectorRegistry`` (never the process-global one), so two
brokers in one test process do not share or collide on metrics. Everything except the admin
request counter is read from the ``Broker`` facade, the store and the client directory (each
protocol's connections and ``core.traffic`` counters) when Prometheus scrapes; the collector
runs inside the request handler, on the event loop, and only calls non-blocking methods.
docs/metrics.md documents every series (a test keeps the two equal).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from core.clients import ClientDirectory
from core.errors import InvalidArgument, SluiceError
from core.model import Principal, TopicConfig, check_name


class AdminMetrics:
    """The registry of one admin server: broker gauges plus a counter of admin requests."""

    def __init__(self, deps: Any) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.requests = Counter("sluice_admin_requests", "Admin API requests by route and status",
                                ["method", "route", "status"], registry=self.registry)
        self.ingress = IngressCounters(self.registry)
        self.registry.register(BrokerCollector(deps))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class IngressCounters:
    """What ``POST /events/{topic}`` took and refused (``ingress.py``). Runs on the event loop."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter("sluice_ingress_requests", "HTTP ingress requests by content "
                                "mode and result", ["mode", "result"], registry=registry)
        self.events = Counter("sluice_ingress_events", "CloudEvents stored by the HTTP ingress, "
                              "by content mode", ["mode"], registry=registry)

    def accepted(self, mode: str, events: int) -> None:
        self.requests.labels(mode, "accepted").inc()
        self.events.labels(mode).inc(events)

    def refused(self, mode: str, result: str) -> None:
        self.requests.labels(mode, result).inc()


METRICS: web.AppKey[AdminMetrics] = web.AppKey("metrics", AdminMetrics)


async def metrics(request: web.Request, principal: Principal) -> web.Response:
    """Prometheus text exposition of this broker."""
    body = request.app[METRICS].render()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


def topic_queues(broker: Any, topic: TopicConfig) -> tuple[Any, ...]:
    """Each queue's offset range (``QueueStats``). A topic whose name an older version stored
    and this one refuses (``.``, ``..``) has none when the store cannot hold such a name: it
    never held a message, and describing it must not fail the page or the scrape."""
    try:
        return broker.describe_topic(topic.name).queues
    except SluiceError:
        raise
    except Exception:
        try:
            check_name("topic", topic.name)
        except InvalidArgument:
            return ()
        raise


class BrokerCollector(Collector):
    """Reads topics, queues, groups and store offsets from the broker on every scrape."""

    def __init__(self, deps: Any) -> None:
        self.deps = deps

    def collect(self) -> Iterator[Metric]:
        broker, store = self.deps.broker, self.deps.store
        yield from self._store(store)
        yield from self._memory(broker)
        yield from self._topics(broker)
        yield from self._groups(broker)
        yield from self._counters(broker)
        if self.deps.clients is not None:
            yield from protocol_metrics(self.deps.clients)
        if getattr(self.deps, "vhosts", None) is not None:
            yield from amqp_queue_metrics(self.deps.vhosts.queues_of())
        if getattr(self.deps, "cluster", None) is not None:
            yield from self.deps.cluster.metrics()
        if getattr(self.deps, "push", None) is not None:
            yield from self.deps.push.metrics()
        if getattr(self.deps, "tier", None) is not None:
            yield from tier_metrics(self.deps.tier)

    def _store(self, store: Any) -> Iterator[Metric]:
        if store is None:
            return
        durable = store.durable_offset
        visible = getattr(store, "visible_offset", durable)
        yield GaugeMetricFamily("sluice_store_durable_offset_bytes",
                                "Commit-log offset up to which data is fsynced", value=durable)
        yield GaugeMetricFamily("sluice_store_visible_offset_bytes",
                                "Commit-log offset up to which data is readable", value=visible)
        yield CounterMetricFamily("sluice_store_written_bytes",
                                  "Bytes appended to the commit log since it was created",
                                  value=visible)
        yield GaugeMetricFamily("sluice_disk_alarm", "1 while the store takes no writes (disk "
                                "full, I/O errors; publishes are refused), else 0",
                                value=int(bool(getattr(store, "degraded", None))))

    def _memory(self, broker: Any) -> Iterator[Metric]:
        alarm = getattr(broker, "memory_alarm", None)
        if alarm is None:
            return
        yield GaugeMetricFamily("sluice_memory_alarm", "1 while the memory alarm is on "
                                "(publishers are blocked), else 0", value=int(alarm.on))
        yield GaugeMetricFamily("sluice_memory_resident_bytes",
                                "The broker's resident memory at the last check",
                                value=alarm.resident)
        yield GaugeMetricFamily("sluice_memory_high_watermark_bytes",
                                "Resident memory above which the memory alarm goes on",
                                value=alarm.limit)

    def _topics(self, broker: Any) -> Iterator[Metric]:
        stored = CounterMetricFamily("sluice_topic_stored_messages",
                                     "Messages stored per topic since it was created (queue "
                                     "entries, counting fan-out)", labels=["topic"])
        retained = GaugeMetricFamily("sluice_topic_messages", "Messages retained per topic",
                                     labels=["topic"])
        depth = GaugeMetricFamily("sluice_queue_depth", "Messages retained per queue "
                                  "(max offset - min offset)", labels=["topic", "queue"])
        topics = broker.list_topics()
        for topic in topics:
            queues = topic_queues(broker, topic)
            count = sum(q.max_offset for q in queues)
            stored.add_metric([topic.name], count)
            retained.add_metric([topic.name], sum(q.max_offset - q.min_offset for q in queues))
            for q in queues:
                depth.add_metric([topic.name, str(q.queue_id)], q.max_offset - q.min_offset)
        yield GaugeMetricFamily("sluice_topics", "Topics", value=len(topics))
        yield from (stored, retained, depth)

    def _groups(self, broker: Any) -> Iterator[Metric]:
        lag = GaugeMetricFamily("sluice_group_lag", "Messages stored but not consumed by a group",
                                labels=["group", "topic", "queue"])
        inflight = GaugeMetricFamily("sluice_group_inflight", "Messages delivered and not acked",
                                     labels=["group", "topic", "queue"])
        consumed = GaugeMetricFamily("sluice_group_consumed_messages",
                                     "Sum of a group's committed offsets per topic",
                                     labels=["group", "topic"])
        members = GaugeMetricFamily("sluice_group_members", "Live members of a group",
                                    labels=["group"])
        live = 0
        for group in broker.list_groups():
            stats = broker.describe_group(group.name)
            members.add_metric([group.name], len(stats.members))
            live += len(stats.members)
            per_topic: dict[str, int] = {}
            for q in stats.lag:
                lag.add_metric([group.name, q.topic, str(q.queue_id)], q.lag)
                inflight.add_metric([group.name, q.topic, str(q.queue_id)], q.inflight)
                per_topic[q.topic] = per_topic.get(q.topic, 0) + q.committed
            for topic, committed in per_topic.items():
                consumed.add_metric([group.name, topic], committed)
        yield from (lag, inflight, consumed, members)
        clients = self.deps.clients.connected_count() if self.deps.clients else live
        yield GaugeMetricFamily("sluice_connected_clients",
                                "Connected protocol clients (live group members when no "
                                "listener reports connections)", value=clients)

    def _counters(self, broker: Any) -> Iterator[Metric]:
        """The broker's own counters since start: ``(metric, topic or group) -> count``."""
        counters = getattr(broker, "counters", None) or {}
        families = {metric: CounterMetricFamily(f"sluice_{metric}", text, labels=[label])
                    for metric, (label, text) in BROKER_COUNTERS.items()}
        for (metric, name), value in sorted(counters.items()):
            if metric not in families:
                families[metric] = CounterMetricFamily(f"sluice_{metric}", f"Broker counter {metric}",
                                                       labels=["name"])
            families[metric].add_metric([name], value)
        yield from families.values()


_TRAFFIC = (("connections_opened", "sluice_protocol_connections_opened",
             "Connections whose handshake and login succeeded, since the broker started"),
            ("messages_published", "sluice_protocol_messages_published",
             "Messages clients sent to the broker, counted as they arrive, since start"),
            ("messages_delivered", "sluice_protocol_messages_delivered",
             "Messages the broker sent to clients (redeliveries included) since start"),
            ("messages_acked", "sluice_protocol_messages_acked",
             "Deliveries clients acknowledged since start"))
_BYTES = (("bytes_received", "sluice_protocol_received_bytes",
           "Bytes read from clients since start (MQTT and AMQP frames, after TLS and WebSocket)"),
          ("bytes_sent", "sluice_protocol_sent_bytes",
           "Bytes written to clients since start (MQTT and AMQP frames, before TLS and WebSocket)"))


def protocol_metrics(clients: ClientDirectory) -> Iterator[Metric]:
    """Connections open now and each protocol's counters (``core.traffic``), by protocol."""
    connections = GaugeMetricFamily("sluice_protocol_connections", "Client connections open now",
                                    labels=["protocol"])
    for protocol, count in clients.connected_by_protocol().items():
        connections.add_metric([protocol], count)
    yield connections
    traffic = clients.traffic()
    for field, name, text in _TRAFFIC:
        family = CounterMetricFamily(name, text, labels=["protocol"])
        for protocol, counts in traffic.items():
            family.add_metric([protocol], getattr(counts, field))
        yield family
    for field, name, text in _BYTES:
        family = CounterMetricFamily(name, text, labels=["protocol"])
        for protocol, counts in traffic.items():
            if counts.counts_bytes:
                family.add_metric([protocol], getattr(counts, field))
        yield family


MAX_QUEUE_SERIES = 1000
"""AMQP queues with their own series, the first by (vhost, queue); the rest are in the
per-vhost totals only, so a broker with many queues cannot blow up Prometheus."""
_QUEUE_GAUGES = (("messages_ready", "Messages ready for delivery"),
                 ("messages_unacknowledged", "Messages delivered and not yet acknowledged"),
                 ("consumers", "Consumers"))
_QUEUE_COUNTERS = (("published", "Messages routed into the queue since it was created"),
                   ("delivered", "Deliveries and gets (redeliveries included) since start"),
                   ("acked", "Deliveries settled (acked, or rejected without requeue) since "
                             "start"))


def amqp_queue_metrics(queues: list[dict[str, Any]]) -> Iterator[Metric]:
    """Per-queue series (at most ``MAX_QUEUE_SERIES``) and per-vhost totals of AMQP queues."""
    per_queue = {name: GaugeMetricFamily(f"sluice_amqp_queue_{name}", text,
                                         labels=["vhost", "queue"])
                 for name, text in _QUEUE_GAUGES}
    per_queue |= {name: CounterMetricFamily(f"sluice_amqp_queue_{name}", text,
                                            labels=["vhost", "queue"])
                  for name, text in _QUEUE_COUNTERS}
    totals = {name: GaugeMetricFamily(f"sluice_amqp_vhost_{name}", f"{text}, summed over the "
                                      "virtual host's queues", labels=["vhost"])
              for name, text in _QUEUE_GAUGES}
    sums: dict[str, dict[str, int]] = {}
    for n, queue in enumerate(queues):
        vhost = queue["vhost"]
        if n < MAX_QUEUE_SERIES:
            for name, family in per_queue.items():
                family.add_metric([vhost, queue["name"]], queue[name])
        held = sums.setdefault(vhost, dict.fromkeys(totals, 0))
        for name in totals:
            held[name] += queue[name]
    for vhost, held in sums.items():
        for name, family in totals.items():
            family.add_metric([vhost], held[name])
    yield from per_queue.values()
    yield from totals.values()
    yield GaugeMetricFamily("sluice_amqp_queues", "AMQP queues", value=len(queues))
    yield GaugeMetricFamily("sluice_amqp_queues_without_series",
                            f"AMQP queues beyond the first {MAX_QUEUE_SERIES}, counted in the "
                            "per-vhost totals only", value=max(0, len(queues) - MAX_QUEUE_SERIES))


BROKER_COUNTERS = {
    "messages_in": ("topic", "Messages accepted from producers since the broker started"),
    "bytes_in": ("topic", "Body bytes accepted from producers since the broker started"),
    "messages_out": ("topic", "Messages delivered to consumers since the broker started"),
    "bytes_out": ("topic", "Body bytes delivered to consumers since the broker started"),
    "dead_lettered": ("group", "Messages moved to a dead-letter topic since the broker started"),
    "messages_withheld": ("topic", "Messages withheld from a reader because an access rule denies "
                                   "it their subject, by the topic they were sent to, since the "
                                   "broker started"),
}


def tier_metrics(tier: Any) -> Iterator[Metric]:
    """Tiered storage (``core.tiering.TieringLoop``): what this broker uploaded since it
    started, what waits, how late the tier is."""
    status, counters = tier.status(), tier.counters
    yield CounterMetricFamily("sluice_tier_segments", "Segments this broker tiered since it "
                              "started", value=counters.segments)
    yield CounterMetricFamily("sluice_tier_bytes", "Bytes of data files this broker uploaded "
                              "to the tier since it started", value=counters.bytes)
    yield CounterMetricFamily("sluice_tier_errors", "Failed tiering passes (object store "
                              "unreachable, refused, full) since the broker started",
                              value=counters.errors)
    yield GaugeMetricFamily("sluice_tier_pending_bytes", "Bytes of sealed segments waiting to "
                            "be tiered", value=status.get("pending_bytes") or 0)
    yield GaugeMetricFamily("sluice_tier_lag_seconds", "How long the oldest sealed segment not "
                            "yet tiered has waited (0: none waits)",
                            value=status["lag_ms"] / 1000)
    last = status.get("last_success_ms")
    if last:
        yield GaugeMetricFamily("sluice_tier_last_success_timestamp_seconds", "When a tiering "
                                "pass last succeeded (Unix time)", value=last / 1000)
