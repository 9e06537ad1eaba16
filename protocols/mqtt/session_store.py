"""What survives a broker restart for persistent MQTT sessions, kept in core's compacted state.

Two keys per session in the compacted topic ``SESSIONS_TOPIC``, each a small JSON document:

- ``s/<client id>``: the session (expiry interval, subscriptions with their options, when it
  disconnected). Written when it connects, subscribes, unsubscribes or disconnects.
- ``q/<client id>``: the QoS 2 handshakes in progress, written before each step is answered
  so a restart in the middle neither loses nor duplicates a message: inbound packet ids
  awaiting PUBREL, outbound queue offsets whose PUBREC arrived (with their packet ids), and
  outbound offsets completed recently (until the saved consumer offsets cover them).

An empty value deletes a key (the session ended). Messages themselves live in the session's
queue in the commit log, not here.

Records are checked field by field when loaded: one that is not what this version writes (bad
JSON, wrong shapes, an invalid filter, a key of another kind) is skipped with one log line at
start, and every other session is restored. `SessionStore` is the only reader and writer; it
knows a session only as `Persisted`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any, Protocol

from core.state_store import StateStore
from core.untrusted import clip

from .mapping import now_ms
from .properties import MAX_VARINT
from .topics import InvalidFilter, check_filter

log = logging.getLogger(__name__)

SESSIONS_TOPIC = "%SYS%mqtt.sessions"
RETAINED_QUEUE = "%SYS%mqtt.retained"
"""Named queue every retained PUBLISH is also indexed into; compacted by MQTT topic."""
NEVER_EXPIRES = 0xFFFFFFFF
MAX_PACKET_ID = 0xFFFF
MAX_OFFSET = 1 << 63
COMPLETED_KEEP_MS = 10_000
"""Completed QoS 2 offsets are kept this long in the saved state: longer than core takes to
save consumer offsets, which then cover them."""


class BadRecord(ValueError):
    """A saved record that does not have the shape this version writes."""


def _integer(value: Any, low: int, high: int, what: str) -> int:
    if type(value) is not int or not low <= value <= high:
        raise BadRecord(f"{what} must be an integer {low}-{high}, not {clip(value)}")
    return value


def _flag(value: Any, what: str) -> bool:
    if type(value) is not bool:
        raise BadRecord(f"{what} must be true or false, not {clip(value)}")
    return value


def _document(data: bytes, shape: type) -> Any:
    """``data`` as JSON of the type ``shape``; BadRecord otherwise."""
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as bad:  # UnicodeDecodeError is a ValueError
        raise BadRecord(f"not JSON: {clip(str(bad))}") from None
    if not isinstance(doc, shape):
        raise BadRecord(f"a JSON {shape.__name__} was expected")
    return doc


def _pairs(value: Any, what: str) -> list[list[int]]:
    """A list of [integer, integer] pairs (not checked further)."""
    if not isinstance(value, list) or not all(isinstance(p, list) and len(p) == 2 for p in value):
        raise BadRecord(f"{what} must be a list of pairs")
    return value


@dataclass(frozen=True)
class SubscriptionOptions:
    """One subscription of a session. ``share`` is the group of a ``$share/<group>/<filter>``
    subscription; ``topic_filter`` is then the part after it."""

    topic_filter: str
    qos: int
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0
    identifier: int | None = None
    share: str | None = None

    @property
    def key(self) -> str:
        """The filter as the client wrote it (shared prefix included)."""
        return self.topic_filter if self.share is None else f"$share/{self.share}/{self.topic_filter}"

    def to_json(self) -> list:
        return [self.topic_filter, self.qos, self.no_local, self.retain_as_published,
                self.retain_handling, self.identifier, self.share]

    @classmethod
    def from_json(cls, data: Any) -> SubscriptionOptions:
        """The subscription ``to_json`` wrote (older versions wrote fewer fields); BadRecord
        unless every field is valid."""
        if not isinstance(data, list) or not 2 <= len(data) <= 7:
            raise BadRecord("a subscription must be a list of 2 to 7 fields")
        topic_filter, qos, no_local, rap, handling, identifier, share = \
            data + [False, False, 0, None, None][len(data) - 2:]
        if not isinstance(topic_filter, str):
            raise BadRecord("a topic filter must be a string")
        try:
            check_filter(topic_filter)
        except InvalidFilter as bad:
            raise BadRecord(str(bad)) from None
        if share is not None and (not isinstance(share, str) or not share
                                  or any(c in share for c in "/+#")):
            raise BadRecord(f"share name {clip(share)} is invalid")
        return cls(topic_filter, _integer(qos, 0, 2, "QoS"), _flag(no_local, "no local"),
                   _flag(rap, "retain as published"), _integer(handling, 0, 2, "retain handling"),
                   None if identifier is None else _integer(identifier, 1, MAX_VARINT, "identifier"),
                   share)


@dataclass
class SessionRecord:
    """A persistent session as saved."""

    client_id: str
    expiry_s: int
    subscriptions: dict[str, SubscriptionOptions] = field(default_factory=dict)
    disconnected_at_ms: int | None = None
    owner: str | None = None
    """The user that created the session (None in records saved before owners were kept)."""

    def encode(self) -> bytes:
        return json.dumps({"expiry": self.expiry_s, "disconnected_at": self.disconnected_at_ms,
                           "owner": self.owner,
                           "subs": [s.to_json() for s in self.subscriptions.values()]},
                          separators=(",", ":")).encode()

    @classmethod
    def decode(cls, client_id: str, data: bytes) -> SessionRecord:
        """The record ``encode`` wrote; BadRecord for anything else."""
        doc = _document(data, dict)
        subs = doc.get("subs")
        if not isinstance(subs, list):
            raise BadRecord("subs must be a list")
        disconnected = doc.get("disconnected_at")
        owner = doc.get("owner")
        if owner is not None and not isinstance(owner, str):
            raise BadRecord(f"owner must be a user name, not {clip(owner)}")
        return cls(client_id, _integer(doc.get("expiry"), 0, NEVER_EXPIRES, "expiry"),
                   {s.key: s for s in map(SubscriptionOptions.from_json, subs)},
                   None if disconnected is None
                   else _integer(disconnected, 0, MAX_OFFSET, "disconnected_at"), owner)


@dataclass
class Qos2State:
    """QoS 2 handshakes in progress for one session."""

    awaiting_release: set[int] = field(default_factory=set)
    """Inbound packet ids stored and PUBREC'd, awaiting the client's PUBREL."""
    received: dict[int, int] = field(default_factory=dict)
    """Outbound queue offset -> packet id whose PUBREC arrived (PUBREL is due)."""
    completed: dict[int, int] = field(default_factory=dict)
    """Outbound queue offset -> ms when its PUBCOMP arrived."""

    def encode(self) -> bytes:
        return json.dumps({"in": sorted(self.awaiting_release),
                           "rec": [[o, p] for o, p in self.received.items()],
                           "done": [[o, t] for o, t in self.completed.items()]},
                          separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes) -> Qos2State:
        """The state ``encode`` wrote; BadRecord for anything else."""
        doc = _document(data, dict)
        waiting = doc.get("in")
        if not isinstance(waiting, list):
            raise BadRecord("in must be a list")
        return cls({_integer(p, 1, MAX_PACKET_ID, "packet id") for p in waiting},
                   {_integer(o, 0, MAX_OFFSET, "offset"): _integer(p, 1, MAX_PACKET_ID, "packet id")
                    for o, p in _pairs(doc.get("rec"), "rec")},
                   {_integer(o, 0, MAX_OFFSET, "offset"): _integer(t, 0, MAX_OFFSET, "time")
                    for o, t in _pairs(doc.get("done"), "done")})


class Persisted(Protocol):
    """What is saved of a session."""

    client_id: str
    expiry_s: int
    owner: str | None
    subscriptions: dict[str, SubscriptionOptions]
    qos2: Qos2State


class SessionStore:
    """Loads and saves session records through core's compacted state.

    Runs on the event loop; each save returns once core has stored it (durable under ``sync``
    flush)."""

    def __init__(self, state: StateStore) -> None:
        self._state = state

    async def load(self) -> tuple[dict[str, SessionRecord], dict[str, Qos2State]]:
        """Every saved session and QoS 2 state, by client id."""
        await self._state.ensure_compacted(SESSIONS_TOPIC)
        self._state.enable_compacted_queue(RETAINED_QUEUE)
        sessions: dict[str, SessionRecord] = {}
        qos2: dict[str, Qos2State] = {}
        for message in self._state.load(SESSIONS_TOPIC):
            key = message.keys[0] if message.keys else ""
            kind, _, client_id = key.partition("/")
            try:
                if kind == "s":
                    sessions[client_id] = SessionRecord.decode(client_id, message.body)
                elif kind == "q":
                    qos2[client_id] = Qos2State.decode(message.body)
                else:
                    raise BadRecord("its key is neither s/<client id> nor q/<client id>")
            except BadRecord as bad:
                log.warning("MQTT session state %s (offset %d of %s) skipped: %s; the client "
                            "starts a new session", clip(key), message.queue_offset,
                            SESSIONS_TOPIC, bad)
        return sessions, qos2

    def save(self, session: Persisted, disconnected_at_ms: int | None = None) -> Awaitable[None]:
        """Save the session as it is now (``disconnected_at_ms``: when its connection closed,
        None while one is attached); the awaitable finishes once it is stored."""
        record = SessionRecord(session.client_id, session.expiry_s, session.subscriptions,
                               disconnected_at_ms, session.owner)
        return self._state.put(SESSIONS_TOPIC, "s/" + record.client_id, record.encode())

    async def save_qos2(self, session: Persisted) -> None:
        """Save the session's QoS 2 state, forgetting offsets completed long enough ago."""
        completed = session.qos2.completed
        if completed:
            horizon = now_ms() - COMPLETED_KEEP_MS
            for offset in [o for o, at in completed.items() if at < horizon]:
                del completed[offset]
        await self._state.put(SESSIONS_TOPIC, "q/" + session.client_id,
                                     session.qos2.encode())

    async def delete(self, client_id: str) -> None:
        await self._state.put(SESSIONS_TOPIC, "s/" + client_id, b"")
        await self._state.put(SESSIONS_TOPIC, "q/" + client_id, b"")
