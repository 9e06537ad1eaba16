"""A least-recently-used cache bounded by the bytes of what it holds (decoded row groups)."""
from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any


class ByteLRU:
    """Values with a size in bytes; the least recently used go first once ``capacity`` is
    exceeded. A value larger than the whole capacity is handed back, never kept. Thread-safe."""

    def __init__(self, capacity: int) -> None:
        self.capacity = max(0, capacity)
        self.size = 0
        self._entries: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()
        self._lock = threading.Lock()

    def get_or_load(self, key: Hashable, load: Callable[[], tuple[Any, int]]) -> Any:
        """The cached value of ``key``; else ``load()`` -> (value, size), kept if it fits."""
        with self._lock:
            found = self._entries.get(key)
            if found is not None:
                self._entries.move_to_end(key)
                return found[0]
        value, size = load()  # outside the lock: a slow object store must not stall other reads
        if size > self.capacity:
            return value
        with self._lock:
            if key not in self._entries:
                self._entries[key] = (value, size)
                self.size += size
                while self.size > self.capacity:
                    _, (_, dropped) = self._entries.popitem(last=False)
                    self.size -= dropped
        return value

    def discard(self, keep: Callable[[Hashable], bool]) -> None:
        """Drop every entry whose key ``keep`` refuses."""
        with self._lock:
            for key in [key for key in self._entries if not keep(key)]:
                self.size -= self._entries.pop(key)[1]

    def __len__(self) -> int:
        return len(self._entries)
