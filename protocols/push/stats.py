"""What a push subscription has done since the broker started: counts, the last outcome, and
the latency from store time to the receiver's 2xx (a bounded window of recent samples)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

LATENCY_SAMPLES = 4096
"""Recent deliveries whose latency the percentiles are taken over."""


@dataclass
class PushStats:
    """Counters of one subscription; ``state`` is running, paused, failing or refused."""

    delivered: int = 0
    failed: int = 0
    """Attempts that did not get a 2xx (each retry counts)."""
    retrying: int = 0
    """Messages waiting for their next attempt now."""
    dead_lettered: int = 0
    replies: int = 0
    filtered: int = 0
    """Messages the subscription's filters or access rules left out (settled without a request)."""
    lag: int = 0
    last_error: str = ""
    last_status: int | None = None
    state: str = "running"
    latencies: deque[float] = field(default_factory=lambda: deque(maxlen=LATENCY_SAMPLES))

    def percentile(self, fraction: float) -> float | None:
        """The latency (ms) below which ``fraction`` of recent deliveries came, None before any."""
        if not self.latencies:
            return None
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]

    def to_json(self) -> dict[str, Any]:
        """As the admin API shows it."""
        return {"state": self.state, "delivered": self.delivered, "failed": self.failed,
                "retrying": self.retrying, "dead_lettered": self.dead_lettered,
                "replies": self.replies, "filtered": self.filtered, "lag": self.lag,
                "latency_ms": {"p50": self.percentile(0.5), "p99": self.percentile(0.99)},
                "last_error": self.last_error, "last_status": self.last_status}
