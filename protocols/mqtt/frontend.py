"""The MQTT front end: the session registry over its store, and one adapter per accepted wire.

Three rooms with one-way dependencies, put together here:

- ``adapter.py`` (with ``flow_control.py`` and ``publish_intake.py``): one connection, wire
  ⇄ sans-IO `ServerConnection`; it knows the registry only as a `typing.Protocol`.
- ``registry.py`` (with ``session.py``, ``shared.py``, ``wills.py``, ``login.py`` and
  ``retained.py``): sessions by client id and whatever outlives a connection; sessions get
  the registry as one injected `SessionHost`.
- ``session_store.py``: what survives a restart, in core's compacted state.

Listeners (TCP, TLS, WebSocket) hand every accepted wire to ``new_connection``.

Runs on the event loop; not thread-safe.
"""

from __future__ import annotations

from core.model import Principal
from core.named_queues import NamedQueues
from core.service import Broker
from core.state_store import StateStore
from core.untrusted import DenialLog

from .adapter import MqttAdapter
from .options import MqttOptions
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

    def new_connection(self, wire: Wire) -> MqttAdapter:
        """The adapter for a newly accepted wire; closed at once beyond the connection limits."""
        adapter = MqttAdapter(self.registry, wire)
        if not self.registry.admit(adapter):
            adapter.refuse_at_once()
        return adapter
