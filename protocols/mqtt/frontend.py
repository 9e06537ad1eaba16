"""The MQTT front end: sessions by client id, shared groups, retained messages, wills, keep alive.

Listeners (TCP, TLS, WebSocket) hand every accepted wire to ``new_connection``, which closes it
at once when ``max_connections`` sockets are open or ``max_pending_connections`` still wait for
their CONNACK (a sweep closes those that send no whole CONNECT in ``connect_timeout_s``). ``start``
restores persistent sessions, their bindings and QoS 2 state, and the retained messages before
any listener accepts, so nothing published after a restart misses a session's queue.

Runs on the event loop; not thread-safe.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import replace

from core.acl import EVERYONE
from core.errors import AccessDenied, SluiceError, Unauthenticated
from core.model import Delivery, OutgoingMessage, Principal, SendResult
from core.named_queues import NamedQueues
from core.service import Broker
from core.state_store import StateStore
from core.untrusted import DenialLog, clip

from .connection import Inflight
from .handler import MqttConnection, will_message
from .limits import Limits, connection_limit
from .mapping import Inbound, from_stored, now_ms
from .options import MqttOptions
from .packets import Publish
from .reason_codes import PacketType, ReasonCode
from .retained import RetainedMessages
from .session import Session
from .shared import SharedGroup
from .session_store import NEVER_EXPIRES, Qos2State, SessionRecord, SessionStore
from .wire import Wire

log = logging.getLogger(__name__)

KEEPALIVE_SWEEP_S = 1.0
COMPLETED_KEEP_MS = 10_000
"""Completed QoS 2 offsets are kept this long in the saved state: longer than core takes to
save consumer offsets, which then cover them."""


class MqttFrontend:
    """Everything MQTT that outlives a single connection."""

    def __init__(self, broker: Broker, queues: NamedQueues, state: StateStore,
                 options: MqttOptions, *, allow_anonymous: bool = False,
                 anonymous_principal: Principal | None = None) -> None:
        self.broker = broker
        self.queues = queues
        self.state = state
        self.options = options
        self.allow_anonymous = allow_anonymous
        self.anonymous_principal = anonymous_principal
        self.limits = Limits.from_options(options)
        self.max_connections = connection_limit(options.max_connections)
        """Open MQTT sockets at once, every listener; ``max_connections`` 0 resolved."""
        self.retained = RetainedMessages(options.max_retained_messages, options.max_retained_bytes)
        self.denials = DenialLog(log)
        """Refusals (connections and logins per peer host; publishes, subscribes and retained
        messages per client): the first of each kind logged, the rest counted and summarised."""
        self.sessions: dict[str, Session] = {}
        self.links: set[MqttConnection] = set()
        self._sockets: set[MqttConnection] = set()
        """Connections whose socket is open (a closed link lingers until its wire is gone)."""
        self._pending: set[MqttConnection] = set()
        """Connections not yet answered with a CONNACK."""
        self._attached: dict[str, MqttConnection] = {}
        self._groups: dict[tuple[str, str], SharedGroup] = {}
        self._store = SessionStore(state)
        self._expiry_timers: dict[str, asyncio.TimerHandle] = {}
        self._delayed_wills: dict[str, tuple[asyncio.TimerHandle, MqttConnection]] = {}
        self._tasks: set[asyncio.Task] = set()
        self._sweeper: asyncio.Task | None = None
        self._last_delivery: Delivery | None = None
        self._last_inbound: Inbound | None = None

    # ---------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        """Restore persistent sessions and retained messages; start the keep-alive sweep."""
        records, qos2 = await self._store.load()
        self.retained.load(self.state)
        now = now_ms()
        for client_id, record in records.items():
            session = Session(self, client_id, record.expiry_s)
            session.owner = record.owner
            session.qos2 = qos2.get(client_id, Qos2State())
            try:
                for options in record.subscriptions.values():
                    session.subscribe(options)
            except SluiceError as refused:  # a filter core refuses (deeper than it allows)
                log.warning("MQTT session of client %s not restored: %s; the client starts a "
                            "new session", clip(client_id), refused)
                for key in list(session.subscriptions):  # its queue position stays saved
                    session.unsubscribe(key)
                continue
            self.sessions[client_id] = session
            self._schedule_expiry(session, record.disconnected_at_ms or now)
        if records:
            log.info("restored %d persistent MQTT sessions and %d retained messages",
                     len(records), len(self.retained))
        self._sweeper = asyncio.create_task(self._sweep_keepalives())
        self.broker.on_rights_changed(self._rights_changed)

    async def stop(self) -> None:
        """Disconnect every client (MQTT 5: Server shutting down) and save session state."""
        if self._sweeper is not None:
            self._sweeper.cancel()
        self.denials.flush()
        for link in list(self.links):
            link.kick(ReasonCode.ServerShuttingDown)
        for timer in [*self._expiry_timers.values(), *(t for t, _ in self._delayed_wills.values())]:
            timer.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def new_connection(self, wire: Wire) -> MqttConnection:
        """The handler for a newly accepted wire; closed at once beyond the connection limits."""
        link = MqttConnection(self, wire)
        refusal = self._admission_refusal()
        if refusal is not None:
            self.denials.denied(wire.peer.rpartition(":")[0], "admission",
                                           "MQTT connection from %s closed at once: %s",
                                           wire.peer, refusal)
            link.refuse_at_once()
            return link
        self.links.add(link)
        self._sockets.add(link)
        self._pending.add(link)
        return link

    def _admission_refusal(self) -> str | None:
        if len(self._sockets) >= self.max_connections:
            return (f"{len(self._sockets)} MQTT connections are open (max_connections "
                    f"{self.max_connections})")
        if len(self._pending) >= self.options.max_pending_connections:
            return (f"{len(self._pending)} connections wait for their CONNACK "
                    f"(max_pending_connections {self.options.max_pending_connections})")
        return None

    def connection_accepted(self, link: MqttConnection) -> None:
        """``link`` got its CONNACK: it no longer counts as pending."""
        self._pending.discard(link)

    def connection_released(self, link: MqttConnection) -> None:
        """The socket of ``link`` is closed: it no longer counts against ``max_connections``."""
        self._sockets.discard(link)
        self._pending.discard(link)

    async def _sweep_keepalives(self) -> None:
        while True:
            await asyncio.sleep(KEEPALIVE_SWEEP_S)
            now = time.monotonic()
            for link in list(self.links):
                link.check_timeouts(now)

    def spawn(self, coroutine) -> None:
        """Run ``coroutine`` as a task the front end keeps (and awaits at ``stop``); an
        exception it ends with is logged when it ends, not whenever the task is collected."""
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (error := task.exception()) is not None:
            log.error("MQTT background task %s failed", task.get_coro().__qualname__,
                      exc_info=error)

    # ---------------------------------------------------------------- connect / disconnect

    async def authenticate(self, username: str | None, password: bytes | None) -> Principal:
        """The principal for CONNECT credentials; Unauthenticated if refused."""
        if username is None:
            if self.allow_anonymous and self.anonymous_principal is not None:
                return self.anonymous_principal
            raise Unauthenticated("anonymous access is off: connect with a username and password")
        secret = (password or b"").decode("utf-8", "replace")
        return await self.broker.authenticate(username, secret)

    def server_keep_alive(self, asked: int) -> int | None:
        """The Server Keep Alive to announce, if ours overrides what the client asked."""
        limit = self.options.max_keep_alive_s
        if limit and (asked == 0 or asked > limit):
            return limit
        return None

    async def open_session(self, link: MqttConnection, client_id: str, clean_start: bool,
                           expiry_s: int) -> tuple[Session, bool]:
        """The session for a new connection: take over an attached one, resume or start
        fresh. Returns (session, session present). AccessDenied if the client id's session
        belongs to another user: a session is its creator's, connected or not."""
        assert link.principal is not None
        user = link.principal.user
        existing = self.sessions.get(client_id)
        if existing is not None and existing.owner not in (None, user):
            raise AccessDenied(f"client id {clip(client_id)} has a session of another user; "
                               "connect with a client id of your own")
        previous = self._attached.pop(client_id, None)
        if previous is not None and previous is not link:
            log.info("client %s connected again; closing its previous connection", client_id)
            previous.kick(ReasonCode.SessionTakenOver)
        self._cancel_expiry(client_id)
        session = self.sessions.get(client_id)
        present = session is not None and not clean_start
        if session is not None and not present:
            await self._end_session(session)
            session = None
        if session is None:
            session = Session(self, client_id, expiry_s)
            self.sessions[client_id] = session
        elif session.expiry_s != expiry_s:
            session = self._change_expiry(session, expiry_s)
        session.owner = user
        if present:
            self._cancel_will(client_id)
        self._attached[client_id] = link
        if session.persistent:
            await self._store.save(self._record(session))
        return session, present

    @staticmethod
    def _record(session: Session, disconnected_at_ms: int | None = None) -> SessionRecord:
        return SessionRecord(session.client_id, session.expiry_s, session.subscriptions,
                             disconnected_at_ms, session.owner)

    def _change_expiry(self, session: Session, expiry_s: int) -> Session:
        """A new expiry for a resumed session. A session taken over from a connection that
        kept it in memory becomes a stored one when the new connection asks for an expiry."""
        if session.persistent or expiry_s == 0:
            session.expiry_s = expiry_s
            return session
        subscriptions = list(session.subscriptions.values())
        session.end()
        replacement = Session(self, session.client_id, expiry_s)
        replacement.owner = session.owner
        for options in subscriptions:
            replacement.subscribe(options)
        self.sessions[session.client_id] = replacement
        return replacement

    def resume_state(self, session: Session) -> Inflight | None:
        """In-flight QoS 2 state to restore into a resumed connection."""
        qos2 = session.qos2
        if not session.persistent or not (qos2.received or qos2.awaiting_release):
            return None
        outbound = tuple((Publish("", b"", 2, packet_id=pid), PacketType.PUBCOMP)
                         for pid in qos2.received.values())
        return Inflight(outbound, tuple((pid, ReasonCode.Success) for pid in qos2.awaiting_release))

    def connection_closed(self, link: MqttConnection, publish_will: bool, expiry_s: int | None) -> None:
        """A connection ended: detach its session, publish or schedule its will, start expiry."""
        self.links.discard(link)
        self._pending.discard(link)
        session = link.session
        if session is None or self._attached.get(link.client_id) is not link:
            if publish_will and link.will is not None and link.principal is not None:
                self.spawn(self._publish_will(link))
            return
        del self._attached[link.client_id]
        session.detach()
        if expiry_s is not None and session.persistent:
            session.expiry_s = min(expiry_s, self.options.max_session_expiry_s)
        if publish_will and link.will is not None:
            delay = link.will.properties.will_delay_interval or 0
            if delay and session.expiry_s > 0:
                timer = asyncio.get_running_loop().call_later(
                    min(delay, session.expiry_s), lambda: self._fire_will(link.client_id))
                self._delayed_wills[link.client_id] = (timer, link)
            else:
                self.spawn(self._publish_will(link))
        if not session.persistent or session.expiry_s == 0:
            self.spawn(self._end_session(session))
        else:
            disconnected = now_ms()
            self.spawn(self._store.save(self._record(session, disconnected)))
            self._schedule_expiry(session, disconnected)

    def _fire_will(self, client_id: str) -> None:
        """Publish a delayed will now (its delay passed, or its session ended first)."""
        entry = self._delayed_wills.pop(client_id, None)
        if entry is not None:
            entry[0].cancel()
            self.spawn(self._publish_will(entry[1]))

    def _cancel_will(self, client_id: str) -> None:
        entry = self._delayed_wills.pop(client_id, None)
        if entry is not None:
            entry[0].cancel()

    async def _publish_will(self, link: MqttConnection) -> None:
        will = link.will
        assert will is not None and link.principal is not None
        retain = will.retain and self.may_retain(link.client_id, will.topic, will.payload)
        try:
            message = will_message(will, link.client_id, retain)
            await self.publish(link.principal, [message])
        except Exception:  # noqa: BLE001 - a failed will is logged, the broker goes on
            if retain:
                self.retained.cancel(will.topic)
            log.exception("will of client %s on %s not published", clip(link.client_id),
                          clip(will.topic))
            return
        if retain:
            self.retained.update(will.topic, message.body, message.properties)

    # ---------------------------------------------------------------- changed rights

    def _rights_changed(self, user: str, exists: bool) -> None:
        """A user's rights changed: end at once the sessions and subscriptions they no longer
        allow (deliveries already stop: each is checked against the current rights)."""
        self.spawn(self._enforce_rights(user, exists))

    async def _enforce_rights(self, user: str, exists: bool) -> None:
        for session in list(self.sessions.values()):
            if user != EVERYONE and session.owner != user:
                continue
            link = self._attached.get(session.client_id)
            if not exists:
                log.info("user %s was deleted: ending the session of client %s", clip(user),
                         clip(session.client_id))
                if link is not None:
                    del self._attached[session.client_id]  # so closing it saves nothing
                    link.will = None
                    link.kick(ReasonCode.NotAuthorized)
                self._cancel_expiry(session.client_id)
                await self._end_session(session)
                continue
            if session.owner is None:
                continue
            users = self.broker.users
            principal = (link.principal if link is not None
                         else users.loaded_principal(session.owner)
                         or await asyncio.to_thread(users.principal, session.owner))
            principal = replace(principal, client_id=session.client_id)
            denied = [key for key, options in session.subscriptions.items()
                      if not self.may_subscribe(principal, options.topic_filter)]
            if not denied:
                continue
            log.info("client %s lost the right to %d subscriptions (%s); they are removed",
                     clip(session.client_id), len(denied), clip(", ".join(denied)))
            for key in denied:
                session.unsubscribe(key)
            self.session_changed(session)
            if link is not None:
                link.kick(ReasonCode.NotAuthorized)

    # ---------------------------------------------------------------- expiry

    def _schedule_expiry(self, session: Session, disconnected_at_ms: int) -> None:
        if session.expiry_s == NEVER_EXPIRES:
            return
        due = max(0.0, (disconnected_at_ms + session.expiry_s * 1000 - now_ms()) / 1000)
        self._expiry_timers[session.client_id] = asyncio.get_running_loop().call_later(
            due, lambda: self._expire(session))

    def _cancel_expiry(self, client_id: str) -> None:
        timer = self._expiry_timers.pop(client_id, None)
        if timer is not None:
            timer.cancel()

    def _expire(self, session: Session) -> None:
        self._expiry_timers.pop(session.client_id, None)
        if self.sessions.get(session.client_id) is session and session.link is None:
            log.info("session of client %s expired", session.client_id)
            self._fire_will(session.client_id)
            self.spawn(self._end_session(session))

    async def _end_session(self, session: Session) -> None:
        if self.sessions.get(session.client_id) is session:
            del self.sessions[session.client_id]
        persistent = session.persistent
        session.end()
        if persistent:
            await self._store.delete(session.client_id)

    # ---------------------------------------------------------------- state saving

    def session_changed(self, session: Session) -> None:
        """Subscriptions changed: save a persistent session."""
        if session.persistent:
            self.spawn(self._store.save(self._record(session)))

    async def save_qos2(self, session: Session) -> None:
        """Save a persistent session's QoS 2 state (durable under ``sync`` flush)."""
        completed = session.qos2.completed
        if completed:
            horizon = now_ms() - COMPLETED_KEEP_MS
            for offset in [o for o, at in completed.items() if at < horizon]:
                del completed[offset]
        await self._store.save_qos2(session.client_id, session.qos2)

    def save_qos2_soon(self, session: Session) -> None:
        self.spawn(self.save_qos2(session))

    # ---------------------------------------------------------------- messages

    async def publish(self, principal: Principal, messages: Sequence[OutgoingMessage]) -> list[SendResult]:
        """Store MQTT messages, creating their native topics on first use."""
        return await self.broker.send(principal, messages, create_topics=True)

    def may_retain(self, client_id: str, topic: str, payload: bytes) -> bool:
        """Whether a retained PUBLISH on ``topic`` fits the retained limits (room is then
        reserved until ``retained.update`` or ``retained.cancel``); a refusal is logged."""
        if self.retained.admit(topic, len(payload)):
            return True
        retained, options = self.retained, self.options
        self.denials.denied(client_id, "retain", "client %s: retained message on %s refused: "
                            "%d retained messages of %d bytes; max_retained_messages is %d, "
                            "max_retained_bytes %d", clip(client_id), clip(topic), len(retained),
                            retained.bytes, options.max_retained_messages,
                            options.max_retained_bytes)
        return False

    def may_subscribe(self, principal: Principal, topic_filter: str) -> bool:
        """Whether ``principal`` may subscribe to ``topic_filter`` (access-control rules, else
        the topic permission; see ``core.acl``)."""
        return self.broker.filter_allowed(principal, topic_filter)

    def inbound(self, delivery: Delivery) -> Inbound:
        """The MQTT view of a delivery, computed once when many sessions get the same one."""
        if delivery is self._last_delivery:
            assert self._last_inbound is not None
            return self._last_inbound
        inbound = from_stored(delivery.home_topic or delivery.topic, delivery.body,
                              delivery.properties)
        self._last_delivery, self._last_inbound = delivery, inbound
        return inbound

    def shared_group(self, share: str, topic_filter: str) -> SharedGroup:
        """The group of ``$share/<share>/<topic_filter>``, created on first use."""
        key = (share, topic_filter)
        group = self._groups.get(key)
        if group is None:
            group = self._groups[key] = SharedGroup(self.queues, share, topic_filter,
                                                    self.options.shared_invisible_ms)
        return group

    def leave_shared_group(self, share: str, topic_filter: str, session: Session) -> None:
        """``session`` leaves the group; a group left empty is forgotten (its queue too)."""
        group = self._groups.get((share, topic_filter))
        if group is not None:
            group.remove_member(session)
            if not group.members:
                del self._groups[(share, topic_filter)]
