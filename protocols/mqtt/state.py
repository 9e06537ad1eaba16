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
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from core.service import Broker

SESSIONS_TOPIC = "%SYS%mqtt.sessions"
RETAINED_QUEUE = "%SYS%mqtt.retained"
"""Named queue every retained PUBLISH is also indexed into; compacted by MQTT topic."""
NEVER_EXPIRES = 0xFFFFFFFF


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
    def from_json(cls, data: list) -> SubscriptionOptions:
        return cls(*data)


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
        doc = json.loads(data)
        subs = [SubscriptionOptions.from_json(s) for s in doc["subs"]]
        return cls(client_id, doc["expiry"], {s.key: s for s in subs}, doc["disconnected_at"],
                   doc.get("owner"))


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
        doc = json.loads(data)
        return cls(set(doc["in"]), {o: p for o, p in doc["rec"]}, {o: t for o, t in doc["done"]})


class SessionStore:
    """Loads and saves session records through core's compacted state."""

    def __init__(self, broker: Broker) -> None:
        self._broker = broker

    async def load(self) -> tuple[dict[str, SessionRecord], dict[str, Qos2State]]:
        """Every saved session and QoS 2 state, by client id."""
        await self._broker.ensure_compacted(SESSIONS_TOPIC)
        self._broker.enable_compacted_queue(RETAINED_QUEUE)
        sessions: dict[str, SessionRecord] = {}
        qos2: dict[str, Qos2State] = {}
        for message in self._broker.load_state(SESSIONS_TOPIC):
            kind, _, client_id = message.keys[0].partition("/")
            if kind == "s":
                sessions[client_id] = SessionRecord.decode(client_id, message.body)
            elif kind == "q":
                qos2[client_id] = Qos2State.decode(message.body)
        return sessions, qos2

    async def save(self, record: SessionRecord) -> None:
        await self._broker.put_state(SESSIONS_TOPIC, "s/" + record.client_id, record.encode())

    async def save_qos2(self, client_id: str, state: Qos2State) -> None:
        await self._broker.put_state(SESSIONS_TOPIC, "q/" + client_id, state.encode())

    async def delete(self, client_id: str) -> None:
        await self._broker.put_state(SESSIONS_TOPIC, "s/" + client_id, b"")
        await self._broker.put_state(SESSIONS_TOPIC, "q/" + client_id, b"")
