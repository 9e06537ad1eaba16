"""Publish batches of one connection on their way to disk, overlapped.

A batch of publishes (what one read brought) is routed and appended at once, then waits for the
fsync that makes it durable before its confirms go out. Waiting for that before reading the
next batch would serialize a connection on the disk: one fsync per batch, with the routing and
encoding of the next batch idle meanwhile. Here each batch waits in a task of its own, so the
next batch is appended while the previous one is being synced, and one group commit covers both.

Order is kept: batches are appended in the order they were read, the commit log makes them
durable in that order, so their confirms go out in that order too; and ``drain`` lets every
other method wait until the publishes read before it are done. At most ``limit`` messages are in
flight; beyond that the reader waits for the oldest batch. Runs on the event loop.
"""
from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any

log = logging.getLogger(__name__)


class PublishPipeline:
    """The batches of one connection being stored, oldest first."""

    def __init__(self, limit: int, on_failure: Callable[[BaseException], None]) -> None:
        """``on_failure(error)``: a batch failed unexpectedly (a bug): its publishers were told
        nothing, so the connection must be closed for them to resend."""
        self.limit = limit
        self._on_failure = on_failure
        self._batches: deque[tuple[asyncio.Task[None], int]] = deque()
        self._messages = 0

    async def submit(self, store: Coroutine[Any, Any, None], messages: int) -> None:
        """Start ``store`` (a batch of ``messages`` publishes); return once no more than
        ``limit`` messages are in flight."""
        task = asyncio.get_running_loop().create_task(store)
        self._batches.append((task, messages))
        self._messages += messages
        task.add_done_callback(self._finished)
        while self._messages > self.limit and self._prune():
            await self._wait(self._batches[0][0])

    async def drain(self) -> None:
        """Return once every batch submitted so far is done."""
        while self._prune():
            await self._wait(self._batches[0][0])

    def idle(self) -> bool:
        """Whether no batch is in flight (``drain`` would return at once)."""
        return not self._prune()

    @staticmethod
    async def _wait(task: asyncio.Task[None]) -> None:
        try:
            await asyncio.shield(task)
        except Exception:  # noqa: BLE001 - logged by _finished; the reader goes on
            pass

    def _finished(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("storing AMQP publishes failed; closing the connection",
                      exc_info=task.exception())
            self._on_failure(task.exception())
        self._prune()

    def _prune(self) -> bool:
        """Forget the done batches at the front; whether any batch is still in flight."""
        batches = self._batches
        while batches and batches[0][0].done():
            self._messages -= batches.popleft()[1]
        return bool(batches)
