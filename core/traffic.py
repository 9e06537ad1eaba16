"""What one protocol's clients did since the broker started, for the metrics page.

Each protocol front end owns one `Traffic` and its connections add to it on their hot paths: the
fields are plain ints incremented on the event loop (no lock, no object per message), and the
metrics collector reads them when Prometheus scrapes.
"""

from __future__ import annotations


def per_second(after: int, before: int, elapsed_s: float) -> float:
    """The rate of a counter that went from ``before`` to ``after`` in ``elapsed_s`` (> 0)
    seconds, rounded to thousandths; a counter that went down (a reset) counts as no change."""
    return round(max(0, after - before) / elapsed_s, 3)


class Traffic:
    """Counters of one protocol since start. Runs on the event loop; not thread-safe."""

    __slots__ = ("counts_bytes", "connections_opened", "messages_published", "messages_delivered",
                 "messages_acked", "bytes_received", "bytes_sent")

    def __init__(self, *, counts_bytes: bool = True) -> None:
        self.counts_bytes = counts_bytes
        """False where the transport frames the bytes itself (gRPC): the byte fields stay 0."""
        self.connections_opened = 0
        """Connections whose handshake (and login) succeeded."""
        self.messages_published = 0
        """Messages clients sent to the broker, counted as they arrive."""
        self.messages_delivered = 0
        """Messages the broker sent to clients, redeliveries included."""
        self.messages_acked = 0
        """Deliveries that clients acknowledged."""
        self.bytes_received = 0
        """Bytes read from clients (the protocol's frames; after TLS and WebSocket framing)."""
        self.bytes_sent = 0
        """Bytes written to clients, in the same terms."""


class ClientCounters:
    """What one connection did since it opened, and how fast over the last sampling interval.

    The connection's front end increments ``published`` and ``delivered`` where it counts its
    protocol's `Traffic` (plain ints, no lock); a sampler calls ``sample`` every few seconds to
    turn the change since the previous sample into per-second rates. The object lives and dies
    with its connection, so nothing needs forgetting when the connection goes. Runs on the event
    loop; not thread-safe.
    """

    __slots__ = ("published", "delivered", "publish_rate", "deliver_rate", "_at", "_published",
                 "_delivered")

    def __init__(self, at: float) -> None:
        """``at``: now on the sampler's clock (``time.monotonic``); the first rates run from it."""
        self.published = 0
        """Messages the client sent to the broker."""
        self.delivered = 0
        """Messages the broker sent to the client, redeliveries included."""
        self.publish_rate = 0.0
        """Messages published per second over the last sampling interval."""
        self.deliver_rate = 0.0
        """Messages delivered per second over the last sampling interval."""
        self._at = at
        self._published = 0
        self._delivered = 0

    def sample(self, at: float) -> None:
        """Set the rates from the counts since the previous sample (taken at ``self._at``)."""
        elapsed = at - self._at
        if elapsed <= 0:
            return
        self.publish_rate = per_second(self.published, self._published, elapsed)
        self.deliver_rate = per_second(self.delivered, self._delivered, elapsed)
        self._at, self._published, self._delivered = at, self.published, self.delivered
