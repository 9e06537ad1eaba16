"""Retained messages: the newest retained PUBLISH per topic, in memory, backed by the store.

Every retained PUBLISH is stored once, in its native topic like any message, and also indexed
into the compacted named queue ``RETAINED_QUEUE`` keyed by its MQTT topic; an empty payload is
the tombstone that clears the topic. At start the compacted view rebuilds this table.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from core.service import Broker

from .mapping import Inbound, from_stored, now_ms
from .state import RETAINED_QUEUE
from .topics import matches


class RetainedMessages:
    """MQTT topic -> (payload, stored properties) of its retained message."""

    def __init__(self) -> None:
        self._by_topic: dict[str, tuple[bytes, Mapping[str, str]]] = {}

    def __len__(self) -> int:
        return len(self._by_topic)

    def load(self, broker: Broker) -> None:
        """Rebuild from the store's compacted view."""
        self._by_topic = {m.keys[0]: (m.body, m.properties) for m in broker.load_state(RETAINED_QUEUE)}

    def update(self, topic: str, payload: bytes, properties: Mapping[str, str]) -> None:
        """Record a stored retained PUBLISH; an empty payload clears the topic."""
        if payload:
            self._by_topic[topic] = (payload, properties)
        else:
            self._by_topic.pop(topic, None)

    def matching(self, topic_filter: str) -> Iterator[Inbound]:
        """Unexpired retained messages whose topic matches ``topic_filter``."""
        now = now_ms()
        if "+" not in topic_filter and "#" not in topic_filter:
            found = self._by_topic.get(topic_filter)
            candidates = [(topic_filter, found)] if found else []
        else:
            candidates = [(t, v) for t, v in self._by_topic.items() if matches(topic_filter, t)]
        for topic, (payload, properties) in candidates:
            inbound = from_stored(topic, payload, properties)
            if not inbound.expired(now):
                yield inbound
