"""Body bytes of the ready messages of queues with ``x-max-length-bytes``, kept up to date as
messages arrive (whoever sends them), are handed out, settled and returned, so a publish never
reads its whole queue.

A queue's total is counted once, by reading its ready messages, when first asked (after a
start, or a purge); from then on each message appended is read once and added, a message
handed out is subtracted and added back if it returns (sizes are remembered until settled).
Runs on the event loop; not thread-safe.
"""

from __future__ import annotations

from collections.abc import Iterable

from core.model import Delivery
from core.named_queues import NamedQueues

_ALL = 1 << 62


class ReadyBytes:
    """Ready bytes per named queue (a priority level counts on its own)."""

    def __init__(self, queues: NamedQueues) -> None:
        self._named = queues
        self._totals: dict[str, list[int]] = {}
        """[bytes, end]: the ready bytes counting every message below ``end``."""
        self._out: dict[tuple[str, int], int] = {}
        """Sizes of the messages handed out and not settled, by (named queue, offset)."""

    def total(self, named: str) -> int:
        """Body bytes of the messages ready in ``named``: counted once, then each message
        appended since is read once (through the recent cache) and added."""
        end = self._named.bounds(named)[1]
        counted = self._totals.get(named)
        if not self._named.ready(named):
            self._totals[named] = [0, end]
            return 0
        if counted is None:
            ready = sum(len(m.body) for m in self._named.peek(named, _ALL))
            counted = self._totals[named] = [ready, end]
        while counted[1] < end:
            messages, after = self._named.read(named, counted[1], min(end - counted[1], 256))
            counted[0] += sum(len(m.body) for m in messages)
            counted[1] = after if messages else end
        return max(0, counted[0])

    def taken(self, named: str, deliveries: Iterable[Delivery]) -> None:
        """``deliveries`` of ``named`` were popped (or taken to expire)."""
        counted = self._totals.get(named)
        for delivery in deliveries:
            size = len(delivery.body)
            self._out[(named, delivery.queue_offset)] = size
            if counted is not None:
                counted[0] -= size

    def settled(self, named: str, offset: int) -> None:
        self._out.pop((named, offset), None)

    def released(self, named: str, offset: int) -> None:
        size = self._out.pop((named, offset), None)
        counted = self._totals.get(named)
        if size is not None and counted is not None:
            counted[0] += size

    def recount(self, named: str) -> None:
        """Count ``named`` again when next asked (its ready messages went another way)."""
        self._totals.pop(named, None)

    def forget(self, named: str) -> None:
        """``named`` (and its priority levels) is gone."""
        for key in [k for k in self._totals if k == named or k.startswith(named + "@")]:
            del self._totals[key]
        for key in [k for k in self._out if k[0] == named or k[0].startswith(named + "@")]:
            del self._out[key]
