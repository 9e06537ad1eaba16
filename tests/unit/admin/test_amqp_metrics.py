"""Per-queue AMQP metrics stay bounded: the first MAX_QUEUE_SERIES queues get their own series,
every queue counts in its virtual host's sums."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.registry import Collector

from protocols.admin.metrics import MAX_QUEUE_SERIES, amqp_queue_metrics


class Queues(Collector):
    def __init__(self, rows) -> None:
        self.rows = rows

    def collect(self):
        return amqp_queue_metrics(self.rows)


def row(vhost: str, n: int) -> dict:
    return {"vhost": vhost, "name": f"q{n:05d}", "messages_ready": 2,
            "messages_unacknowledged": 1, "consumers": 1, "published": 5, "delivered": 3,
            "acked": 2}


def test_many_queues_get_at_most_the_cap_of_series_and_all_count_in_the_sums():
    rows = [row("/", n) for n in range(MAX_QUEUE_SERIES + 5)] + [row("shop", 0)]
    registry = CollectorRegistry()
    registry.register(Queues(rows))
    text = generate_latest(registry).decode()
    series = [line for line in text.splitlines()
              if line.startswith("sluice_amqp_queue_messages_ready{")]
    assert len(series) == MAX_QUEUE_SERIES
    assert 'sluice_amqp_vhost_messages_ready{vhost="/"} %.1f' % (2 * (MAX_QUEUE_SERIES + 5)) in text
    assert 'sluice_amqp_vhost_messages_ready{vhost="shop"} 2.0' in text
    assert "sluice_amqp_queues_without_series 6.0" in text
    assert 'sluice_amqp_queue_acked_total{queue="q00000",vhost="/"} 2.0' in text
