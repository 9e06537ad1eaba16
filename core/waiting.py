"""Waiting on an ``asyncio.Event`` with a timeout, cancellable at any moment.

Not ``asyncio.wait_for(event.wait(), timeout)``: on Python 3.11 it swallows a cancellation that
arrives as the event is set, and a background loop cancelled at close would run on.
"""

from __future__ import annotations

import asyncio


async def wait_set(event: asyncio.Event, timeout_s: float) -> bool:
    """Wait until ``event`` is set or ``timeout_s`` passes; whether it is set."""
    if event.is_set():
        return True
    waiter = asyncio.ensure_future(event.wait())
    try:
        await asyncio.wait((waiter,), timeout=timeout_s)
    finally:
        waiter.cancel()
    return event.is_set()
