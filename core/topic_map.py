"""Which topic stores a subject: a table of subject filters to topics, else the first level.

By default a subject is stored in the topic its first level names (``core.subjects``):
``devices/d1/telemetry`` in ``devices``. A fleet whose subjects start with a device id
(``d1/telemetry``, ``d2/telemetry``, ...) would make one topic per device; a rule
``+/telemetry=telemetry`` stores them all in ``telemetry``. Rules are tried in order and the
first whose filter matches wins; a subject no rule matches goes to its first level.

Authorization follows the table: publishing needs the right on the subject's topic; subscribing
to a filter needs it on every topic the filter can reach (each rule's topic whose filter overlaps
it, and the first-level topic unless a rule covers the whole filter). Changing the table later
stores new messages elsewhere; what is stored stays where it is.
"""

from __future__ import annotations

from collections.abc import Sequence

from .errors import InvalidArgument
from .model import INTERNAL_PREFIX, check_name
from .routing import TopicSyntax
from .subjects import in_topic, topic_of_subject
from .untrusted import clip

ANY_TOPIC = "*"
"""What ``topics_for_filter`` answers when a filter may reach any topic."""

_CACHE_LIMIT = 65_536
"""Subjects whose topic is remembered; the cache is emptied when full (a rule walk is cheap)."""


def parse_rules(text: str) -> tuple[tuple[str, str], ...]:
    """``FILTER=TOPIC`` rules separated by commas (the ``mqtt.topic_map`` setting)."""
    rules = []
    for part in text.split(","):
        if not part.strip():
            continue
        subject_filter, sep, topic = (s.strip() for s in part.partition("="))
        if not sep or not subject_filter or not topic:
            raise InvalidArgument(f"topic map rule {clip(part.strip())} is not FILTER=TOPIC "
                                  "(e.g. '+/telemetry=telemetry')")
        rules.append((subject_filter, topic))
    return tuple(rules)


class SubjectTopics:
    """The subject-to-topic table. Thread-safe for reading (the cache is a plain dict)."""

    def __init__(self, syntax: TopicSyntax, rules: Sequence[tuple[str, str]] = ()) -> None:
        self._syntax = syntax
        self._rules: list[tuple[list[str], str]] = []
        for subject_filter, topic in rules:
            levels = syntax.check_filter(subject_filter)
            if levels[0].startswith("$"):
                raise InvalidArgument(f"topic map filter {clip(subject_filter)} starts with '$': "
                                      "such subjects are the protocol's own")
            check_name("topic", topic)
            if topic.startswith(INTERNAL_PREFIX):
                raise InvalidArgument(f"topic map rule {clip(subject_filter)}={clip(topic)} names "
                                      "an internal topic")
            self._rules.append((levels, topic))
        self._cache: dict[str, str] = {}

    @property
    def rules(self) -> list[tuple[str, str]]:
        """The rules as written (filter, topic), in order."""
        return [(self._syntax.separator.join(levels), topic) for levels, topic in self._rules]

    def topic_of(self, subject: str) -> str:
        """The topic that stores messages with ``subject``."""
        if not self._rules:
            return topic_of_subject(subject)
        topic = self._cache.get(subject)
        if topic is None:
            levels = self._syntax.levels(subject)
            topic = next((t for pattern, t in self._rules
                          if self._syntax.levels_match(pattern, levels)), None)
            if topic is None:
                topic = topic_of_subject(subject)
            if len(self._cache) >= _CACHE_LIMIT:
                self._cache.clear()
            self._cache[subject] = topic
        return topic

    def contains(self, subject: str, topic: str) -> bool:
        """Whether ``subject`` is stored in ``topic``."""
        if not self._rules:
            return in_topic(subject, topic)
        return self.topic_of(subject) == topic

    def topics_for_filter(self, subject_filter: str) -> set[str]:
        """Every topic a subscription to ``subject_filter`` can reach; ``{ANY_TOPIC}`` when its
        first level is a wildcard that no single rule covers."""
        syntax = self._syntax
        levels = syntax.levels(subject_filter)
        topics = set()
        for pattern, topic in self._rules:
            if syntax.covers(pattern, levels):
                return topics | {topic}  # every subject of the filter stops at this rule
            if syntax.overlaps(pattern, levels):
                topics.add(topic)
        first = levels[0]
        topics.add(ANY_TOPIC if syntax.is_wildcard(first) else topic_of_subject(first))
        return topics
