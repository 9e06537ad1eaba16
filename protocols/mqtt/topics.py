"""MQTT topic filters: shared-subscription prefixes, validation, matching one filter."""

from __future__ import annotations

import hashlib

from core.untrusted import clip

SHARE_PREFIX = "$share/"


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


def check_filter(topic_filter: str) -> None:
    """Raise InvalidFilter unless wildcards occupy whole levels and ``#`` comes last."""
    if not topic_filter:
        raise InvalidFilter("a topic filter must not be empty")
    levels = topic_filter.split("/")
    for position, level in enumerate(levels):
        if level == "#" and position != len(levels) - 1:
            raise InvalidFilter(f"'#' must be the last level of {clip(topic_filter)}")
        if level not in ("+", "#") and ("+" in level or "#" in level):
            raise InvalidFilter(f"a wildcard must occupy a whole level in {clip(topic_filter)}")


def matches(topic_filter: str, topic: str) -> bool:
    """Whether ``topic`` matches ``topic_filter`` (wildcards never match a leading ``$``)."""
    if "+" not in topic_filter and "#" not in topic_filter:
        return topic_filter == topic
    if topic.startswith("$") and topic_filter[0] in "+#":
        return False
    f_levels = topic_filter.split("/")
    t_levels = topic.split("/")
    for position, level in enumerate(f_levels):
        if level == "#":
            return True
        if position >= len(t_levels):
            return False
        if level != "+" and level != t_levels[position]:
            return False
    return len(f_levels) == len(t_levels)


def _digest(text: str) -> str:
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def session_queue(client_id: str) -> str:
    """The named queue holding a persistent session's messages."""
    return f"%SYS%mqtt.s.{_digest(client_id)}"


def shared_queue(share: str, topic_filter: str) -> str:
    """The named queue of one shared subscription group (share name and filter)."""
    return f"%SYS%mqtt.g.{_digest(share + chr(0) + topic_filter)}"
