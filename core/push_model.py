"""Push subscriptions: what the broker POSTs where (``PushSubscription``), checked as it is built.

A push subscription reads a topic (optionally only the subjects an MQTT-style filter matches)
and delivers every message to an HTTP(S) sink as a CloudEvent (binary or structured mode) or
as the raw body, signed with Standard Webhooks. It pushes with its owner's rights.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from .errors import InvalidArgument
from .model import MAX_NAME_LENGTH, check_name
from .untrusted import clip

FORMATS = ("binary", "structured", "raw")
MAX_CONCURRENCY = 256
MAX_TIMEOUT_MS = 300_000
MAX_ATTEMPTS = 1000
MAX_BACKOFF_MS = 12 * 3_600_000
MAX_SINK_LENGTH = 2048
MAX_FILTERS = 32
DEAD_LETTER_SUFFIX = ".dlq"
"""The default dead-letter topic of subscription ``NAME`` is ``NAME.dlq``."""
MAX_SUBSCRIPTION_NAME = MAX_NAME_LENGTH - len(DEAD_LETTER_SUFFIX)
EDITABLE = ("sink", "topic", "subject_filter", "vhost", "queue", "filters", "format", "transform",
            "concurrency", "rate_limit", "timeout_ms", "max_attempts", "backoff_min_ms",
            "backoff_max_ms", "dead_letter_topic", "ordered", "reply_topic")
"""The fields a create request sets (owner, paused and created_ms are the broker's)."""


@dataclass(frozen=True)
class PushSubscription:
    """One push subscription; invalid settings raise InvalidArgument naming the field."""

    name: str
    owner: str
    sink: str
    topic: str = ""
    subject_filter: str = ""
    vhost: str = ""
    queue: str = ""
    filters: tuple[dict, ...] = ()
    format: str = "binary"
    transform: str = ""
    concurrency: int = 16
    rate_limit: float = 0.0
    timeout_ms: int = 10_000
    max_attempts: int = 10
    backoff_min_ms: int = 1_000
    backoff_max_ms: int = 300_000
    dead_letter_topic: str = ""
    ordered: bool = False
    reply_topic: str = ""
    paused: bool = False
    created_ms: int = 0

    def __post_init__(self) -> None:
        check_name("push subscription", self.name)
        if len(self.name) > MAX_SUBSCRIPTION_NAME:
            raise InvalidArgument(f"push subscription name {clip(self.name)} is too long: use at "
                                  f"most {MAX_SUBSCRIPTION_NAME} characters (its dead-letter "
                                  f"topic is NAME{DEAD_LETTER_SUFFIX})")
        _text("owner", self.owner, required=True)
        check_sink(self.sink)
        for name in ("topic", "subject_filter", "vhost", "queue", "transform",
                     "dead_letter_topic", "reply_topic"):
            _text(name, getattr(self, name))
        if bool(self.topic) == bool(self.queue):
            raise InvalidArgument("a push subscription reads exactly one source: give a topic, "
                                  "or an AMQP queue (vhost and queue), not both or neither")
        if self.queue and not self.vhost:
            raise InvalidArgument("an AMQP queue source needs its virtual host (vhost)")
        if self.subject_filter and not self.topic:
            raise InvalidArgument("subject_filter applies to a topic source only")
        for name in ("topic", "dead_letter_topic", "reply_topic"):
            if getattr(self, name):
                check_name(name.replace("_", " "), getattr(self, name))
        if self.subject_filter and self.subject_filter.split("/")[0] not in (self.topic, "+", "#"):
            raise InvalidArgument(f"subject_filter {clip(self.subject_filter)} does not lie in "
                                  f"topic {clip(self.topic)}: start it with '{self.topic}/'")
        if not isinstance(self.filters, tuple) or len(self.filters) > MAX_FILTERS \
                or not all(isinstance(f, dict) for f in self.filters):
            raise InvalidArgument(f"filters must be a list of at most {MAX_FILTERS} filter "
                                  "objects (CloudEvents Subscriptions API dialects)")
        if self.format not in FORMATS:
            raise InvalidArgument(f"format {clip(str(self.format))} is not one of: "
                                  + ", ".join(FORMATS))
        _whole("concurrency", self.concurrency, 1, MAX_CONCURRENCY)
        _whole("timeout_ms", self.timeout_ms, 1, MAX_TIMEOUT_MS)
        _whole("max_attempts", self.max_attempts, 1, MAX_ATTEMPTS)
        _whole("backoff_min_ms", self.backoff_min_ms, 1, MAX_BACKOFF_MS)
        _whole("backoff_max_ms", self.backoff_max_ms, 1, MAX_BACKOFF_MS)
        if self.backoff_max_ms < self.backoff_min_ms:
            raise InvalidArgument(f"backoff_max_ms {self.backoff_max_ms} is below backoff_min_ms "
                                  f"{self.backoff_min_ms}: the backoff grows from the minimum up "
                                  "to the maximum")
        if (isinstance(self.rate_limit, bool) or not isinstance(self.rate_limit, int | float)
                or not 0 <= self.rate_limit < math.inf):
            raise InvalidArgument(f"rate_limit {self.rate_limit!r} must be a number of requests "
                                  "per second, 0 or more (0: unlimited)")
        for name in ("ordered", "paused"):
            if not isinstance(getattr(self, name), bool):
                raise InvalidArgument(f"{name} must be true or false")
        if not isinstance(self.created_ms, int) or isinstance(self.created_ms, bool):
            raise InvalidArgument("created_ms must be a whole number")

    @property
    def group(self) -> str:
        """The consumer group whose position the subscription keeps."""
        return "%PUSH%" + self.name

    @property
    def dead_letters(self) -> str:
        """The topic undeliverable messages go to."""
        return self.dead_letter_topic or self.name + DEAD_LETTER_SUFFIX

    def to_json(self) -> dict[str, Any]:
        """The subscription as the admin API shows it (never the secret)."""
        return {"name": self.name, "owner": self.owner, "sink": self.sink, "topic": self.topic,
                "subject_filter": self.subject_filter, "vhost": self.vhost, "queue": self.queue,
                "filters": list(self.filters), "format": self.format, "transform": self.transform,
                "concurrency": self.concurrency, "rate_limit": self.rate_limit,
                "timeout_ms": self.timeout_ms, "max_attempts": self.max_attempts,
                "backoff_min_ms": self.backoff_min_ms, "backoff_max_ms": self.backoff_max_ms,
                "dead_letter_topic": self.dead_letters, "ordered": self.ordered,
                "reply_topic": self.reply_topic, "paused": self.paused,
                "created_ms": self.created_ms}


def from_json(data: dict[str, Any]) -> PushSubscription:
    """A subscription from ``to_json``'s form (the stored spec); InvalidArgument if it is not one."""
    known = {name: data[name] for name in (*EDITABLE, "name", "owner", "paused", "created_ms")
             if name in data}
    if "filters" in known:
        if not isinstance(known["filters"], list | tuple):
            raise InvalidArgument("filters must be a list of filter objects")
        known["filters"] = tuple(known["filters"])
    try:
        return PushSubscription(**known)
    except TypeError as error:  # a required field missing
        raise InvalidArgument(f"a push subscription needs name, sink and a source ({error})") from None


def check_sink(sink: Any) -> str:
    """``sink`` if it is an absolute http(s) URL with a host, else InvalidArgument."""
    if not isinstance(sink, str) or not sink or len(sink) > MAX_SINK_LENGTH:
        raise InvalidArgument(f"sink must be an http:// or https:// URL of at most "
                              f"{MAX_SINK_LENGTH} characters")
    try:
        parts = urlsplit(sink)
        port = parts.port
    except ValueError:
        raise InvalidArgument(f"sink {clip(sink)} is not a valid URL") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidArgument(f"sink {clip(sink)} must be an absolute http:// or https:// URL "
                              "with a host (e.g. https://example.com/hook)")
    if parts.username is not None or parts.password is not None:
        raise InvalidArgument(f"sink {clip(sink)} must not carry credentials; the requests are "
                              "signed (Standard Webhooks) instead")
    if port == 0 or any(c.isspace() for c in sink):
        raise InvalidArgument(f"sink {clip(sink)} is not a valid URL")
    return sink


def _text(name: str, value: Any, required: bool = False) -> None:
    if not isinstance(value, str) or (required and not value) or len(value) > 4096:
        raise InvalidArgument(f"{name} must be {'a non-empty' if required else 'a'} string "
                              "of at most 4096 characters")


def _whole(name: str, value: Any, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidArgument(f"{name} {value!r} is out of range: use a whole number from "
                              f"{low} to {high}")
