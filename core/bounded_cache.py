"""A cache bounded in bytes, for keys a peer chooses (topic names, subjects).

An ``lru_cache(maxsize=N)`` bounds entries, not bytes: N keys of 60 KB each hold N x 60 KB.
``BoundedCache`` counts what it holds (each key's length plus the size its caller gives for
the value), never caches a key longer than ``max_key_chars``, and drops the oldest entries once
``budget_bytes`` is exceeded, so a peer sending ever-new long names costs it at most the budget.

Runs on the event loop; not thread-safe.
"""

from __future__ import annotations

from typing import Generic, TypeVar

V = TypeVar("V")

ENTRY_OVERHEAD = 64
"""Approximate bytes a dict slot, the key object and the value's header cost per entry."""


class BoundedCache(Generic[V]):
    """``str`` key -> value, holding at most about ``budget_bytes``; oldest entries go first."""

    def __init__(self, budget_bytes: int, max_key_chars: int) -> None:
        self.budget = budget_bytes
        self.max_key_chars = max_key_chars
        self.size = 0
        """Approximate bytes held: key lengths, value sizes and per-entry overhead."""
        self._entries: dict[str, tuple[V, int]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str) -> V | None:
        """The cached value for ``key``, or None."""
        entry = self._entries.get(key)
        return None if entry is None else entry[0]

    def put(self, key: str, value: V, value_bytes: int = 0) -> None:
        """Cache ``value`` (about ``value_bytes`` of its own) unless ``key`` is too long to keep."""
        if len(key) > self.max_key_chars:
            return
        cost = len(key) + value_bytes + ENTRY_OVERHEAD
        if cost > self.budget:
            return
        entries = self._entries
        old = entries.pop(key, None)
        if old is not None:
            self.size -= old[1]
        entries[key] = (value, cost)
        self.size += cost
        while self.size > self.budget:
            oldest = next(iter(entries))
            self.size -= entries.pop(oldest)[1]

    def clear(self) -> None:
        """Forget everything (what the values were computed from changed)."""
        self._entries.clear()
        self.size = 0


K = TypeVar("K")


class IdentityCache(Generic[K, V]):
    """Object -> value for objects compared by identity (``is``), holding at most about
    ``budget_bytes``; oldest entries go first.

    Each entry keeps its object alive, so a reused ``id`` never matches another object. For
    values derived from an object shared by many messages (a connection's stored properties
    for one topic), where hashing or comparing the object itself would cost what the cache
    saves.
    """

    def __init__(self, budget_bytes: int) -> None:
        self.budget = budget_bytes
        self.size = 0
        self._entries: dict[int, tuple[K, V, int]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, obj: K) -> V | None:
        """The value cached for this very object, or None."""
        entry = self._entries.get(id(obj))
        return entry[1] if entry is not None and entry[0] is obj else None

    def put(self, obj: K, value: V, value_bytes: int) -> None:
        """Cache ``value`` for ``obj``; ``value_bytes`` is about what the entry holds."""
        cost = value_bytes + ENTRY_OVERHEAD
        if cost > self.budget:
            return
        entries = self._entries
        old = entries.pop(id(obj), None)
        if old is not None:
            self.size -= old[2]
        entries[id(obj)] = (obj, value, cost)
        self.size += cost
        while self.size > self.budget:
            oldest = next(iter(entries))
            self.size -= entries.pop(oldest)[2]
