"""One client connection: bytes from a `Wire` into the sans-IO `ServerConnection`, its events
to the session registry, and the answers back to the wire.

Writes are collected and handed to the wire once per event-loop iteration. Inbound PUBLISHes
go through the connection's `PublishIntake`, backpressure through its `FlowControl`. The
adapter is the `Link` its session delivers through, and knows the registry only as `Registry`.
Only the CONNECT handshake and the QoS 2 steps of persistent sessions (which wait for their
state to be saved) run as tasks.

Runs on the event loop; not thread-safe.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Protocol

from core.clients import log_connected, log_disconnected
from core.model import Principal
from core.traffic import ClientCounters, Traffic
from core.untrusted import clip

from .codec import MQTT_5
from .connection import Inflight, ServerConnection
from .events import (ConnectionClosed, ConnectRequested, MessagePublished, PublishAcknowledged,
                     PublishReceived, ReleaseRequested, SubscribeRequested, UnsubscribeRequested)
from .flow_control import FlowControl
from .limits import Limits
from .mapping import now_ms
from .login import Login, Refused, peer_host
from .options import MqttOptions
from .packets import Will
from .properties import NO_PROPERTIES, Properties
from .publish_intake import IntakeServices, PublishIntake
from .reason_codes import ReasonCode
from .registry import Granted, NewSubscriptions
from .session import Session
from .state_table import State
from .wire import Wire

log = logging.getLogger(__name__)

PROTOCOL = "mqtt"
"""The protocol's name in client lists and connect/disconnect log lines."""


class Registry(IntakeServices, Protocol):
    """What an adapter needs from the session registry (`registry.SessionRegistry`)."""

    @property
    def options(self) -> MqttOptions: ...

    @property
    def limits(self) -> Limits: ...

    @property
    def traffic(self) -> Traffic: ...

    async def log_in(self, event: ConnectRequested, peer: str,
                     certificate_user: str | None = None) -> Login: ...

    async def open_session(self, link: MqttAdapter, login: Login,
                           clean_start: bool) -> tuple[Session, bool]: ...

    def resume_state(self, session: Session) -> Inflight | None: ...

    def connection_accepted(self, link: MqttAdapter) -> None: ...

    def connection_closed(self, link: MqttAdapter, publish_will: bool,
                          expiry_s: int | None) -> None: ...

    def connection_released(self, link: MqttAdapter) -> None: ...

    def subscribe(self, session: Session, principal: Principal, event: SubscribeRequested,
                  v5: bool) -> tuple[Granted, NewSubscriptions, asyncio.Task | None]: ...

    def send_retained(self, session: Session, new: NewSubscriptions) -> None: ...

    def unsubscribe(self, session: Session, filters: list[str]) -> list[ReasonCode]: ...


class MqttAdapter:
    """The registry's handler for one wire; also the `Link` its session delivers through."""

    def __init__(self, registry: Registry, wire: Wire) -> None:
        options = registry.options
        self.registry = registry
        self.wire = wire
        self.traffic = registry.traffic
        opened = time.monotonic()
        self.counters = ClientCounters(opened)
        """This connection's messages and rates, for the admin API's client list."""
        self.conn = ServerConnection(receive_maximum=options.receive_maximum,
                                     topic_alias_maximum=options.topic_alias_maximum,
                                     max_packet_size=options.max_packet_size,
                                     max_outbound_inflight=options.max_inflight_messages,
                                     limits=registry.limits, opened_at=opened)
        self.loop = asyncio.get_running_loop()
        self.flow = FlowControl(wire, options.max_buffered_bytes)
        self.intake = PublishIntake(registry, self.conn, self.flow, self._write, self.kick)
        self.principal: Principal | None = None
        self.connected_at_ms: int | None = None
        """When the CONNACK was sent (None before): the client counts as connected from then."""
        self.session: Session | None = None
        self.client_id = ""
        self.will: Will | None = None
        self._done = False
        """The wire is closed (or closing) and the registry was told: nothing more is written."""
        self._out = bytearray()
        self._flush_scheduled = False

    @property
    def peer(self) -> str:
        return self.wire.peer

    def details(self) -> dict[str, object]:
        return {"mqtt_version": "5.0" if self.conn.version == MQTT_5 else "3.1.1",
                "keep_alive_s": self.conn.keep_alive}

    @property
    def closed(self) -> bool:
        """Nothing more may be sent: the connection closed, even if the event saying so has
        not been handled yet (packets read with it are answered first)."""
        return self._done or self.conn.state is State.CLOSED

    # ---------------------------------------------------------------- wire side

    def data_received(self, data: bytes) -> None:
        if self._done:
            return
        self.traffic.bytes_received += len(data)
        self.conn.receive_data(data, time.monotonic())
        self._drain_events()

    def connection_lost(self) -> None:
        if not self._done:
            self.conn.receive_data(b"", time.monotonic())
            self._drain_events()
        self.registry.connection_released(self)

    def writable(self) -> None:
        if self.session is not None and self.session.link is self:
            self.session.writable()

    def check_timeouts(self, now: float) -> None:
        """The CONNECT timeout and keep alive (the registry's sweep calls this)."""
        self.conn.check_timeouts(now)
        self._drain_events()

    def refuse_at_once(self) -> None:
        """Close a connection the registry cannot take (too many open or pending): nothing is
        read from it and nothing sent."""
        self._done = True
        self.wire.abort()

    def _write(self, data: bytes) -> None:
        if not data or self._done:
            return
        self._out += data
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._out and not self._done:
            self.wire.write(bytes(self._out))
            self.traffic.bytes_sent += len(self._out)
        self._out.clear()

    # ---------------------------------------------------------------- Link for the session

    @property
    def send_quota(self) -> int:
        return self.conn.send_quota if not self.closed else 0

    @property
    def congested(self) -> bool:
        return self.flow.congested(len(self._out))

    @property
    def has_properties(self) -> bool:
        return self.conn.version == MQTT_5

    def publish(self, topic: str, payload: bytes, qos: int, retain: bool, properties: Properties,
                packet_id: int | None = None, dup: bool = False,
                encoded: dict | None = None) -> int | None:
        if self.closed:
            return None
        if self.conn.version != MQTT_5:
            properties = NO_PROPERTIES  # what only MQTT 5 can say is left out, not the message
        try:
            packet_id, data = self.conn.publish(topic, payload, qos, retain, properties,
                                                packet_id=packet_id, dup=dup, encoded=encoded)
        except ValueError as too_big:  # larger than the client's Maximum Packet Size
            log.info("client %s: message on %s not sent: %s", clip(self.client_id), clip(topic),
                     too_big)
            return None
        self._write(data)
        self.traffic.messages_delivered += 1
        self.counters.delivered += 1
        return packet_id

    def release(self, packet_id: int) -> None:
        self._write(self.conn.release(packet_id))

    def kick(self, reason: ReasonCode) -> None:
        """Close from the broker's side (takeover, shutdown), telling an MQTT 5 client why. A
        connection that closed by itself is left to its pending ConnectionClosed."""
        if self.closed:
            return
        self._write(self.conn.disconnect(reason))
        self._closed(will=reason is not ReasonCode.NormalDisconnection, expiry=None,
                     reason=f"closed by the broker: {reason.name}")

    # ---------------------------------------------------------------- events

    def _drain_events(self) -> None:
        conn, intake = self.conn, self.intake
        while (event := conn.next_event()) is not None:
            kind = type(event)
            if kind is MessagePublished:
                self.traffic.messages_published += 1
                self.counters.published += 1
                intake.add(event)
            elif kind is PublishAcknowledged:
                if event.reason_code.value < 0x80:  # a failure code ends the exchange unacked
                    self.traffic.messages_acked += 1
                if self.session is not None:
                    self.session.acknowledged(event.packet_id)
            elif kind is SubscribeRequested:
                intake.flush()
                self._on_subscribe(event)
            elif kind is UnsubscribeRequested:
                intake.flush()
                assert self.session is not None
                self._write(conn.ack_unsubscribe(
                    event.packet_id, self.registry.unsubscribe(self.session, event.filters)))
            elif kind is PublishReceived:
                self._on_publish_received(event.packet_id)
            elif kind is ReleaseRequested:
                intake.release_requested(event.packet_id)
            elif kind is ConnectRequested:
                self.flow.connect_received()
                self.registry.spawn(self._connect(event))
            elif kind is ConnectionClosed:
                if event.detail:  # a protocol error or timeout, not just a closed socket
                    self._log_closed(event)
                intake.flush()
                self._write(conn.data_to_send())
                self._closed(event.will_should_publish, event.session_expiry_interval,
                             _close_reason(event))
                return
        intake.flush()
        self._write(conn.data_to_send())

    def _log_closed(self, event: ConnectionClosed) -> None:
        """A connection closed for an error before its CONNACK: one line per peer host and
        reason a minute, so nobody can fill the log by connecting."""
        if self.connected_at_ms is None:  # after CONNACK the disconnect line says what was wrong
            self.registry.denials.denied(
                peer_host(self.peer), event.reason_code.name,
                "MQTT connection from %s closed before CONNACK: %s (%s)", self.peer,
                event.reason_code.name, clip(event.detail))

    def _closed(self, will: bool, expiry: int | None, reason: str) -> None:
        self._flush()
        self._done = True
        self.wire.close()
        if self.connected_at_ms is not None and self.principal is not None:
            log_disconnected(PROTOCOL, self.client_id, self.principal.user, self.peer, reason)
        self.registry.connection_closed(self, will, expiry)

    # ---------------------------------------------------------------- CONNECT

    async def _connect(self, event: ConnectRequested) -> None:
        try:
            await self._handshake(event)
        except Refused as refused:
            self._refuse(refused.reason, refused.detail)
        except Exception:  # noqa: BLE001 - one bad handshake must not take the listener down
            log.exception("MQTT handshake from %s failed", self.peer)
            self._refuse(ReasonCode.UnspecifiedError)

    async def _handshake(self, event: ConnectRequested) -> None:
        registry = self.registry
        login = await registry.log_in(event, self.peer,
                                      getattr(self.wire, "certificate_user", None))
        self.principal = login.principal
        if self.closed:
            return
        self.client_id, self.will = login.client_id, event.will
        session, present = await registry.open_session(self, login, event.clean_start)
        if self.closed:
            registry.connection_closed(self, False, None)
            return
        self.session = session
        self.intake.start(login.principal, login.client_id, session)
        self.conn.adapter_releases = session.persistent
        self._write(self.conn.accept(session_present=present,
                                     assigned_client_id=login.assigned_client_id,
                                     properties=login.properties,
                                     resume=registry.resume_state(session)))
        registry.connection_accepted(self)
        self.traffic.connections_opened += 1
        self.connected_at_ms = now_ms()
        details = self.details()
        log_connected(PROTOCOL, login.client_id, login.principal.user, self.peer,
                      f"MQTT {details['mqtt_version']}, keep alive {details['keep_alive_s']} s, "
                      f"session {'resumed' if present else 'new'}")
        if not self.closed:  # packets sent right behind CONNECT may have closed it
            for data in self.conn.pending_resend():
                self._write(data)
            session.attach(self, login.principal)
            self.flow.connect_answered()
        self._drain_events()

    def _refuse(self, reason: ReasonCode, reason_string: str = "") -> None:
        if self.closed:
            return
        if self.conn.state is State.CONNECTED:  # accepted already: disconnect instead
            self.kick(reason)
            return
        self._write(self.conn.refuse(reason, reason_string))
        self._flush()
        self._done = True
        self.wire.close()
        self.registry.connection_closed(self, False, None)

    # ---------------------------------------------------------------- SUBSCRIBE, QoS 2 steps

    def _on_subscribe(self, event: SubscribeRequested) -> None:
        session = self.session
        assert session is not None and self.principal is not None
        granted, new, saving = self.registry.subscribe(session, self.principal, event,
                                                       self.conn.version == MQTT_5)
        if saving is None:
            self._ack_subscribe(session, event.packet_id, granted, new)
        else:  # a persistent session's subscriptions survive a crash once its SUBACK is out
            self.registry.spawn(self._ack_subscribe_after_saving(session, event.packet_id, granted, new, saving))

    def _ack_subscribe(self, session: Session, packet_id: int, granted: Granted, new: NewSubscriptions) -> None:
        self._write(self.conn.ack_subscribe(packet_id, granted))
        self.registry.send_retained(session, new)

    async def _ack_subscribe_after_saving(self, session: Session, packet_id: int, granted: Granted,
                                          new: NewSubscriptions, saving: asyncio.Task) -> None:
        with contextlib.suppress(Exception):  # a failed save is logged by the registry; the
            await saving  # subscriptions hold for this connection all the same
        if not self.closed:
            self._ack_subscribe(session, packet_id, granted, new)

    def _on_publish_received(self, packet_id: int) -> None:
        session = self.session
        if session is None or not session.needs_persisted_release(packet_id):
            self.release(packet_id)
            return
        session.record_received(packet_id)
        self.registry.spawn(self._release_after_saving(session, packet_id))

    async def _release_after_saving(self, session: Session, packet_id: int) -> None:
        await self.registry.save_qos2(session)
        if not self.closed:
            self.release(packet_id)


def _close_reason(event: ConnectionClosed) -> str:
    """Why a connection ended, for its disconnect log line."""
    if event.reason_code is ReasonCode.UnspecifiedError and not event.detail:
        return "connection lost"
    if event.reason_code.value == 0 and not event.detail:
        return "the client sent DISCONNECT"
    return event.reason_code.name + (f": {clip(event.detail)}" if event.detail else "")
