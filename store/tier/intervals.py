"""Closed intervals [first, last] with their items, queried for the ones holding a point or
meeting a range in O(log n + hits): the files of a queue by offset, of the log by offset."""
from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator
from itertools import accumulate
from typing import Generic, TypeVar

T = TypeVar("T")


class Intervals(Generic[T]):
    """Immutable; items come back ordered by ``first``."""

    def __init__(self, spans: Iterable[tuple[int, int, T]]) -> None:
        ordered = sorted(spans, key=lambda span: (span[0], span[1]))
        self._firsts = [span[0] for span in ordered]
        self._reach = list(accumulate((span[1] for span in ordered), max))  # max last up to i
        self._items = ordered

    def __bool__(self) -> bool:
        return bool(self._items)

    @property
    def start(self) -> int:
        """The lowest ``first``."""
        return self._firsts[0]

    @property
    def end(self) -> int:
        """One past the highest ``last``."""
        return self._reach[-1] + 1

    def meeting(self, low: int, high: int) -> Iterator[tuple[int, int, T]]:
        """The intervals meeting [low, high], by ``first``."""
        for index in range(bisect_left(self._reach, low), bisect_right(self._firsts, high)):
            if self._items[index][1] >= low:
                yield self._items[index]
