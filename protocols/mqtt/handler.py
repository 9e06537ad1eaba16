"""One client connection: drives the sans-IO `ServerConnection` over a `Wire` and acts on its
events through the front end (authentication, sessions, publishing, subscribing).

Inbound PUBLISHes read in one chunk are stored with one core send; their PUBACK/PUBREC go out
once stored (durable under ``sync`` flush). Writes are collected and handed to the wire once
per event-loop iteration. Only the CONNECT handshake and QoS 2 steps of persistent sessions
(which wait for their state to be saved) run as tasks.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import replace
from typing import TYPE_CHECKING

from core import errors
from core.errors import AccessDenied, InvalidArgument, SluiceError, Unauthenticated
from core.model import Action, OutgoingMessage, Principal
from core.untrusted import clip

from .codec import MQTT_5
from .errors import reason_for
from .connection import ServerConnection
from .events import (ConnectionClosed, ConnectRequested, MessagePublished, PublishAcknowledged,
                     PublishReceived, ReleaseRequested, SubscribeRequested, UnsubscribeRequested)
from .mapping import RETAIN_PROPERTY, now_ms, to_outgoing
from .packets import Will
from .properties import NO_PROPERTIES, Properties
from .reason_codes import ReasonCode
from .session_store import NEVER_EXPIRES, RETAINED_QUEUE, SubscriptionOptions
from .state_table import State
from .topics import InvalidFilter, check_filter, split_shared
from .wire import Wire

if TYPE_CHECKING:
    from .frontend import MqttFrontend
    from .session import Session

log = logging.getLogger(__name__)

MAX_UNSTORED = 8192
"""Messages of one connection read but not yet stored before reading from it pauses."""

class MqttConnection:
    """The front end's handler for one wire; also the `Link` its session delivers through."""

    def __init__(self, frontend: MqttFrontend, wire: Wire) -> None:
        options = frontend.options
        self.frontend = frontend
        self.wire = wire
        self.conn = ServerConnection(receive_maximum=options.receive_maximum,
                                     topic_alias_maximum=options.topic_alias_maximum,
                                     max_packet_size=options.max_packet_size,
                                     max_outbound_inflight=options.max_inflight_messages,
                                     limits=frontend.limits, opened_at=time.monotonic())
        self.loop = asyncio.get_running_loop()
        self.principal: Principal | None = None
        self.session: Session | None = None
        self.client_id = ""
        self.will: Will | None = None
        self._done = False
        """The wire is closed (or closing) and the front end was told: nothing more is written."""
        self._out = bytearray()
        self._flush_scheduled = False
        self._batch: list[tuple[MessagePublished, OutgoingMessage]] = []
        self._previous: asyncio.Future | None = None
        self._unstored = 0
        """Messages read from this client and not yet stored: reading pauses above
        ``MAX_UNSTORED``, so a fast publisher waits for the store instead of filling memory."""
        self._reading_paused = False
        self._max_buffered = options.max_buffered_bytes

    @property
    def closed(self) -> bool:
        """Nothing more may be sent: the connection closed, even if the event saying so has
        not been handled yet (packets read with it are answered first)."""
        return self._done or self.conn.state is State.CLOSED

    # ---------------------------------------------------------------- wire side

    def data_received(self, data: bytes) -> None:
        if self._done:
            return
        self.conn.receive_data(data, time.monotonic())
        self._drain_events()

    def connection_lost(self) -> None:
        if not self._done:
            self.conn.receive_data(b"", time.monotonic())
            self._drain_events()
        self.frontend.connection_released(self)

    def writable(self) -> None:
        if self.session is not None and self.session.link is self:
            self.session.writable()

    def check_timeouts(self, now: float) -> None:
        """The CONNECT timeout and keep alive (the front end's sweep calls this)."""
        self.conn.check_timeouts(now)
        self._drain_events()

    def refuse_at_once(self) -> None:
        """Close a connection the front end cannot take (too many open or pending): nothing is
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
        self._out.clear()

    # ---------------------------------------------------------------- Link for the session

    @property
    def send_quota(self) -> int:
        return self.conn.send_quota if not self.closed else 0

    @property
    def congested(self) -> bool:
        return len(self._out) + self.wire.buffered() > self._max_buffered

    def publish(self, topic: str, payload: bytes, qos: int, retain: bool, properties: Properties,
                packet_id: int | None = None, dup: bool = False) -> int | None:
        if self.closed:
            return None
        if self.conn.version != MQTT_5:
            properties = NO_PROPERTIES  # what only MQTT 5 can say is left out, not the message
        try:
            packet_id, data = self.conn.publish(topic, payload, qos, retain, properties,
                                                packet_id=packet_id, dup=dup)
        except ValueError as too_big:  # larger than the client's Maximum Packet Size
            log.info("client %s: message on %s not sent: %s", clip(self.client_id), clip(topic),
                     too_big)
            return None
        self._write(data)
        return packet_id

    def release(self, packet_id: int) -> None:
        self._write(self.conn.release(packet_id))

    def kick(self, reason: ReasonCode) -> None:
        """Close from the broker's side (takeover, shutdown), telling an MQTT 5 client why. A
        connection that closed by itself is left to its pending ConnectionClosed."""
        if self.closed:
            return
        self._write(self.conn.disconnect(reason))
        self._closed(will=reason is not ReasonCode.NormalDisconnection, expiry=None)

    # ---------------------------------------------------------------- events

    def _drain_events(self) -> None:
        conn = self.conn
        while (event := conn.next_event()) is not None:
            kind = type(event)
            if kind is MessagePublished:
                self._on_publish(event)
            elif kind is PublishAcknowledged:
                if self.session is not None:
                    self.session.acknowledged(event.packet_id)
            elif kind is SubscribeRequested:
                self._flush_publishes()
                self._on_subscribe(event)
            elif kind is UnsubscribeRequested:
                self._flush_publishes()
                self._on_unsubscribe(event)
            elif kind is PublishReceived:
                self._on_publish_received(event.packet_id)
            elif kind is ReleaseRequested:
                self._on_release(event.packet_id)
            elif kind is ConnectRequested:
                self.wire.pause_reading()  # nothing is read before CONNACK (3.1.4)
                self.frontend.spawn(self._connect(event))
            elif kind is ConnectionClosed:
                if event.detail:  # a protocol error or timeout, not just a closed socket
                    self._log_closed(event)
                self._flush_publishes()
                self._write(conn.data_to_send())
                self._closed(event.will_should_publish, event.session_expiry_interval)
                return
        self._flush_publishes()
        self._write(conn.data_to_send())

    def _log_closed(self, event: ConnectionClosed) -> None:
        """One line per connection closed for an error; before authentication one line per
        peer host and reason a minute, so nobody can fill the log by connecting."""
        if self.principal is None:
            self.frontend.denials.denied(
                _host(self.wire.peer), event.reason_code.name,
                "MQTT connection from %s closed before CONNACK: %s (%s)", self.wire.peer,
                event.reason_code.name, clip(event.detail))
            return
        log.info("MQTT client %s from %s disconnected: %s (%s)", clip(self.client_id),
                 self.wire.peer, event.reason_code.name, clip(event.detail))

    def _closed(self, will: bool, expiry: int | None) -> None:
        self._flush()
        self._done = True
        self.wire.close()
        self.frontend.connection_closed(self, will, expiry)

    # ---------------------------------------------------------------- CONNECT

    async def _connect(self, event: ConnectRequested) -> None:
        try:
            await self._handshake(event)
        except Exception:  # noqa: BLE001 - one bad handshake must not take the listener down
            log.exception("MQTT handshake from %s failed", self.wire.peer)
            self._refuse(ReasonCode.UnspecifiedError)

    async def _handshake(self, event: ConnectRequested) -> None:
        frontend = self.frontend
        v5 = event.version == MQTT_5
        try:
            self.principal = await frontend.authenticate(event.username, event.password)
        except Unauthenticated as refused:
            frontend.denials.denied(
                _host(self.wire.peer), "login", "MQTT client %s from %s refused: %s",
                clip(event.client_id), self.wire.peer, clip(str(refused), 300))
            self._refuse(ReasonCode.BadUserNameOrPassword, str(refused))
            return
        if self.closed:
            return
        client_id, assigned = event.client_id, None
        if not client_id:
            if not event.clean_start and not v5:
                self._refuse(ReasonCode.ClientIdentifierNotValid,
                             "a persistent session needs a client identifier")
                return
            client_id = assigned = f"sluice-{uuid.uuid4().hex}"
        if v5:
            expiry = event.properties.session_expiry_interval or 0
        else:
            expiry = 0 if event.clean_start else NEVER_EXPIRES
        expiry = min(expiry, frontend.options.max_session_expiry_s)
        self.principal = replace(self.principal, client_id=client_id)
        if event.will is not None:
            refusal = self._check_will(event.will)
            if refusal is not None:
                self._refuse(refusal, f"not authorized to publish the will on {event.will.topic}")
                return
        self.client_id = client_id
        self.will = event.will
        try:
            session, present = await frontend.open_session(self, client_id, event.clean_start,
                                                           expiry)
        except AccessDenied as refused:
            frontend.denials.denied(self.principal.user, "session", "MQTT client %s of user %s "
                                    "from %s refused: %s", clip(client_id),
                                    clip(self.principal.user), self.wire.peer, refused)
            self._refuse(ReasonCode.NotAuthorized, str(refused))
            return
        except InvalidArgument as refused:  # a client id core cannot keep (its state key)
            log.info("MQTT client %s from %s refused: %s", clip(client_id), self.wire.peer, refused)
            self._refuse(ReasonCode.ClientIdentifierNotValid, str(refused))
            return
        if self.closed:
            frontend.connection_closed(self, False, None)
            return
        self.session = session
        self.conn.adapter_releases = session.persistent
        props = NO_PROPERTIES
        if v5:
            props = Properties(
                session_expiry_interval=expiry if expiry != (event.properties.session_expiry_interval or 0) else None,
                server_keep_alive=frontend.server_keep_alive(event.keep_alive))
        self._write(self.conn.accept(session_present=present, assigned_client_id=assigned,
                                     properties=props, resume=frontend.resume_state(session)))
        frontend.connection_accepted(self)
        if not self.closed:  # packets sent right behind CONNECT may have closed it
            for data in self.conn.pending_resend():
                self._write(data)
            session.attach(self, self.principal)
            if not self._reading_paused:
                self.wire.resume_reading()
        self._drain_events()

    def _check_will(self, will: Will) -> ReasonCode | None:
        assert self.principal is not None
        if not self.frontend.broker.subject_allowed(self.principal, Action.PUBLISH, will.topic):
            return ReasonCode.NotAuthorized
        return None

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
        self.frontend.connection_closed(self, False, None)

    # ---------------------------------------------------------------- PUBLISH in

    def _on_publish(self, event: MessagePublished) -> None:
        assert self.principal is not None
        if not self.frontend.broker.subject_allowed(self.principal, Action.PUBLISH, event.topic):
            self.frontend.denials.denied(self.client_id, "publish", "client %s may not publish "
                                         "to %s", clip(self.client_id), clip(event.topic))
            self._answer_publish(event, ReasonCode.NotAuthorized)
            return
        message = to_outgoing(event.topic, event.payload, event.qos, event.retain, self.client_id,
                              event.properties, now_ms())
        if event.properties.payload_format_indicator == 1:
            try:
                event.payload.decode()
            except UnicodeDecodeError:
                self._answer_publish(event, ReasonCode.PayloadFormatInvalid)
                return
        if event.retain:
            if self.frontend.may_retain(self.client_id, event.topic, event.payload):
                message = retained(message, event.topic)
            elif self.conn.version == MQTT_5:
                self._answer_publish(event, ReasonCode.QuotaExceeded)
                return
            else:  # 3.1.1 has no way to say why: stored and delivered, but not retained
                message = replace(message, properties={
                    k: v for k, v in message.properties.items() if k != RETAIN_PROPERTY})
        self._batch.append((event, message))

    def _flush_publishes(self) -> None:
        if not self._batch:
            return
        batch, self._batch = self._batch, []
        previous = self._previous
        self._previous = self.loop.create_task(self._store(batch, previous))
        self._unstored += len(batch)
        if self._unstored > MAX_UNSTORED and not self._reading_paused:
            self._reading_paused = True
            self.wire.pause_reading()

    def _stored(self, count: int) -> None:
        self._unstored -= count
        if self._reading_paused and self._unstored <= MAX_UNSTORED // 2:
            self._reading_paused = False
            self.wire.resume_reading()

    async def _store(self, batch: list[tuple[MessagePublished, OutgoingMessage]],
                     previous: asyncio.Future | None) -> None:
        try:
            await self._store_batch(batch, previous)
        except Exception:  # unexpected: the client resends what was not acknowledged
            log.exception("client %s: storing %d messages failed; closing the connection",
                          self.client_id, len(batch))
            self.kick(ReasonCode.UnspecifiedError)
        finally:
            self._stored(len(batch))

    async def _store_batch(self, batch: list[tuple[MessagePublished, OutgoingMessage]],
                           previous: asyncio.Future | None) -> None:
        frontend, session = self.frontend, self.session
        if previous is not None and not previous.done():
            await asyncio.wait([previous])  # for order only: how it ended is its own business
        messages = [message for _, message in batch]
        exactly_once = [event.packet_id for event, _ in batch if event.qos == 2] \
            if session is not None and session.persistent else []
        stored: asyncio.Future | None = None
        try:
            # The messages and, right behind them, the QoS 2 ids awaiting PUBREL go into the
            # same append: the log is durable as a prefix, so a saved id implies its message
            # is stored, and a restart in between cannot store a resent message twice.
            stored = asyncio.ensure_future(frontend.broker.send_decided(messages))
            saved = None
            if exactly_once:
                session.qos2.awaiting_release.update(exactly_once)
                saved = asyncio.ensure_future(frontend.save_qos2(session))
            await stored
            if saved is not None:
                await saved
        except SluiceError as error:
            log.info("client %s: %d messages not stored: %s", clip(self.client_id), len(batch),
                     error)
            if exactly_once:
                session.qos2.awaiting_release.difference_update(exactly_once)
                frontend.save_qos2_soon(session)
            if self.conn.version != MQTT_5:
                self.kick(ReasonCode.UnspecifiedError)
                return
            for event, _ in batch:
                self._answer_publish(event, reason_for(error))
            return
        finally:
            self._settle_retained(batch, stored)
        for event, message in batch:
            if event.qos:
                self._write(self.conn.ack_publish(event.packet_id))

    def _settle_retained(self, batch: list[tuple[MessagePublished, OutgoingMessage]],
                         stored: asyncio.Future | None) -> None:
        """Retained messages of ``batch`` become retained if stored; else their room is freed."""
        ok = stored is not None and stored.done() and not stored.cancelled() \
            and stored.exception() is None
        retained_messages = self.frontend.retained
        for event, message in batch:
            if message.also_into:
                if ok:
                    retained_messages.update(event.topic, message.body, message.properties)
                else:
                    retained_messages.cancel(event.topic)

    def _answer_publish(self, event: MessagePublished, reason: ReasonCode) -> None:
        if event.qos:
            self._write(self.conn.ack_publish(event.packet_id, reason))

    # ---------------------------------------------------------------- QoS 2 of persistent sessions

    def _on_publish_received(self, packet_id: int) -> None:
        session = self.session
        if session is None or not session.needs_persisted_release(packet_id):
            self.release(packet_id)
            return
        session.record_received(packet_id)
        self.frontend.spawn(self._release_after_saving(session, packet_id))

    async def _release_after_saving(self, session: Session, packet_id: int) -> None:
        await self.frontend.save_qos2(session)
        if not self.closed:
            self.release(packet_id)

    def _on_release(self, packet_id: int) -> None:
        session = self.session
        assert session is not None
        session.qos2.awaiting_release.discard(packet_id)
        self.frontend.spawn(self._complete_after_saving(session, packet_id))

    async def _complete_after_saving(self, session: Session, packet_id: int) -> None:
        if self._previous is not None and not self._previous.done():
            await asyncio.wait([self._previous])
        await self.frontend.save_qos2(session)
        if not self.closed:
            self._write(self.conn.complete(packet_id))

    # ---------------------------------------------------------------- SUBSCRIBE / UNSUBSCRIBE

    def _on_subscribe(self, event: SubscribeRequested) -> None:
        session = self.session
        assert session is not None and self.principal is not None
        v5 = self.conn.version == MQTT_5
        identifier = event.properties.subscription_identifiers[0] \
            if event.properties.subscription_identifiers else None
        granted: list[ReasonCode | int] = []
        new: list[tuple[SubscriptionOptions, bool]] = []
        for sub in event.subscriptions:
            try:
                self.frontend.limits.check_filter(sub.topic_filter)
                check_filter(sub.topic_filter)
                share, topic_filter = split_shared(sub.topic_filter)
                check_filter(topic_filter)
            except (InvalidFilter, errors.InvalidArgument) as bad:
                self.frontend.denials.denied(self.client_id, "filter", "client %s: %s",
                                             clip(self.client_id), bad)
                granted.append(ReasonCode.TopicFilterInvalid)
                continue
            if share is not None and sub.no_local and v5:
                granted.append(ReasonCode.ProtocolError)
                continue
            if not self.frontend.may_subscribe(self.principal, topic_filter):
                self.frontend.denials.denied(self.client_id, "subscribe", "client %s may not "
                                             "subscribe to %s", clip(self.client_id),
                                             clip(sub.topic_filter))
                granted.append(ReasonCode.NotAuthorized)
                continue
            if sub.topic_filter not in session.subscriptions and \
                    len(session.subscriptions) >= self.frontend.options.max_subscriptions:
                granted.append(ReasonCode.QuotaExceeded)  # 3.1.1: 0x80
                continue
            options = SubscriptionOptions(topic_filter, sub.qos, sub.no_local,
                                          sub.retain_as_published, sub.retain_handling,
                                          identifier, share)
            existed = session.subscribe(options)
            new.append((options, existed))
            granted.append(sub.qos)
        self.frontend.session_changed(session)
        self._write(self.conn.ack_subscribe(event.packet_id, granted))
        for options, existed in new:
            if options.share is None and (options.retain_handling == 0
                                          or (options.retain_handling == 1 and not existed)):
                for inbound in self.frontend.retained.matching(options.topic_filter):
                    session.send_retained(inbound, options)

    def _on_unsubscribe(self, event: UnsubscribeRequested) -> None:
        session = self.session
        assert session is not None
        codes = [ReasonCode.Success if session.unsubscribe(f) else ReasonCode.NoSubscriptionExisted
                 for f in event.filters]
        self.frontend.session_changed(session)
        self._write(self.conn.ack_unsubscribe(event.packet_id, codes))


def _host(peer: str) -> str:
    """The address part of a ``host:port`` peer name: refusals are summarised per host."""
    return peer.rpartition(":")[0] or peer


def will_message(will: Will, client_id: str, retain: bool) -> OutgoingMessage:
    """The core message a will becomes; ``retain``: its retain flag was admitted."""
    message = to_outgoing(will.topic, will.payload, will.qos, retain, client_id,
                          will.properties, now_ms())
    return retained(message, will.topic) if retain else message


def retained(message: OutgoingMessage, topic: str) -> OutgoingMessage:
    """``message`` also indexed into the retained queue under its MQTT topic."""
    return replace(message, keys=(topic,), also_into=(RETAINED_QUEUE,))

