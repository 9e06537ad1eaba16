"""What one protocol's clients did since the broker started, for the metrics page.

Each protocol front end owns one `Traffic` and its connections add to it on their hot paths: the
fields are plain ints incremented on the event loop (no lock, no object per message), and the
metrics collector reads them when Prometheus scrapes.
"""

from __future__ import annotations


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
