"""Fan-out by subject: which extra queues and live listeners a message reaches.

Adapters bind subject filters, written in the ``TopicSyntax`` the composition root gives core
(MQTT's: levels split on ``/``, ``+`` one level, ``#`` the rest; filters starting with a
wildcard skip subjects starting with ``$``), to targets:

- a ``QueueTarget``: the message is indexed into that named queue when it is appended (the
  store's fan-out without copying; the routing decision is recorded in the log record, so
  recovery rebuilds the queue even after the binding changed). Persistent MQTT sessions and
  shared subscription groups read such queues.
- a ``Listener``: an in-memory consumer (a connected, non-persistent MQTT session) handed each
  message once it is deliverable. Nothing is stored for it.

Routes are cached per subject until the bindings change, so a fleet of devices publishing to
the same few thousand subjects pays for the trie walk once per subject. The cache is bounded in
bytes (``ROUTE_CACHE_BYTES``; subjects longer than ``MAX_CACHED_SUBJECT`` are never cached), so
senders inventing long subjects cannot grow it.

Runs on the event loop; not thread-safe.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, replace
from typing import Protocol

from .bounded_cache import BoundedCache
from .model import Delivery
from .routing import MAX_LEVELS, TopicSyntax, TopicTrie, check_depth

ROUTE_CACHE_BYTES = 16 << 20
MAX_CACHED_SUBJECT = 1024
"""Characters of the longest subject whose route is cached."""
ROUTE_TARGET_BYTES = 8
"""What one target of a cached route costs (a reference in its tuple)."""


@dataclass(frozen=True)
class QueueTarget:
    """A named queue (queue id 0) that matching messages are indexed into."""

    queue: str


class Listener(Protocol):
    """A live consumer of matching messages. Must be hashable (identity is fine)."""

    def deliver(self, delivery: Delivery) -> None:
        """A matching message, now deliverable. Must not block or raise."""


@dataclass(frozen=True)
class Route:
    """Where one subject goes."""

    queues: tuple[tuple[str, int], ...]
    listeners: tuple[Listener, ...]


NO_ROUTE = Route((), ())


class Fanout:
    """Subject filters bound to queue targets and listeners."""

    def __init__(self, syntax: TopicSyntax) -> None:
        self._syntax = syntax
        self._separator = syntax.separator
        # the trie matches a multi-level wildcard anywhere; ``bind`` enforces the syntax's rule
        self._trie = TopicTrie(replace(syntax, multi_last=False))
        self._cache: BoundedCache[Route] = BoundedCache(ROUTE_CACHE_BYTES, MAX_CACHED_SUBJECT)

    def __len__(self) -> int:
        return len(self._trie)

    def levels(self, subject_or_filter: str) -> list[str]:
        """A subject or filter as trie levels."""
        return subject_or_filter.split(self._separator)

    def bind(self, subject_filter: str, target: QueueTarget | Hashable, *,
             multi_anywhere: bool = False) -> bool:
        """Route subjects matching ``subject_filter`` to ``target``; False if bound already.
        ``multi_anywhere`` lets the multi-level wildcard stand at any level (an AMQP topic
        binding ``a.#.b`` translated), whatever the syntax says."""
        levels = self.levels(subject_filter)
        if not multi_anywhere:
            self._syntax.check_levels(levels, subject_filter)
        added = self._trie.add(levels, target)
        if added:
            self._cache.clear()
        return added

    def unbind(self, subject_filter: str, target: QueueTarget | Hashable) -> bool:
        """Undo ``bind``; False if it was not bound."""
        removed = self._trie.remove(self.levels(subject_filter), target)
        if removed:
            self._cache.clear()
        return removed

    def route(self, subject: str) -> Route:
        """The queues and listeners a message with ``subject`` reaches; InvalidArgument if
        ``subject`` has more levels than core allows."""
        route = self._cache.get(subject)
        if route is not None:
            return route
        if subject.count(self._separator) >= MAX_LEVELS:
            check_depth(self.levels(subject), "subject")
        if not len(self._trie):
            return NO_ROUTE
        queues: list[tuple[str, int]] = []
        listeners: list[Listener] = []
        for target in self._trie.match(self.levels(subject)):
            if isinstance(target, QueueTarget):
                queues.append((target.queue, 0))
            else:
                listeners.append(target)
        route = Route(tuple(sorted(queues)), tuple(listeners)) if queues or listeners else NO_ROUTE
        self._cache.put(subject, route, ROUTE_TARGET_BYTES * (len(queues) + len(listeners)))
        return route
