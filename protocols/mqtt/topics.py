"""MQTT topic filters: their syntax for core, shared-subscription prefixes, named queues.

Validation and matching are core's (``core.routing.TopicSyntax``); this module says only what
MQTT's syntax is and what is MQTT's own (``$share/<name>/<filter>``, the queues of sessions).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable

from core.errors import InvalidArgument
from core.routing import TopicSyntax
from core.untrusted import clip

SYNTAX = TopicSyntax(separator="/", single="+", multi="#", multi_last=True, dollar_hidden=True)
"""MQTT's topic syntax, which core's fan-out and access-control rules use for subjects."""

SHARE_PREFIX = "$share/"
DELAYED_PREFIX = "$delayed/"
"""``$delayed/<seconds>/<topic>`` publishes to ``<topic>`` that many seconds later (EMQX's form)."""
MAX_DELAY_DIGITS = 10


class InvalidFilter(ValueError):
    """A topic filter the spec does not allow (MQTT 5 reason 0x8F)."""


def split_shared(topic_filter: str) -> tuple[str | None, str]:
    """(share name, filter) of ``$share/<name>/<filter>``; (None, filter) for any other."""
    if not topic_filter.startswith(SHARE_PREFIX):
        return None, topic_filter
    share, sep, rest = topic_filter[len(SHARE_PREFIX):].partition("/")
    if not share or not sep or not rest or "+" in share or "#" in share:
        raise InvalidFilter(f"shared subscription {clip(topic_filter)} must be "
                            "$share/<name>/<filter>")
    return share, rest


def split_delayed(topic: str) -> tuple[int, str] | None:
    """(delay in seconds, topic) of ``$delayed/<seconds>/<topic>``; None when malformed."""
    seconds, sep, rest = topic[len(DELAYED_PREFIX):].partition("/")
    if not sep or not rest or not seconds.isascii() or not seconds.isdigit() \
            or len(seconds) > MAX_DELAY_DIGITS or rest.startswith("$"):
        return None
    return int(seconds), rest


def check_filter(topic_filter: str) -> None:
    """Raise InvalidFilter unless wildcards occupy whole levels and ``#`` comes last."""
    try:
        SYNTAX.check_filter(topic_filter)
    except InvalidArgument as bad:
        raise InvalidFilter(str(bad)) from None


def matches(topic_filter: str, topic: str) -> bool:
    """Whether ``topic`` matches ``topic_filter`` (wildcards never match a leading ``$``)."""
    return SYNTAX.matches(topic_filter, topic)


def filter_matcher(topic_filter: str) -> Callable[[str], object]:
    """A test of whether a topic matches the well-formed ``topic_filter`` (truthy when it
    does), as `matches` decides; compiled once, so a session can check every message it gets
    against its filter without splitting either into levels."""
    if "+" not in topic_filter and "#" not in topic_filter:
        return topic_filter.__eq__
    levels = topic_filter.split("/")
    multi = levels[-1] == "#"
    body = "/".join("[^/]*" if level == "+" else re.escape(level)
                    for level in (levels[:-1] if multi else levels))
    if multi:
        body = body + "(?:/.*)?" if len(levels) > 1 else ".*"  # ``a/#`` matches ``a`` too
    if levels[0] in ("+", "#"):  # a leading wildcard never matches a ``$`` topic
        body = r"(?!\$)" + body
    return re.compile(body, re.DOTALL).fullmatch


def _digest(text: str) -> str:
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def session_queue(client_id: str) -> str:
    """The named queue holding a persistent session's messages."""
    return f"%SYS%mqtt.s.{_digest(client_id)}"


def shared_queue(share: str, topic_filter: str) -> str:
    """The named queue of one shared subscription group (share name and filter)."""
    return f"%SYS%mqtt.g.{_digest(share + chr(0) + topic_filter)}"
