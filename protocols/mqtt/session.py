"""One MQTT session: its subscriptions, and delivery to the connection attached to it.

Three delivery paths, all callback-driven (no task per session or message):

- A persistent session binds its filters to its own named queue in the store (fan-out without
  copying), so messages for it are kept while it is offline and across restarts. While a
  connection is attached, ``_fill`` reads the queue from the first unacknowledged offset as far
  as the client's receive window allows; a PUBACK/PUBCOMP acks the offset in core. Packet ids
  are derived from queue offsets (``offset % PID_SPAN + 1``), so a redelivery after a restart
  carries the id the client saw before, which QoS 2 exactly-once relies on.
- A non-persistent session is a live listener: core hands it matching messages once
  deliverable; what does not fit the window waits in a bounded in-memory queue.
- Shared subscriptions are delivered by their `SharedGroup`, which pops its own queue and
  offers messages to members with room in their window.

A session knows the connection attached to it only as a `Link`, and the registry holding it
only as a `SessionHost`, injected when it is made.

Runs on the event loop; not thread-safe.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple, Protocol

from core.bounded_cache import BoundedCache
from core.model import Action, Delivery, Principal
from core.named_queues import NamedQueues
from core.service import Broker

from .mapping import Inbound, now_ms
from .properties import Properties
from .session_store import Qos2State, SubscriptionOptions
from .topics import filter_matcher, matches, session_queue

if TYPE_CHECKING:
    from .shared import SharedGroup

log = logging.getLogger(__name__)

PID_SPAN = 32_768
"""Packet ids 1..PID_SPAN name queue offsets of persistent sessions; the rest name messages
sent directly (retained, shared, live)."""
MAX_ID = 0xFFFF
READ_BATCH = 256
MATCH_CACHE_BYTES = 32 << 10
"""Bytes of topic -> match results one session caches (topics longer than
``MAX_CACHED_TOPIC`` are matched every time)."""
MAX_CACHED_TOPIC = 512


class Link(Protocol):
    """What a session needs from the connection attached to it."""

    @property
    def send_quota(self) -> int: ...

    @property
    def congested(self) -> bool: ...

    @property
    def has_properties(self) -> bool:
        """Whether the client takes PUBLISH properties (MQTT 5)."""

    def publish(self, topic: str, payload: bytes, qos: int, retain: bool, properties: Properties,
                packet_id: int | None = None, dup: bool = False,
                encoded: dict | None = None) -> int | None:
        """Send a PUBLISH; its packet id, or None if this client cannot take the message (it
        exceeds the client's Maximum Packet Size): the session then counts it as delivered,
        as MQTT 5 says to discard it. ``encoded``: the message's encodings, shared with the
        other connections sending it."""

    def release(self, packet_id: int) -> None: ...


class SessionHost(Protocol):
    """What a session needs from the registry that holds it (one object, injected)."""

    @property
    def broker(self) -> Broker: ...

    @property
    def queues(self) -> NamedQueues: ...

    @property
    def max_queued_messages(self) -> int:
        """QoS 1/2 messages a non-persistent session queues for a slow client."""

    def inbound(self, delivery: Delivery) -> Inbound:
        """The MQTT view of ``delivery`` (shared by every session that gets it)."""

    def shared_group(self, share: str, topic_filter: str) -> SharedGroup:
        """The group of ``$share/<share>/<topic_filter>``, created on first use."""

    def leave_shared_group(self, share: str, topic_filter: str, session: Session) -> None:
        """``session`` leaves the group."""

    def save_qos2_soon(self, session: Session) -> None:
        """Save the session's QoS 2 state in the background."""


class Match(NamedTuple):
    """How a message reaches a session through its (non-shared) subscriptions."""

    qos: int
    retain_as_published: bool
    no_local: bool
    identifiers: tuple[int, ...]


class Session:
    """An MQTT session, attached to at most one connection."""

    def __init__(self, host: SessionHost, client_id: str, expiry_s: int) -> None:
        self.host = host
        self.broker = host.broker
        self.queues = host.queues
        self.client_id = client_id
        self.expiry_s = expiry_s
        self.persistent = expiry_s > 0
        """Whether messages for it are kept in its stored queue. Fixed for the session's life:
        a resumed persistent session whose client now asks for expiry 0 keeps its queue and
        ends when that connection closes."""
        self.queue = session_queue(client_id)
        self.owner: str | None = None
        """The user that created the session; only it may resume it (None: saved by a version
        that did not record owners, so the next user to resume it becomes its owner)."""
        self.principal: Principal | None = None
        """Who the attached connection acts for: what it may receive is checked against it."""
        self.subscriptions: dict[str, SubscriptionOptions] = {}
        self.qos2 = Qos2State()
        self.link: Link | None = None
        self.dropped = 0
        self._matches: BoundedCache[Match | bool] = BoundedCache(MATCH_CACHE_BYTES, MAX_CACHED_TOPIC)
        """MQTT topic -> how it reaches this session (False: it does not)."""
        self._matches_generation = -1
        self._only: tuple[Callable[[str], object], Match] | None = None
        """With a single non-shared subscription: its compiled filter and how it matches. Such
        a session (a consumer of ``devices/+/telemetry``) checks each topic directly rather
        than through ``_matches``, which a fleet's many topics would only churn."""
        self._last_match: tuple[str, int, Match | None] = ("", -1, None)
        """The last topic `_match` answered with ``_only``, the rights generation, the answer."""
        # persistent delivery
        self._next = 0
        self._skip: set[int] = set()
        self._dup_below = 0
        self._by_pid: dict[int, int] = {}
        self._armed = False
        # direct delivery: packet id -> (group, offset) for shared, None for live/retained
        self._direct: dict[int, tuple[SharedGroup, int] | None] = {}
        self._next_direct = 0
        self._pending: deque[tuple[Inbound, int, bool, tuple[int, ...]]] = deque()

    @property
    def inflight(self) -> int:
        """QoS 1 and 2 messages sent to the client and not yet acknowledged."""
        return len(self._by_pid) + len(self._direct)

    # ---------------------------------------------------------------- subscriptions

    def subscribe(self, options: SubscriptionOptions) -> bool:
        """Add or replace a subscription; True if one with this filter existed."""
        key = options.key
        existed = key in self.subscriptions
        if existed:
            self._unbind(self.subscriptions[key])
        self.subscriptions[key] = options
        self._bind(options)
        return existed

    def unsubscribe(self, key: str) -> bool:
        """Remove a subscription; False if there was none."""
        options = self.subscriptions.pop(key, None)
        if options is None:
            return False
        self._unbind(options)
        return True

    def _bind(self, options: SubscriptionOptions) -> None:
        self._subscriptions_changed()
        if options.share is not None:
            self.host.shared_group(options.share, options.topic_filter).add_member(self, options)
        elif self.persistent:
            self.queues.bind(options.topic_filter, self.queue)
        else:
            self.queues.add_listener(options.topic_filter, self)

    def _unbind(self, options: SubscriptionOptions) -> None:
        self._subscriptions_changed()
        if options.share is not None:
            self.host.leave_shared_group(options.share, options.topic_filter, self)
        elif self.persistent:
            self.queues.unbind(options.topic_filter, self.queue)
        else:
            self.queues.remove_listener(options.topic_filter, self)

    def end(self) -> None:
        """The session is over: unbind everything and drop its queue position."""
        for options in list(self.subscriptions.values()):
            self._unbind(options)
        self.subscriptions.clear()
        self._subscriptions_changed()
        if self.persistent:
            self.queues.forget(self.queue)

    def _subscriptions_changed(self) -> None:
        self._matches.clear()
        self._last_match = ("", -1, None)
        direct = [options for options in self.subscriptions.values() if options.share is None]
        self._only = None
        if len(direct) == 1:
            options = direct[0]
            ids = (options.identifier,) if options.identifier is not None else ()
            self._only = (filter_matcher(options.topic_filter),
                          Match(options.qos, options.retain_as_published, options.no_local, ids))

    def _match(self, topic: str) -> Match | None:
        """How a message on ``topic`` reaches this session, None if it does not: no filter
        matches, or the session's user may not receive it (checked per topic, with the rights
        as they are now). Cached per topic until subscriptions or rights change."""
        generation = self.broker.rights_generation
        only = self._only
        if only is not None:  # the filter check costs less than caching its answer per topic
            last = self._last_match
            if last[0] == topic and last[1] == generation:  # a run of messages on one topic
                return last[2]
            found = only[1] if only[0](topic) and self._may_receive(topic) else None
            self._last_match = (topic, generation, found)
            return found
        if generation != self._matches_generation:
            self._matches.clear()
            self._matches_generation = generation
        found = self._matches.get(topic)
        if found is not None:
            return found or None
        if not self._may_receive(topic):
            self._matches.put(topic, False)
            return None
        qos, rap, no_local, ids, hit = -1, False, True, [], False
        for options in self.subscriptions.values():
            if options.share is None and matches(options.topic_filter, topic):
                hit = True
                qos = max(qos, options.qos)
                rap = rap or options.retain_as_published
                no_local = no_local and options.no_local
                if options.identifier is not None:
                    ids.append(options.identifier)
        result = Match(qos, rap, no_local, tuple(ids)) if hit else None
        self._matches.put(topic, result or False)
        return result

    def _may_receive(self, topic: str) -> bool:
        principal = self.principal
        return principal is not None and self.broker.subject_allowed(principal, Action.SUBSCRIBE,
                                                                     topic)

    # ---------------------------------------------------------------- attach / detach

    def attach(self, link: Link, principal: Principal) -> None:
        """A connection acting for ``principal`` now serves this session; resend what is
        unacknowledged."""
        self.link = link
        self.principal = principal
        self._matches.clear()
        self._last_match = ("", -1, None)
        if self.persistent:
            committed, acked = self.queues.position(self.queue)
            self._next = committed
            self._skip = set(acked) | set(self.qos2.completed) | set(self.qos2.received)
            self._dup_below = self.queues.bounds(self.queue)[1]
            self._by_pid = {pid: offset for offset, pid in self.qos2.received.items()}
        self._resume()

    def detach(self) -> None:
        """The connection is gone: give back shared messages, stop delivering."""
        self.link = None
        self._armed = False
        for entry in self._direct.values():
            if entry is not None:
                group, offset = entry
                group.release(offset)
        self._direct.clear()
        self._pending.clear()
        self._by_pid.clear()
        for options in self.subscriptions.values():
            if options.share is not None:
                self.host.shared_group(options.share, options.topic_filter).dispatch()

    # ---------------------------------------------------------------- sending

    def _send(self, inbound: Inbound, qos: int, retain: bool, ids: tuple[int, ...],
              packet_id: int | None = None, dup: bool = False) -> int | None:
        assert self.link is not None
        properties = inbound.properties if inbound.expiry_at_ms is None and not ids \
            else inbound.properties_at(now_ms(), ids)
        payload = inbound.payload if inbound.event is None or self.link.has_properties \
            else inbound.structured_payload()
        return self.link.publish(inbound.topic, payload, qos, retain, properties,
                                 packet_id, dup, inbound.encoded)

    def _allocate_direct(self) -> int | None:
        low = PID_SPAN + 1 if self.persistent else 1
        following = self._next_direct % MAX_ID + 1
        if following >= low and following not in self._direct:  # the usual case: the next id
            self._next_direct = following
            return following
        for _ in range(MAX_ID - low + 1):
            self._next_direct = max(low, self._next_direct % MAX_ID + 1)
            if self._next_direct not in self._direct:
                return self._next_direct
        return None

    def _send_direct(self, inbound: Inbound, qos: int, retain: bool, ids: tuple[int, ...],
                     entry: tuple[SharedGroup, int] | None) -> bool:
        """Send outside the session queue; False if the window (or id space) is full."""
        if qos == 0:
            self._send(inbound, 0, retain, ids)
            return True
        link = self.link
        if link is None or link.send_quota <= 0 or link.congested:
            return False
        packet_id = self._allocate_direct()
        if packet_id is None:
            return False
        if self._send(inbound, qos, retain, ids, packet_id) is None:  # too large for the client
            if entry is not None:
                entry[0].settle(entry[1])
            return True
        self._direct[packet_id] = entry
        return True

    def send_retained(self, inbound: Inbound, options: SubscriptionOptions) -> None:
        """A retained message for a new subscription (retain flag set)."""
        if self.link is None or not self._may_receive(inbound.topic):
            return
        qos = min(inbound.qos, options.qos)
        ids = (options.identifier,) if options.identifier is not None else ()
        if not self._send_direct(inbound, qos, True, ids, None):
            self._queue_pending(inbound, qos, True, ids)

    # live delivery (core Listener) -----------------------------------------------

    def deliver(self, delivery: Delivery) -> None:
        """A message matching one of this non-persistent session's filters."""
        link = self.link
        if link is None:
            return
        inbound = self.host.inbound(delivery)
        match = self._match(inbound.topic)
        if match is None or (match.no_local and inbound.publisher == self.client_id):
            return
        if inbound.expiry_at_ms is not None and inbound.expired(now_ms()):
            return
        qos = min(inbound.qos, match.qos)
        retain = inbound.retain and match.retain_as_published
        if qos == 0:
            if link.congested:
                self.dropped += 1
                return
            self._send(inbound, 0, retain, match.identifiers)
        elif self._pending or not self._send_direct(inbound, qos, retain, match.identifiers, None):
            self._queue_pending(inbound, qos, retain, match.identifiers)

    def _queue_pending(self, inbound: Inbound, qos: int, retain: bool, ids: tuple[int, ...]) -> None:
        if len(self._pending) >= self.host.max_queued_messages:
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 10_000 == 0:
                log.warning("client %s is not keeping up: %d QoS 1/2 messages dropped (queue of "
                            "%d full); use a persistent session to keep them", self.client_id,
                            self.dropped, self.host.max_queued_messages)
            return
        self._pending.append((inbound, qos, retain, ids))

    def _drain_pending(self) -> None:
        pending = self._pending
        while pending:
            inbound, qos, retain, ids = pending[0]
            if not self._send_direct(inbound, qos, retain, ids, None):
                return
            pending.popleft()

    # shared delivery -------------------------------------------------------------

    def shared_capacity(self) -> int:
        """How many QoS 1/2 messages this session can take now (0 when offline or slow)."""
        link = self.link
        if link is None or link.congested or self._pending:
            return 0
        return link.send_quota

    def send_shared(self, group: SharedGroup, delivery: Delivery, options: SubscriptionOptions) -> None:
        """A message a shared group popped for this member."""
        inbound = self.host.inbound(delivery)
        offset = delivery.queue_offset
        qos = min(inbound.qos, options.qos)
        if self.link is None or inbound.expired(now_ms()) or not self._may_receive(inbound.topic):
            group.settle(offset) if self.link is not None else group.release(offset)
            return
        ids = (options.identifier,) if options.identifier is not None else ()
        retain = inbound.retain and options.retain_as_published
        if qos == 0:
            self._send(inbound, 0, retain, ids)
            group.settle(offset)
        elif not self._send_direct(inbound, qos, retain, ids, (group, offset)):
            group.release(offset)

    # persistent delivery -----------------------------------------------------------

    def _fill(self) -> None:
        """Send stored messages while the client's window has room."""
        link = self.link
        queues, queue, by_pid, skip = self.queues, self.queue, self._by_pid, self._skip
        while link is not None and self.link is link:
            quota = link.send_quota
            if quota <= 0 or link.congested or self._pending:
                return
            if by_pid and self._next - min(by_pid.values()) >= PID_SPAN - READ_BATCH:
                return
            messages, _ = queues.read(queue, self._next, min(quota, READ_BATCH))
            if not messages:
                self._arm()
                return
            now = now_ms()
            for delivery in messages:
                offset = delivery.queue_offset
                self._next = offset + 1
                if offset in skip:
                    skip.discard(offset)
                    continue
                inbound = self.host.inbound(delivery)
                match = self._match(inbound.topic)
                if match is None or inbound.expired(now) or (
                        match.no_local and inbound.publisher == self.client_id):
                    queues.ack(queue, offset)
                    continue
                qos = min(inbound.qos, match.qos)
                retain = inbound.retain and match.retain_as_published
                if qos == 0:
                    self._send(inbound, 0, retain, match.identifiers)
                    queues.ack(queue, offset)
                    continue
                packet_id = offset % PID_SPAN + 1
                if self._send(inbound, qos, retain, match.identifiers, packet_id,
                              dup=offset < self._dup_below) is None:  # too large for the client
                    queues.ack(queue, offset)
                    continue
                by_pid[packet_id] = offset
                if queues.tracer.on:
                    queues.tracer.delivered(queue, self.client_id, (delivery,), f"mqtt:{self.client_id}")
                if link.send_quota <= 0:
                    break

    def _arm(self) -> None:
        if not self._armed:
            self._armed = True
            self.queues.signal(self.queue).add_done_callback(self._signalled)

    def _signalled(self, _: asyncio.Future[None]) -> None:
        self._armed = False
        self._fill()

    # ---------------------------------------------------------------- acknowledgements

    def writable(self) -> None:
        """The connection's send buffer drained: continue where delivery stopped."""
        self._resume()

    def _resume(self) -> None:
        self._drain_pending()
        if self.persistent:
            self._fill()
        for options in self.subscriptions.values():
            if options.share is not None:
                self.host.shared_group(options.share, options.topic_filter).dispatch()

    def acknowledged(self, packet_id: int) -> None:
        """PUBACK or PUBCOMP (or a refusing PUBREC) for a message this session sent."""
        if packet_id in self._direct:
            entry = self._direct.pop(packet_id)
            if entry is not None:
                entry[0].settle(entry[1])
        elif (offset := self._by_pid.pop(packet_id, None)) is not None:
            self.queues.ack(self.queue, offset)
            if self.queues.tracer.on:
                self.queues.tracer.acked(self.queue, self.queue, 0, offset)
            if self.qos2.received.pop(offset, None) is not None:
                self.qos2.completed[offset] = now_ms()
                self.host.save_qos2_soon(self)
        self._resume()

    def needs_persisted_release(self, packet_id: int) -> bool:
        """Whether a PUBREC for ``packet_id`` must be saved before the PUBREL goes out."""
        return packet_id in self._by_pid

    def record_received(self, packet_id: int) -> None:
        """The client PUBREC'd a stored QoS 2 message: PUBREL, never PUBLISH, is due now."""
        self.qos2.received[self._by_pid[packet_id]] = packet_id
