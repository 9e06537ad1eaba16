"""The ``[push]`` settings: where push subscriptions may send, and how many connections they use."""

from __future__ import annotations

from dataclasses import dataclass

from core.sink_policy import SinkPolicy


@dataclass(frozen=True)
class PushOptions:
    """Push delivery over HTTP (``protocols.push``)."""

    allowed_sinks: str = ""
    """Comma-separated CIDRs and host names push sinks may be at besides public addresses
    (loopback, private, link-local, metadata and multicast addresses are refused unless listed
    here), e.g. ``10.1.0.0/16,hooks.internal``."""
    max_connections: int = 256
    """HTTP connections all push subscriptions share at most (one pool for the broker)."""

    def __post_init__(self) -> None:
        SinkPolicy.parse(self.allowed_sinks)  # a ValueError naming the entry that is neither
        if not 1 <= self.max_connections <= 65_536:
            raise ValueError(f"push.max_connections = {self.max_connections} is out of range: "
                             "use 1-65536")
