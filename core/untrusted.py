"""Logging what a peer sent without letting the peer fill the log.

``clip`` shortens an untrusted string (a topic, a client id, a user name) before it goes into a
log line: a 60 KB topic name costs the log 120 characters, not 60 KB. ``DenialLog`` logs the
first refusal of each kind per user and then one summary line per interval, so a client that
retries a forbidden publish in a loop writes a few lines a minute, not one per attempt.

Runs on the event loop (``DenialLog`` is not thread-safe).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

CLIP_CHARS = 120


def clip(value: object, limit: int = CLIP_CHARS) -> str:
    """``repr`` of ``value`` cut to about ``limit`` characters, saying how much was cut.

    ``repr`` escapes control characters and newlines, so a value cannot forge log lines."""
    text = repr(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}...(+{len(text) - limit} chars)"


class DenialLog:
    """Rate-limited logging of refusals, keyed by who was refused and for what kind of thing.

    The first refusal of a key is logged in full; later ones within ``interval_s`` are counted
    and reported in one line when the interval ends and the key is refused again (or at
    ``flush``). At most ``max_keys`` keys are tracked; beyond that the oldest are reported and
    forgotten, so the table stays bounded whatever a peer does.
    """

    def __init__(self, logger: logging.Logger, interval_s: float = 60.0, max_keys: int = 10_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._log = logger
        self._interval = interval_s
        self._max_keys = max_keys
        self._clock = clock
        self._seen: dict[tuple[str, str], tuple[float, int]] = {}
        """(who, kind) -> (when the interval started, refusals suppressed since)."""

    def denied(self, who: str, kind: str, message: str, *args: object) -> None:
        """Log ``message % args`` for the first refusal of (who, kind) in an interval; count
        the others. ``who`` and ``kind`` are keys, not log text: clip what ``args`` carry."""
        key = (who, kind)
        now = self._clock()
        entry = self._seen.get(key)
        if entry is not None and now - entry[0] < self._interval:
            self._seen[key] = (entry[0], entry[1] + 1)
            return
        if entry is not None:
            self._report(key, entry[1])
            del self._seen[key]
        elif len(self._seen) >= self._max_keys:
            oldest = next(iter(self._seen))
            self._report(oldest, self._seen.pop(oldest)[1])
        self._seen[key] = (now, 0)
        self._log.info(message, *args)

    def flush(self) -> None:
        """Report every suppressed count now."""
        for key, (_, suppressed) in self._seen.items():
            self._report(key, suppressed)
        self._seen.clear()

    def _report(self, key: tuple[str, str], suppressed: int) -> None:
        if suppressed:
            self._log.info("%d more refusals of %s for %s in the last %.0f s (logged once per "
                           "interval)", suppressed, key[1], clip(key[0]), self._interval)
