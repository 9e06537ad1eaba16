"""Waiting for what a test awaits by polling an observable, for tests that have no event to
await: a generous deadline, never an assertion on how long it took."""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")
POLL_S = 0.2


def wait_for(check: Callable[[], T], what: str, timeout: float,
             seen: Callable[[], object] | None = None) -> T:
    """``check()`` once it answers something truthy; after ``timeout`` seconds fail, naming
    ``what`` and, if given, what ``seen()`` says was there instead."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}"
                                 + (f"; seen: {seen()}" if seen is not None else ""))
        time.sleep(POLL_S)
