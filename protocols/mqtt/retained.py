"""Retained messages: the newest retained PUBLISH per topic, in memory, backed by the store.

Every retained PUBLISH is stored once, in its native topic like any message, and also indexed
into the compacted named queue ``RETAINED_QUEUE`` keyed by its MQTT topic; an empty payload is
the tombstone that clears the topic. At start the compacted view rebuilds this table.

The table is a trie of topic levels, so a wildcard SUBSCRIBE walks only the branches its filter
selects: ``fleet/+/status`` visits the children of ``fleet`` and one node under each, never the
retained messages of other first levels. Its size is bounded by ``max_retained_messages`` and
``max_retained_bytes`` (payload bytes): a retained PUBLISH for a topic not retained yet is
admitted only while both hold, counting those admitted and still being stored; replacing or
clearing a retained topic is always admitted.

Runs on the event loop; not thread-safe.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from core.model import OutgoingMessage
from core.state_store import StateStore

from .mapping import Inbound, from_stored, now_ms
from .session_store import RETAINED_QUEUE


_Retained = tuple[str, bytes, Mapping[str, str], int]
"""(MQTT topic, payload, stored properties, stored ms since the epoch) of one retained message."""


def as_retained(message: OutgoingMessage, topic: str) -> OutgoingMessage:
    """``message`` also indexed into the retained queue under its MQTT topic."""
    return replace(message, keys=(topic,), also_into=(RETAINED_QUEUE,))


@dataclass
class _Node:
    children: dict[str, _Node] = field(default_factory=dict)
    message: _Retained | None = None


class RetainedMessages:
    """MQTT topic -> (payload, stored properties) of its retained message."""

    def __init__(self, max_messages: int = 100_000, max_bytes: int = 256 << 20) -> None:
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self._root = _Node()
        self._count = 0
        self.bytes = 0
        """Payload bytes of the retained messages held."""
        self._admitted: dict[str, tuple[int, int]] = {}
        """New topics admitted and not yet stored: topic -> (PUBLISHes in flight, bytes)."""
        self._admitted_bytes = 0
        self.visited = 0
        """Trie nodes the last ``matching`` visited (for tests and metrics)."""

    def __len__(self) -> int:
        return self._count

    def load(self, state: StateStore) -> None:
        """Rebuild from the store's compacted view: every unexpired message, even beyond the
        limits (they were admitted when published)."""
        self._root, self._count, self.bytes = _Node(), 0, 0
        now = now_ms()
        for message in state.load(RETAINED_QUEUE):
            topic = message.keys[0] if message.keys else ""
            if topic and not from_stored(topic, b"", message.properties).expired(now):
                self._put(topic, message.body, message.properties, message.store_ts)

    # ---------------------------------------------------------------- limits

    def admit(self, topic: str, size: int) -> bool:
        """Whether a retained PUBLISH of ``size`` payload bytes may be stored for ``topic``.
        True reserves room for it until ``update`` or ``cancel``; a replacement or a clear
        is always admitted (and reserves nothing)."""
        if not size or self._find(topic) is not None:
            return True
        pending = self._admitted.get(topic)
        if pending is not None:
            self._admitted[topic] = (pending[0] + 1, pending[1])
            return True
        if (self._count + len(self._admitted) >= self.max_messages
                or self.bytes + self._admitted_bytes + size > self.max_bytes):
            return False
        self._admitted[topic] = (1, size)
        self._admitted_bytes += size
        return True

    def cancel(self, topic: str) -> None:
        """An admitted retained PUBLISH was not stored: give its room back."""
        pending = self._admitted.pop(topic, None)
        if pending is None:
            return
        if pending[0] > 1:
            self._admitted[topic] = (pending[0] - 1, pending[1])
        else:
            self._admitted_bytes -= pending[1]

    # ---------------------------------------------------------------- updates

    def update(self, topic: str, payload: bytes, properties: Mapping[str, str]) -> None:
        """Record a retained PUBLISH stored just now (ending its admission); an empty payload
        clears the topic."""
        self.cancel(topic)
        if payload:
            self._put(topic, payload, properties, now_ms())
        else:
            self._clear(topic)

    def _put(self, topic: str, payload: bytes, properties: Mapping[str, str],
             stored_ms: int) -> None:
        node = self._root
        for level in topic.split("/"):
            node = node.children.setdefault(level, _Node())
        if node.message is None:
            self._count += 1
        else:
            self.bytes -= len(node.message[1])
        node.message = (topic, payload, properties, stored_ms)
        self.bytes += len(payload)

    def _clear(self, topic: str) -> None:
        levels = topic.split("/")
        path = [self._root]
        for level in levels:
            child = path[-1].children.get(level)
            if child is None:
                return
            path.append(child)
        if path[-1].message is None:
            return
        self._count -= 1
        self.bytes -= len(path[-1].message[1])
        path[-1].message = None
        for parent, level, child in zip(reversed(path[:-1]), reversed(levels), reversed(path[1:])):
            if child.children or child.message is not None:
                break
            del parent.children[level]

    def _find(self, topic: str) -> _Retained | None:
        node: _Node | None = self._root
        for level in topic.split("/"):
            node = node.children.get(level)
            if node is None:
                return None
        return node.message

    # ---------------------------------------------------------------- lookups

    def matching(self, topic_filter: str) -> list[Inbound]:
        """Unexpired retained messages whose topic matches ``topic_filter``. Expired ones
        met on the way are dropped from the table (their room is free again)."""
        now = now_ms()
        found, expired = [], []
        for topic, payload, properties, _ in self._walk(topic_filter.split("/")):
            inbound = from_stored(topic, payload, properties)
            (expired if inbound.expired(now) else found).append(inbound)
        for inbound in expired:
            self._clear(inbound.topic)
        return found

    def listing(self, prefix: str = "") -> list[tuple[str, int, int, int]]:
        """(topic, payload bytes, QoS, stored ms) of each retained message whose topic starts
        with ``prefix``, by topic; visits only the subtree below the prefix's whole levels."""
        *levels, _ = prefix.split("/")
        node: _Node | None = self._root
        for level in levels:
            node = node.children.get(level)
            if node is None:
                return []
        found, below = [], [node]
        while below:
            current = below.pop()
            if current.message is not None and current.message[0].startswith(prefix):
                topic, payload, properties, stored_ms = current.message
                found.append((topic, len(payload), from_stored(topic, payload, properties).qos,
                              stored_ms))
            below.extend(current.children.values())
        return sorted(found)

    def _walk(self, levels: list[str]) -> list[_Retained]:
        """Every retained message the filter ``levels`` matches, visiting only the nodes its
        levels select (all children for ``+``, the whole subtree for ``#``). Wildcards in the
        first level skip topics starting with ``$``."""
        out: list[_Retained] = []
        stack: list[tuple[_Node, int]] = [(self._root, 0)]
        visited = 0
        while stack:
            node, position = stack.pop()
            visited += 1
            if position == len(levels):
                if node.message is not None:
                    out.append(node.message)
                continue
            level = levels[position]
            if level == "#":  # this level (the parent) and everything below it
                below = [child for name, child in node.children.items()
                         if not (position == 0 and name.startswith("$"))]
                if node.message is not None:
                    out.append(node.message)
                while below:
                    descendant = below.pop()
                    visited += 1
                    if descendant.message is not None:
                        out.append(descendant.message)
                    below.extend(descendant.children.values())
            elif level == "+":
                stack.extend((child, position + 1) for name, child in node.children.items()
                             if not (position == 0 and name.startswith("$")))
            elif (child := node.children.get(level)) is not None:
                stack.append((child, position + 1))
        self.visited = visited
        return out
