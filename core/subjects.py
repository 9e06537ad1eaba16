"""Subjects: the hierarchical name a message travels under, and the topic it belongs to.

A subject is levels separated by ``/`` (an MQTT topic such as ``devices/d1/telemetry``); its
first level names the topic it is stored in (DESIGN.md, cross-protocol contract). A first level
holding characters a topic name cannot hold is escaped: each such character (and ``%`` itself)
becomes ``%XX`` per UTF-8 byte, an empty first level is ``%00`` (NUL never occurs in a subject),
and a level made only of dots (``.``, ``..``) has its dots escaped, since such names are
reserved. The mapping is reversible, so two subjects never share a topic by accident.

A message's subject must lie inside its topic: ``topic_of_subject(subject) == topic``. Core
refuses any other message, so authorization decided on one topic holds for every path the
message takes (fan-out to MQTT subscribers, persistent sessions, shared groups).
"""

from __future__ import annotations

from typing import Final

SEPARATOR: Final = "/"
MAX_SUBJECT_LEVELS: Final = 1024
"""Deepest subject or filter core accepts; adapters apply their own, lower limits."""

_NAME_CHARS: Final = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.|")


def topic_of_subject(subject: str) -> str:
    """The topic a message with ``subject`` is stored in: its first level, escaped."""
    first = subject.split(SEPARATOR, 1)[0]
    if not first:
        return "%00"
    if _NAME_CHARS.issuperset(first):  # one C call, not a generator per character
        return first if first.strip(".") else "%2E" * len(first)
    return "".join(c if c in _NAME_CHARS else "".join(f"%{b:02X}" for b in c.encode())
                   for c in first)


def in_topic(subject: str, topic: str) -> bool:
    """Whether ``subject`` lies in ``topic`` (its first level, escaped, is the topic's name)."""
    first = subject.partition(SEPARATOR)[0]
    if first == topic and "%" not in topic and topic.strip("."):
        return True  # the common case, without escaping anything
    return topic_of_subject(subject) == topic


def levels(subject_or_filter: str) -> list[str]:
    """A subject or filter split into its levels."""
    return subject_or_filter.split(SEPARATOR)
