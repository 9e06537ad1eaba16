"""The MQTT front end: the session registry over its store, and one adapter per accepted wire.

Three rooms with one-way dependencies, put together here:

- ``adapter.py`` (with ``flow_control.py`` and ``publish_intake.py``): one connection, wire
  ⇄ sans-IO `ServerConnection`; it knows the registry only as a `typing.Protocol`.
- ``registry.py`` (with ``session.py``, ``shared.py``, ``wills.py``, ``login.py`` and
  ``retained.py``): sessions by client id and whatever outlives a connection; sessions get
  the registry as one injected `SessionHost`.
- ``session_store.py``: what survives a restart, in core's compacted state.

Listeners (TCP, TLS, WebSocket) hand every accepted wire to ``new_connection``. The front end is
also MQTT's source for core's client directory (``sluice client list|show|kick``).

Runs on the event loop; not thread-safe.
"""

from __future__ import annotations

from collections.abc import Iterator

from core.clients import ClientView
from core.model import Principal
from core.named_queues import NamedQueues
from core.service import Broker
from core.state_store import StateStore
from core.traffic import ClientCounters, Traffic
from core.untrusted import DenialLog

from .adapter import PROTOCOL, MqttAdapter
from .options import MqttOptions
from .reason_codes import ReasonCode
from .registry import SessionRegistry
from .session_store import SessionStore
from .wire import Wire


class MqttFrontend:
    """Everything MQTT the broker starts, feeds wires to and stops."""

    def __init__(self, broker: Broker, queues: NamedQueues, state: StateStore,
                 options: MqttOptions, *, allow_anonymous: bool = False,
                 anonymous_principal: Principal | None = None) -> None:
        self.registry = SessionRegistry(broker, queues, state, options, SessionStore(state),
                                        allow_anonymous=allow_anonymous,
                                        anonymous_principal=anonymous_principal)

    @property
    def denials(self) -> DenialLog:
        """The registry's refusal log (listeners log their refusals into it too)."""
        return self.registry.denials

    async def start(self) -> None:
        """Restore persistent sessions and retained messages before any listener accepts."""
        await self.registry.start()

    async def stop(self) -> None:
        """Disconnect every client and save session state."""
        await self.registry.stop()

    # ---------------------------------------------------------------- core.clients.ClientSource

    protocol = PROTOCOL

    @property
    def traffic(self) -> Traffic:
        """What MQTT clients did since start (every listener's connections add to it)."""
        return self.registry.traffic

    def connected_count(self) -> int:
        return self.registry.connected_count

    def clients(self) -> Iterator[ClientView]:
        """Every session: connected, or kept while its client is away."""
        for client_id, session in list(self.registry.sessions.items()):
            link = self.registry.link_of(client_id)
            subscriptions = tuple(sorted(
                f"$share/{o.share}/{o.topic_filter}" if o.share is not None else o.topic_filter
                for o in session.subscriptions.values()))
            details: dict[str, object] = {"persistent": session.persistent,
                                          "session_expiry_s": session.expiry_s,
                                          "inflight": session.inflight}
            if link is not None:
                details |= link.details()
            yield ClientView(PROTOCOL, client_id, session.owner or "",
                             link.peer if link is not None else "", link is not None,
                             link.connected_at_ms if link is not None else None, subscriptions,
                             details, link.counters if link is not None else None)

    def counters(self) -> Iterator[ClientCounters]:
        """The counters of every connection attached to a session."""
        return (link.counters for link in self.registry.attached())

    def kick(self, client_id: str) -> bool:
        """Disconnect ``client_id`` (MQTT 5: reason 0x98, Administrative action); its will is
        published and a persistent session kept, as for any connection the broker closes."""
        link = self.registry.link_of(client_id)
        if link is None:
            return False
        link.kick(ReasonCode.AdministrativeAction)
        return True

    def new_connection(self, wire: Wire) -> MqttAdapter:
        """The adapter for a newly accepted wire; closed at once beyond the connection limits."""
        adapter = MqttAdapter(self.registry, wire)
        if not self.registry.admit(adapter):
            adapter.refuse_at_once()
        return adapter
