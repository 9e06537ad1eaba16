"""Stream queues (``x-queue-type: stream``) as RabbitMQ 4 serves them to AMQP 0-9-1 clients:
each consumer reads the whole queue from its own offset (nothing is removed by acks), chosen
with basic.consume's ``x-stream-offset``: ``first``, ``last``, ``next`` (the default), an
offset, a timestamp (AMQP timestamps are seconds) or an interval back from now (``"1h"``,
``"30m"``, ``"7D"``; units Y M D h m s). Consumers need manual acks (else 540) and a prefetch
(else 406), as in RabbitMQ; acks only make room in the prefetch window.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from typing import Any

from core.clock import now_ms
from core.errors import NotSupported, PreconditionFailed
from core.untrusted import clip

OFFSET_ARGUMENT = "x-stream-offset"
"""The basic.consume argument choosing where to start, and the header on every delivery."""
_INTERVAL = re.compile(r"(\d{1,12})([YMDhms])")
_UNIT_MS = {"Y": 365 * 86_400_000, "M": 30 * 86_400_000, "D": 86_400_000, "h": 3_600_000,
            "m": 60_000, "s": 1000}


def check_consumer(queue: str, vhost: str, no_ack: bool, prefetch: int) -> None:
    """540 for automatic acks, 406 without a prefetch count (RabbitMQ's answers)."""
    where = f"queue {clip(queue)} in vhost {clip(vhost)}"
    if no_ack:
        raise NotSupported(f"automatic acknowledgement not supported by stream queues {where}")
    if prefetch <= 0:
        raise PreconditionFailed(f"consumer prefetch count is not set for {where}")


def start_offset(arguments: Mapping[str, Any] | None, bounds: tuple[int, int],
                 at_time: Callable[[int], int]) -> int:
    """Where a consumer with basic.consume ``arguments`` starts in a stream whose offsets are
    ``bounds`` (first, end); ``at_time(ms)`` is the first offset stored at or after ``ms``.
    PreconditionFailed (406) for a value RabbitMQ refuses."""
    first, end = bounds
    spec = (arguments or {}).get(OFFSET_ARGUMENT, "next")
    if isinstance(spec, bytes):
        spec = spec.decode(errors="replace")
    if spec == "next":
        return end
    if spec == "first":
        return first
    if spec == "last":
        return max(first, end - 1)
    if isinstance(spec, int) and not isinstance(spec, bool):
        return min(max(spec, first), end)
    if isinstance(spec, datetime):
        moment = spec if spec.tzinfo else spec.replace(tzinfo=timezone.utc)
        return at_time(int(moment.timestamp() * 1000))
    interval = _INTERVAL.fullmatch(spec) if isinstance(spec, str) else None
    if interval and int(interval[1]) > 0:
        return at_time(now_ms() - int(interval[1]) * _UNIT_MS[interval[2]])
    raise PreconditionFailed(f"invalid arg '{OFFSET_ARGUMENT}': {{invalid_stream_offset_arg,"
                             f"{clip(repr(spec))}}} (first, last, next, an offset, a timestamp "
                             "or an interval like 1h)")
