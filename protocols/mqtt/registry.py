"""The MQTT session registry: sessions by client id and everything that outlives a connection.

It admits connections (closing one at once when ``max_connections`` sockets are open or
``max_pending_connections`` still wait for their CONNACK), takes a client id over from an
older connection, resumes or starts sessions, publishes wills (`Wills`), expires sessions,
sweeps keep alives and CONNECT timeouts, re-checks sessions when a user's rights change, and
keeps shared groups and retained messages. ``start`` restores persistent sessions, their
bindings and QoS 2 state, and the retained messages before any listener accepts, so nothing
published after a restart misses a session's queue; `SessionStore` saves them.

Connections are known here only as `Connection`; sessions get the registry as their
`SessionHost`.

Runs on the event loop; not thread-safe.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine, Iterable, Mapping
from dataclasses import replace
from typing import Any, Protocol

from core import errors
from core.acl import EVERYONE
from core.bounded_cache import BoundedCache, IdentityCache
from core.errors import AccessDenied, InvalidArgument, SluiceError
from core.model import Delivery, Principal
from core.named_queues import NamedQueues
from core.service import Broker
from core.state_store import StateStore
from core.traffic import ClientCounters, Traffic
from core.untrusted import DenialLog, clip

from .connection import Inflight
from .events import ConnectRequested, SubscribeRequested
from .limits import Limits, connection_limit
from .login import Login, Logins, Refused
from .mapping import Inbound, born_independent, from_stored, now_ms, same_view
from .options import MqttOptions
from .packets import Publish, Will
from .reason_codes import PacketType, ReasonCode
from .retained import RetainedMessages
from .session import Session
from .session_store import NEVER_EXPIRES, Qos2State, SessionStore, SubscriptionOptions
from .shared import SharedGroup
from .topics import InvalidFilter, check_filter, split_shared
from .wills import Wills

log = logging.getLogger(__name__)

PLAIN_TEMPLATE_BYTES = 16 << 20
"""What `plain_templates` may hold: the core topic, stored properties and publish decision of
about 40,000 (client, topic) pairs, so a fleet publishing to one topic per device keeps one
properties object per device topic, which `inbound` then recognises by identity."""
PLAIN_TEMPLATE_MAX_KEY = 2048
"""A client id and topic longer than this together are mapped afresh for every PUBLISH, so a
peer's long names never crowd out the fleet's."""
VIEW_CACHE_BYTES = 16 << 20
"""What `inbound`'s views of stored properties may hold (each view keeps its properties,
which `plain_templates` usually keeps too)."""
VIEW_CACHE_MAX_TOPIC = 1024
"""Views of topics longer than this are not kept."""
_VIEW_OVERHEAD = 600
"""Bytes a view costs beyond its topic: the Inbound, its properties dict and their strings."""

KEEPALIVE_SWEEP_S = 1.0

Granted = list[ReasonCode | int]
"""A SUBACK's codes: per filter the granted QoS or why it was refused."""
NewSubscriptions = list[tuple[SubscriptionOptions, bool]]
"""Subscriptions a SUBSCRIBE made, each with whether it replaced one of the same filter."""


class Connection(Protocol):
    """What the registry needs from a client connection (the adapter)."""

    principal: Principal | None
    client_id: str
    will: Will | None
    session: Session | None

    connected_at_ms: int | None
    """When its CONNACK was sent; None before."""
    counters: ClientCounters
    """Its messages and rates, for the admin API."""

    @property
    def peer(self) -> str: ...

    def details(self) -> dict[str, object]:
        """What the admin API shows of the connection (MQTT version, keep alive)."""

    def kick(self, reason: ReasonCode) -> None:
        """Close from the broker's side, telling an MQTT 5 client why."""

    def check_timeouts(self, now: float) -> None:
        """Close it if its CONNECT or keep alive is overdue."""


class SessionRegistry:
    """Everything MQTT that outlives a single connection."""

    def __init__(self, broker: Broker, queues: NamedQueues, state: StateStore, options: MqttOptions,
                 store: SessionStore, *, allow_anonymous: bool = False, anonymous_principal: Principal | None = None) -> None:
        self.broker = broker
        self.queues = queues
        self.state = state
        self.traffic = Traffic()
        """What this protocol's clients did since start, for the metrics page."""
        self.options = options
        self.limits = Limits.from_options(options)
        self.max_connections = connection_limit(options.max_connections)
        """Open MQTT sockets at once, every listener; ``max_connections`` 0 resolved."""
        self.retained = RetainedMessages(options.max_retained_messages, options.max_retained_bytes)
        self.denials = DenialLog(log)
        """Refusals (connections and logins per peer host; publishes, subscribes and retained
        messages per client): the first of each kind logged, the rest counted and summarised."""
        self.logins = Logins(broker, options, self.denials, allow_anonymous=allow_anonymous,
                             anonymous_principal=anonymous_principal)
        self.wills = Wills(broker, self.retained, self.may_retain, self.spawn)
        self.sessions: dict[str, Session] = {}
        self.links: set[Connection] = set()
        self._sockets: set[Connection] = set()
        """Connections whose socket is open (a closed link lingers until its wire is gone)."""
        self._pending: set[Connection] = set()
        """Connections not yet answered with a CONNACK."""
        self._attached: dict[str, Connection] = {}
        self._groups: dict[tuple[str, str], SharedGroup] = {}
        self._store = store
        self._expiry_timers: dict[str, asyncio.TimerHandle] = {}
        self._tasks: set[asyncio.Task] = set()
        self._sweeper: asyncio.Task | None = None
        self.plain_templates: BoundedCache[tuple[str, Mapping[str, str], int, bool]] = BoundedCache(
            PLAIN_TEMPLATE_BYTES, PLAIN_TEMPLATE_MAX_KEY)
        self._last_delivery: Delivery | None = None
        self._last_inbound: Inbound | None = None
        self.views: IdentityCache[Mapping[str, str], tuple[str, Inbound]] = IdentityCache(
            VIEW_CACHE_BYTES)
        """Stored properties -> the topic they were stored in and their view: an MQTT client's
        messages to one topic share their stored properties (`plain_templates`), so each set
        is parsed once."""

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
        for timer in self._expiry_timers.values():
            timer.cancel()
        self.wills.stop()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def spawn(self, coroutine: Coroutine[Any, Any, Any]) -> asyncio.Task:
        """Run ``coroutine`` as a task the registry keeps (and awaits at ``stop``); an
        exception it ends with is logged when it ends, not whenever the task is collected."""
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (error := task.exception()) is not None:
            log.error("MQTT background task %s failed", task.get_coro().__qualname__,
                      exc_info=error)

    async def _sweep_keepalives(self) -> None:
        while True:
            await asyncio.sleep(KEEPALIVE_SWEEP_S)
            now = time.monotonic()
            for link in list(self.links):
                link.check_timeouts(now)

    # ---------------------------------------------------------------- admission

    def admit(self, link: Connection) -> bool:
        """Count a newly accepted connection in; False (logged) beyond the connection limits:
        it is then closed at once."""
        refusal = self._admission_refusal()
        if refusal is not None:
            self.denials.denied(link.peer.rpartition(":")[0], "admission",
                                "MQTT connection from %s closed at once: %s", link.peer, refusal)
            return False
        self.links.add(link)
        self._sockets.add(link)
        self._pending.add(link)
        return True

    def _admission_refusal(self) -> str | None:
        if len(self._sockets) >= self.max_connections:
            return (f"{len(self._sockets)} MQTT connections are open (max_connections "
                    f"{self.max_connections})")
        if len(self._pending) >= self.options.max_pending_connections:
            return (f"{len(self._pending)} connections wait for their CONNACK "
                    f"(max_pending_connections {self.options.max_pending_connections})")
        return None

    def link_of(self, client_id: str) -> Connection | None:
        """The connection attached to the session of ``client_id``, if one is."""
        return self._attached.get(client_id)

    def attached(self) -> Iterable[Connection]:
        """The connections attached to sessions now."""
        return self._attached.values()

    @property
    def connected_count(self) -> int:
        """Clients connected now (sessions with a connection attached)."""
        return len(self._attached)

    def connection_accepted(self, link: Connection) -> None:
        """``link`` got its CONNACK: it no longer counts as pending."""
        self._pending.discard(link)

    def connection_released(self, link: Connection) -> None:
        """The socket of ``link`` is closed: it no longer counts against ``max_connections``."""
        self._sockets.discard(link)
        self._pending.discard(link)

    # ---------------------------------------------------------------- connect / disconnect

    async def log_in(self, event: ConnectRequested, peer: str,
                     certificate_user: str | None = None) -> Login:
        """Authenticate a CONNECT (as ``certificate_user`` when a verified client certificate
        names one) and settle its client id and expiry; `Refused` if not."""
        return await self.logins.log_in(event, peer, certificate_user)

    async def open_session(self, link: Connection, login: Login,
                           clean_start: bool) -> tuple[Session, bool]:
        """The session for a new connection: take over an attached one, resume or start
        fresh. Returns (session, session present). `Refused` (logged) if the client id's
        session belongs to another user (a session is its creator's, connected or not), core
        cannot keep the client id, or a new persistent session cannot be stored now (a full
        disk: Server unavailable; a stored one is resumed all the same)."""
        try:
            return await self._open_session(link, login.client_id, clean_start, login.expiry_s)
        except errors.QuotaExceeded as refused:
            self._attached.pop(login.client_id, None)
            log.info("MQTT client %s from %s refused: its session cannot be stored now (%s)",
                     clip(login.client_id), link.peer, refused)
            raise Refused(ReasonCode.ServerUnavailable, str(refused)) from None
        except AccessDenied as refused:
            user = login.principal.user
            self.denials.denied(user, "session", "MQTT client %s of user %s from %s refused: %s",
                                clip(login.client_id), clip(user), link.peer, refused)
            raise Refused(ReasonCode.NotAuthorized, str(refused)) from None
        except InvalidArgument as refused:  # a client id core cannot keep (its state key)
            log.info("MQTT client %s from %s refused: %s", clip(login.client_id), link.peer,
                     refused)
            raise Refused(ReasonCode.ClientIdentifierNotValid, str(refused)) from None

    async def _open_session(self, link: Connection, client_id: str, clean_start: bool,
                            expiry_s: int) -> tuple[Session, bool]:
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
            self.wills.cancel(client_id)
        self._attached[client_id] = link
        if session.persistent:
            await self._save_opened(session, present)
        return session, present

    async def _save_opened(self, session: Session, present: bool) -> None:
        """Save a persistent session as connected. While the store cannot write, a resumed
        session goes on unsaved (its stored record restores it after a restart; the next change
        is saved); a new one is dropped and QuotaExceeded raised, since a restart would lose it."""
        try:
            await self._store.save(session)
        except errors.QuotaExceeded:
            if not present:
                if self.sessions.get(session.client_id) is session:
                    del self.sessions[session.client_id]
                session.end()
                raise
            log.info("client %s resumes its session while the store cannot write; the session "
                     "is saved at its next change", session.client_id)

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

    def connection_closed(self, link: Connection, publish_will: bool, expiry_s: int | None) -> None:
        """A connection ended: detach its session, publish or schedule its will, start expiry."""
        self.links.discard(link)
        self._pending.discard(link)
        session = link.session
        will = link.will if publish_will else None
        if session is None or self._attached.get(link.client_id) is not link:
            if will is not None and link.principal is not None:
                self.wills.publish(will, link.principal, link.client_id)
            return
        del self._attached[link.client_id]
        session.detach()
        if expiry_s is not None and session.persistent:
            session.expiry_s = min(expiry_s, self.options.max_session_expiry_s)
        if will is not None:
            assert link.principal is not None
            delay = will.properties.will_delay_interval or 0
            self.wills.publish(will, link.principal, link.client_id,
                               min(delay, session.expiry_s) if session.expiry_s > 0 else 0)
        if not session.persistent or session.expiry_s == 0:
            self.spawn(self._end_session(session))
        else:
            disconnected = now_ms()
            self.spawn(self._store.save(session, disconnected))
            self._schedule_expiry(session, disconnected)

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
            if session.owner is not None:
                await self._recheck_subscriptions(session, link)

    async def _recheck_subscriptions(self, session: Session, link: Connection | None) -> None:
        """Remove the subscriptions the owner may no longer hold; kick its connection if any."""
        assert session.owner is not None
        users = self.broker.users
        principal = (link.principal if link is not None
                     else users.loaded_principal(session.owner)
                     or await asyncio.to_thread(users.principal, session.owner))
        principal = replace(principal, client_id=session.client_id)
        denied = [key for key, options in session.subscriptions.items()
                  if not self.broker.filter_allowed(principal, options.topic_filter)]
        if not denied:
            return
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
            self.wills.fire(session.client_id)
            self.spawn(self._end_session(session))

    async def _end_session(self, session: Session) -> None:
        if self.sessions.get(session.client_id) is session:
            del self.sessions[session.client_id]
        persistent = session.persistent
        session.end()
        if persistent:
            await self._store.delete(session.client_id)

    # ---------------------------------------------------------------- state saving

    def session_changed(self, session: Session) -> asyncio.Task | None:
        """Subscriptions changed: save a persistent session; the saving (None: nothing to save)."""
        if session.persistent:
            return self.spawn(self._store.save(session))
        return None

    async def save_qos2(self, session: Session) -> None:
        """Save a persistent session's QoS 2 state (durable under ``sync`` flush)."""
        await self._store.save_qos2(session)

    def save_qos2_soon(self, session: Session) -> None:
        """Save it in the background."""
        self.spawn(self._store.save_qos2(session))

    # ---------------------------------------------------------------- subscriptions

    def subscribe(self, session: Session, principal: Principal, event: SubscribeRequested,
                  v5: bool) -> tuple[Granted, NewSubscriptions, asyncio.Task | None]:
        """Add the subscriptions of a SUBSCRIBE that are valid, allowed and within
        ``max_subscriptions``; the SUBACK's codes, what was added (for `send_retained`, once
        the SUBACK is out), and the saving of a persistent session (the SUBACK waits for it)."""
        client_id = session.client_id
        identifier = event.properties.subscription_identifiers[0] \
            if event.properties.subscription_identifiers else None
        granted: Granted = []
        new: NewSubscriptions = []
        for sub in event.subscriptions:
            try:
                share, topic_filter = self._checked_filter(sub.topic_filter)
            except (InvalidFilter, errors.InvalidArgument) as bad:
                self.denials.denied(client_id, "filter", "client %s: %s", clip(client_id), bad)
                granted.append(ReasonCode.TopicFilterInvalid)
                continue
            if share is not None and sub.no_local and v5:
                granted.append(ReasonCode.ProtocolError)
                continue
            if not self.broker.filter_allowed(principal, topic_filter):
                self.denials.denied(client_id, "subscribe", "client %s may not subscribe to %s",
                                    clip(client_id), clip(sub.topic_filter))
                granted.append(ReasonCode.NotAuthorized)
                continue
            if sub.topic_filter not in session.subscriptions and \
                    len(session.subscriptions) >= self.options.max_subscriptions:
                granted.append(ReasonCode.QuotaExceeded)  # 3.1.1: 0x80
                continue
            options = SubscriptionOptions(topic_filter, sub.qos, sub.no_local,
                                          sub.retain_as_published, sub.retain_handling,
                                          identifier, share)
            new.append((options, session.subscribe(options)))
            granted.append(sub.qos)
        return granted, new, self.session_changed(session)

    def _checked_filter(self, topic_filter: str) -> tuple[str | None, str]:
        """(share name or None, filter) of a filter as subscribed; InvalidFilter or core's
        InvalidArgument if it is not one."""
        self.limits.check_filter(topic_filter)
        check_filter(topic_filter)
        share, plain = split_shared(topic_filter)
        check_filter(plain)
        return share, plain

    def send_retained(self, session: Session, new: NewSubscriptions) -> None:
        """Send the retained messages new subscriptions ask for (per Retain Handling)."""
        for options, existed in new:
            if options.share is None and (options.retain_handling == 0
                                          or (options.retain_handling == 1 and not existed)):
                for inbound in self.retained.matching(options.topic_filter):
                    session.send_retained(inbound, options)

    def unsubscribe(self, session: Session, filters: list[str]) -> list[ReasonCode]:
        """Remove subscriptions; the UNSUBACK's codes."""
        codes = [ReasonCode.Success if session.unsubscribe(f) else ReasonCode.NoSubscriptionExisted
                 for f in filters]
        self.session_changed(session)
        return codes

    # ---------------------------------------------------------------- messages (SessionHost)

    @property
    def max_queued_messages(self) -> int:
        """QoS 1/2 messages a non-persistent session queues for a slow client."""
        return self.options.max_queued_messages

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

    def inbound(self, delivery: Delivery) -> Inbound:
        """The MQTT view of a delivery, computed once when many sessions get the same one."""
        if delivery is self._last_delivery:
            assert self._last_inbound is not None
            return self._last_inbound
        topic_name, properties = delivery.home_topic or delivery.topic, delivery.properties
        known = self.views.get(properties)
        if known is not None and known[0] == topic_name and same_view(properties, delivery.body):
            inbound = known[1].with_payload(delivery.body)  # a publisher's next message, same topic
        else:
            inbound = from_stored(topic_name, delivery.body, properties, delivery.born_ts)
            inbound.encoded = {}
            if inbound.event is None and born_independent(properties) \
                    and len(inbound.topic) <= VIEW_CACHE_MAX_TOPIC:
                self.views.put(properties, (topic_name, inbound),
                                2 * len(inbound.topic) + len(topic_name) + _VIEW_OVERHEAD)
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
