"""Domain types shared by every adapter: topics, groups, subscriptions, messages, deliveries."""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping, Sequence
from dataclasses import InitVar, dataclass, field

from store import SharedProperties as SharedProperties  # for adapters: shared, never-changed properties

from .errors import InvalidArgument
from .untrusted import clip


class MessageType(enum.Enum):
    """What kind of messages a topic accepts (RocketMQ 5 topic message types)."""

    NORMAL = "normal"
    FIFO = "fifo"
    DELAY = "delay"
    TRANSACTION = "transaction"
    PRIORITY = "priority"
    """Queue N holds the messages of priority N (the last queue, those above); pop consumers
    take the highest priority first."""
    LITE = "lite"
    """Every message names a lite topic: an ordered channel inside the topic, created on first
    send, consumed by clients that subscribe to it (``core.lite``)."""


class ConsumeMode(enum.Enum):
    """How a group's members share a topic."""

    CLUSTERING = "clustering"
    """Each message goes to one member; queues are split across live members."""
    BROADCAST = "broadcast"
    """Every member gets every message and keeps its own position."""


class Action(enum.Enum):
    """What a permission allows."""

    __hash__ = object.__hash__  # members are singletons; Enum's own hash runs Python code, and
    # every authorization decision is looked up by a key holding its action

    PUBLISH = "publish"
    SUBSCRIBE = "subscribe"
    ADMIN = "admin"


class ResourceKind(enum.Enum):
    """What a permission pattern names."""

    __hash__ = object.__hash__

    TOPIC = "topic"
    GROUP = "group"


_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_%|.")
MAX_NAME_LENGTH = 127


def check_name(kind: str, name: str, *, stored: bool = False) -> str:
    """Return ``name`` if it is a valid topic or group name, else raise InvalidArgument.

    A name of dots only (``.``, ``..``) is refused: it is a path component, not a name. With
    ``stored`` (metadata an older version wrote) such a name is still accepted, so the broker
    starts and the topic can be described and deleted."""
    if (not name or len(name) > MAX_NAME_LENGTH or not set(name) <= _NAME_CHARS
            or (not stored and not name.strip("."))):
        raise InvalidArgument(
            f"{kind} name {clip(name)} is invalid: use 1-{MAX_NAME_LENGTH} characters from "
            "letters, digits, '-', '_', '.', '%' and '|', not dots only")
    return name


@dataclass(frozen=True)
class TopicConfig:
    """A topic's settings. ``retention_ms`` None means the store-wide retention applies;
    ``tier_retention_ms`` None keeps its tiered files forever; ``body_schema`` is the JSON
    Schema its tiered files parse bodies with (``store.tier.body_schema``), None: none."""

    name: str
    queue_count: int = 8
    message_type: MessageType = MessageType.NORMAL
    retention_ms: int | None = None
    compacted: bool = False
    tier_retention_ms: int | None = None
    body_schema: str | None = None
    stored: InitVar[bool] = False
    """Loaded from metadata: see ``check_name``."""

    def __post_init__(self, stored: bool) -> None:
        check_name("topic", self.name, stored=stored)
        if not 1 <= self.queue_count <= 1024:
            raise InvalidArgument(f"queue count {self.queue_count} is out of range: use 1-1024")
        tier = self.tier_retention_ms
        if tier is not None and (not _whole(tier) or tier <= 0):
            raise InvalidArgument(f"tier_retention_ms {tier!r} must be a whole number of "
                                  "milliseconds greater than 0, or null to keep tiered files "
                                  "forever")
        if self.body_schema is not None and not stored:
            check_body_schema(self.body_schema)


def check_body_schema(text: str) -> None:
    """InvalidArgument unless ``text`` is a body schema tiered files can be written with."""
    from store.tier.body_schema import BodySchemaError, arrow_type  # pyarrow: loaded when used

    try:
        arrow_type(text)
    except BodySchemaError as error:
        raise InvalidArgument(f"body_schema is not usable: {error}; write a JSON Schema of a "
                              'flat object, e.g. {"type": "object", "properties": {"device": '
                              '{"type": "string"}, "temperature": {"type": "number"}}}') from None


MAX_ATTEMPTS = 1000
"""The most delivery attempts a retry policy may allow."""


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff between delivery attempts of a pop consumer group."""

    max_attempts: int = 16
    initial_backoff_ms: int = 1_000
    max_backoff_ms: int = 60_000
    multiplier: float = 2.0

    def __post_init__(self) -> None:
        if not _whole(self.max_attempts) or not 1 <= self.max_attempts <= MAX_ATTEMPTS:
            raise InvalidArgument(f"retry max_attempts {self.max_attempts!r} is out of range: use a "
                                  f"whole number from 1 to {MAX_ATTEMPTS}")
        for name in ("initial_backoff_ms", "max_backoff_ms"):
            value = getattr(self, name)
            if not _whole(value) or value <= 0:
                raise InvalidArgument(f"retry {name} {value!r} must be a whole number of "
                                      "milliseconds greater than 0")
        if self.max_backoff_ms < self.initial_backoff_ms:
            raise InvalidArgument(f"retry max_backoff_ms {self.max_backoff_ms} is below "
                                  f"initial_backoff_ms {self.initial_backoff_ms}: the backoff "
                                  "grows from the initial value up to the maximum")
        if (isinstance(self.multiplier, bool) or not isinstance(self.multiplier, int | float)
                or not 1 <= self.multiplier < math.inf):
            raise InvalidArgument(f"retry multiplier {self.multiplier!r} must be a finite number "
                                  "of at least 1 (1 keeps the backoff constant)")

    def backoff_ms(self, attempt: int) -> int:
        """Delay before redelivering after the ``attempt``-th failed delivery (1-based)."""
        delay = self.initial_backoff_ms * self.multiplier ** max(0, attempt - 1)
        return int(min(delay, self.max_backoff_ms))


@dataclass(frozen=True)
class GroupConfig:
    """A consumer group's settings."""

    name: str
    consume_mode: ConsumeMode = ConsumeMode.CLUSTERING
    retry: RetryPolicy = RetryPolicy()
    fifo: bool = False
    stored: InitVar[bool] = False
    """Loaded from metadata: see ``check_name``."""

    def __post_init__(self, stored: bool) -> None:
        check_name("group", self.name, stored=stored)
        if not isinstance(self.consume_mode, ConsumeMode):
            raise InvalidArgument(f"group consume mode {self.consume_mode!r} is not one of: "
                                  + ", ".join(m.value for m in ConsumeMode))
        if not isinstance(self.retry, RetryPolicy):
            raise InvalidArgument(f"group retry policy {self.retry!r} is not a RetryPolicy")
        if not isinstance(self.fifo, bool):
            raise InvalidArgument(f"group fifo {self.fifo!r} must be true or false")


@dataclass(frozen=True)
class Subscription:
    """A group's interest in a topic. ``expression`` is a tag filter such as ``TagA || TagB``."""

    group: str
    topic: str
    expression: str = "*"
    expression_type: str = "TAG"


@dataclass(frozen=True)
class User:
    """A broker user; ``admin`` users may do anything."""

    name: str
    admin: bool = False


@dataclass(frozen=True)
class StoredToken:
    """A user's API token as the metadata keeps it: the SHA-256 of the token, never the token."""

    id: str
    user: str
    token_hash: str
    """Hex SHA-256 of the whole token text."""
    created_ms: int
    last_used_ms: int | None = None


@dataclass(frozen=True)
class Permission:
    """Allows ``actions`` on resources of ``kind`` whose names match ``pattern`` (``*`` wildcards)."""

    user: str
    kind: ResourceKind
    pattern: str
    actions: frozenset[Action]


@dataclass(frozen=True)
class AclRule:
    """Allows or denies ``actions`` (publish, subscribe) on subjects matching ``pattern``, an
    MQTT topic filter where ``%u`` is the user name and ``%c`` the client id; ``user`` is
    ``"*"`` for a rule that applies to every user (see ``core.acl``)."""

    user: str
    pattern: str
    actions: frozenset[Action]
    allow: bool


@dataclass(frozen=True)
class Principal:
    """Who a request comes from, after authentication: the user, its rights, and the client
    (for ``%c`` in rules; empty when the protocol names none)."""

    user: str
    admin: bool = False
    permissions: tuple[Permission, ...] = ()
    acl: tuple[AclRule, ...] = ()
    client_id: str = ""


SYSTEM = Principal("$system", admin=True)
"""The broker itself and its local administration tools."""


INTERNAL_PREFIX = "%SYS%"
"""Topics and named queues whose names start with this hold the broker's own state (MQTT
sessions, retained messages): only admins may send to or read them."""

MESSAGE_GROUP_PROPERTY = "sluice.message_group"
"""Stored property carrying a FIFO message's group; ``Delivery.message_group`` reads it."""
LITE_PROPERTY = "sluice.lite"
"""Stored property carrying a message's lite topic (``core.lite``)."""
LITE_KEY_PREFIX = "%LITE%"
"""A lite topic's messages carry the key ``%LITE%<lite topic>``: the key index finds them."""
MAX_LITE_TOPIC_LENGTH = 128
SUBJECT_PROPERTY = "sluice.subject"
"""The full hierarchical subject of a message (an MQTT topic such as ``devices/d1/telemetry``),
levels separated by ``/``; its first level names the message's topic (``core.subjects``).
Fan-out matches subscriptions against it; without it the subject is the topic name."""
ORIGIN_SUBJECT_PROPERTY = "sluice.dlq.origin_subject"
"""A dead-letter copy's subject as it was sent (the copy itself has none: it lives in another
topic); access rules still decide on it (``core.acl.subject_of``)."""


@dataclass(slots=True)
class OutgoingMessage:
    """A message as a producer sends it, before it is stored. Built per message, so slotted
    rather than frozen (cheaper); treat it as a value."""

    topic: str
    body: bytes
    tag: str = ""
    keys: Sequence[str] = ()
    properties: Mapping[str, str] = field(default_factory=dict)
    message_group: str = ""
    """FIFO topics: messages of one group go to one queue, in order."""
    queue_id: int | None = None
    """Pin to a queue; None lets the broker choose."""
    msg_id: str = ""
    born_ts: int = 0
    delivery_ts: int = 0
    """Delay messages: when to deliver (ms since epoch); 0 for now."""
    also_into: tuple[str, ...] = ()
    """Internal named queues (compacted state) the message is also indexed into. Set by
    adapters (MQTT retained messages), never taken from a client."""
    priority: int | None = None
    """Priority topics: higher is delivered first to pop consumers; None is the lowest."""
    lite_topic: str = ""
    """Lite topics: the ordered channel of the (lite) topic the message belongs to."""
    transactional: bool = False
    """Sent within a transaction: held invisible until its producer commits
    (``core.transactions``); only transactional topics take such messages."""


@dataclass(frozen=True)
class SendResult:
    """Where a sent message was stored. A delayed message is stored in the timer until due:
    its ``topic`` and ``queue_offset`` are the timer's, and ``recall_handle`` cancels it."""

    msg_id: str
    topic: str
    queue_id: int
    queue_offset: int
    store_ts: int
    recall_handle: str = ""
    transaction_id: str = ""
    """A transactional send's: quoted to commit or roll back."""


@dataclass(slots=True)
class Delivery:
    """A message handed to a consumer. ``receipt_handle`` is set for pop deliveries only.
    Built per message, so slotted rather than frozen (cheaper); treat it as a value."""

    topic: str
    queue_id: int
    queue_offset: int
    msg_id: str
    body: bytes
    tag: str
    keys: tuple[str, ...]
    properties: Mapping[str, str]
    born_ts: int
    store_ts: int
    attempt: int = 1
    receipt_handle: str = ""
    invisible_until_ms: int = 0
    home_topic: str = ""
    """The topic the message was sent to when it is read from a queue it was fanned out to
    (an MQTT session's, a shared group's); empty when that is ``topic``."""
    lite_topic: str = ""
    """The lite topic of a message received through a lite subscription."""

    @property
    def message_group(self) -> str:
        """The FIFO message group the producer gave, or empty."""
        return self.properties.get(MESSAGE_GROUP_PROPERTY, "")


@dataclass(frozen=True)
class PullResult:
    """Messages read by offset, and where the next pull should start."""

    messages: list[Delivery]
    next_offset: int
    min_offset: int
    max_offset: int


@dataclass(frozen=True)
class QueueLag:
    """One queue's position for a group."""

    topic: str
    queue_id: int
    committed: int
    max_offset: int
    inflight: int = 0

    @property
    def lag(self) -> int:
        """Messages stored but not yet consumed by the group."""
        return max(0, self.max_offset - self.committed)


@dataclass(frozen=True)
class Member:
    """A live client of a group."""

    client_id: str
    last_heartbeat_ms: int
    queues: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class QueueStats:
    """One queue of a topic: its offset range."""

    queue_id: int
    min_offset: int
    max_offset: int


@dataclass(frozen=True)
class TopicStats:
    """A topic's settings and its queues."""

    config: TopicConfig
    queues: tuple[QueueStats, ...]


@dataclass(frozen=True)
class GroupStats:
    """A group's settings, live members, subscriptions and lag per queue."""

    config: GroupConfig
    members: tuple[Member, ...]
    subscriptions: tuple[Subscription, ...]
    lag: tuple[QueueLag, ...]
