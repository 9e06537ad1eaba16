"""Who is connected, over every protocol: the directory the admin API lists and kicks from.

Each adapter keeps its own connections and sessions and registers one ``ClientSource`` here; the
directory only gathers their views. An adapter logs a client's arrival and departure with
``log_connected`` / ``log_disconnected``, so every protocol's lines read alike and name the user,
the client id and the address. Runs on the event loop; not thread-safe.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from .errors import ClientNotFound
from .traffic import ClientCounters, Traffic
from .untrusted import clip

log = logging.getLogger("sluice.clients")


@dataclass(frozen=True)
class ClientView:
    """One client as the admin API shows it.

    ``connected`` is False for a persistent session kept while its client is away (MQTT);
    ``subscriptions`` are filters or topics as the protocol writes them; ``details`` holds what
    only one protocol has (MQTT version, keep alive, session expiry; a native client's group;
    ``inflight``, deliveries the client has not acknowledged yet); ``counters`` are the
    connection's message totals and rates (None for a kept session with no connection).
    """

    protocol: str
    client_id: str
    user: str
    address: str
    connected: bool
    connected_at_ms: int | None = None
    subscriptions: tuple[str, ...] = ()
    details: dict[str, Any] = field(default_factory=dict)
    counters: ClientCounters | None = None


class ClientSource(Protocol):
    """What an adapter offers the directory."""

    protocol: str
    traffic: Traffic
    """The protocol's counters since start (`core.traffic`)."""

    def clients(self) -> Iterable[ClientView]:
        """Every client: connected ones and kept sessions."""

    def connected_count(self) -> int:
        """Connections open now."""

    def counters(self) -> Iterable[ClientCounters]:
        """The counters of every connection open now."""

    def kick(self, client_id: str) -> bool:
        """End ``client_id``'s connection (its session stays as the protocol keeps it); False if
        it is not connected."""


class ClientDirectory:
    """The adapters' client sources, by protocol."""

    def __init__(self) -> None:
        self._sources: dict[str, ClientSource] = {}

    def register(self, source: ClientSource) -> None:
        """Add an adapter's source; one per protocol."""
        if source.protocol in self._sources:
            raise ValueError(f"a client source for {source.protocol!r} is already registered")
        self._sources[source.protocol] = source

    @property
    def protocols(self) -> list[str]:
        """The protocols whose clients are listed."""
        return sorted(self._sources)

    def connected_count(self) -> int:
        """Connections open now, over every protocol."""
        return sum(source.connected_count() for source in self._sources.values())

    def connected_by_protocol(self) -> dict[str, int]:
        """Connections open now, by protocol."""
        return {name: source.connected_count() for name, source in sorted(self._sources.items())}

    def traffic(self) -> dict[str, Traffic]:
        """Each protocol's counters since start."""
        return {name: source.traffic for name, source in sorted(self._sources.items())}

    def sample(self, at: float) -> None:
        """Turn every open connection's counts since the previous call into rates (``at``:
        now on the ``time.monotonic`` clock); O(connections)."""
        for source in self._sources.values():
            for counters in source.counters():
                counters.sample(at)

    def list(self, protocol: str | None = None, user: str | None = None) -> list[ClientView]:
        """Clients sorted by protocol and id, optionally of one protocol or one user."""
        found = [view for name, source in sorted(self._sources.items())
                 if protocol in (None, name) for view in source.clients()
                 if user in (None, view.user)]
        return sorted(found, key=lambda view: (view.protocol, view.client_id))

    def get(self, protocol: str, client_id: str) -> ClientView:
        """One client; ClientNotFound if the protocol has none of that id."""
        for view in self._source(protocol).clients():
            if view.client_id == client_id:
                return view
        raise ClientNotFound(f"no {protocol} client {client_id!r} is connected or has a kept "
                             f"session; `sluice client list --protocol {protocol}` lists them")

    def kick(self, protocol: str, client_id: str) -> None:
        """Disconnect a client; ClientNotFound if it is not connected."""
        if not self._source(protocol).kick(client_id):
            raise ClientNotFound(f"no {protocol} client {client_id!r} is connected; "
                                 f"`sluice client list --protocol {protocol}` lists them")

    def _source(self, protocol: str) -> ClientSource:
        source = self._sources.get(protocol)
        if source is None:
            known = ", ".join(self.protocols) or "none"
            raise ClientNotFound(f"no protocol {protocol!r} serves clients here (known: {known})")
        return source


def log_connected(protocol: str, client_id: str, user: str, address: str, detail: str = "") -> None:
    """One INFO line for a client that connected."""
    log.info("%s client %s connected: user %s from %s%s", protocol, clip(client_id),
             clip(user), address, f" ({detail})" if detail else "")


def log_disconnected(protocol: str, client_id: str, user: str, address: str, reason: str) -> None:
    """One INFO line for a client that went away, with why."""
    log.info("%s client %s disconnected: user %s from %s (%s)", protocol, clip(client_id),
             clip(user), address, reason)
