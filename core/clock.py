"""Wall-clock milliseconds: the unit of every deadline and timestamp in core."""

from __future__ import annotations

import time


def now_ms() -> int:
    """Milliseconds since the epoch."""
    return int(time.time() * 1000)
