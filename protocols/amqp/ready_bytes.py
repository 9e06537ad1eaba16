"""Body bytes of the ready messages of queues with ``x-max-length-bytes``, kept up to date as
messages are stored, handed out, settled and returned, so a publish never reads its queue.

A queue's total is counted once, by reading its ready messages, when first asked (after a
start, or a purge); deliveries' sizes are remembered until they are settled or come back.
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
        self._totals: dict[str, int] = {}
        self._out: dict[tuple[str, int], int] = {}
        """Sizes of the messages handed out and not settled, by (named queue, offset)."""

    def total(self, named: str) -> int:
        """Body bytes of the messages ready in ``named``."""
        if not self._named.ready(named):
            self._totals[named] = 0
            return 0
        total = self._totals.get(named)
        if total is None:
            total = self._totals[named] = sum(len(m.body) for m in self._named.peek(named, _ALL))
        return total

    def stored(self, named: str, size: int) -> None:
        if named in self._totals:
            self._totals[named] += size

    def taken(self, named: str, deliveries: Iterable[Delivery]) -> None:
        """``deliveries`` of ``named`` were popped (or taken to expire)."""
        total = self._totals.get(named)
        for delivery in deliveries:
            size = len(delivery.body)
            self._out[(named, delivery.queue_offset)] = size
            if total is not None:
                total -= size
        if total is not None:
            self._totals[named] = max(0, total)

    def settled(self, named: str, offset: int) -> None:
        self._out.pop((named, offset), None)

    def released(self, named: str, offset: int) -> None:
        size = self._out.pop((named, offset), None)
        if size is not None and named in self._totals:
            self._totals[named] += size

    def recount(self, named: str) -> None:
        """Count ``named`` again when next asked (its ready messages went another way)."""
        self._totals.pop(named, None)

    def forget(self, named: str) -> None:
        """``named`` (and its priority levels) is gone."""
        for key in [k for k in self._totals if k == named or k.startswith(named + "@")]:
            del self._totals[key]
        for key in [k for k in self._out if k[0] == named or k[0].startswith(named + "@")]:
            del self._out[key]
