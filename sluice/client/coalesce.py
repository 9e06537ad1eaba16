"""Many concurrent calls merged into few requests, without waiting on a timer.

While fewer than ``max_in_flight`` requests are out, an item goes out at the end of the current
loop iteration together with every other item queued in that iteration. Once the limit is
reached, new items queue up and leave together in the next request. Under light load a call
costs one request of its own; under heavy load the per-request cost of gRPC is shared by many
messages. Runs on the client's event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")

Submit = Callable[[list[Item]], Awaitable[list["Result | BaseException"]]]


class Coalescer(Generic[Item, Result]):
    """``await call(item)`` resolves with that item's entry in the answer to its request."""

    def __init__(self, submit: Submit, max_items: int = 512, max_in_flight: int = 4) -> None:
        self._submit = submit
        self._max_items = max_items
        self._max_in_flight = max_in_flight
        self._pending: list[tuple[Item, asyncio.Future[Result]]] = []
        self._in_flight = 0
        self._scheduled = False

    async def call(self, item: Item) -> Result:
        """Queue ``item``; return its result (or raise its error) once its request is answered."""
        future: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        self._pending.append((item, future))
        self._schedule()
        return await future

    def _schedule(self) -> None:
        if not self._scheduled and self._pending and self._in_flight < self._max_in_flight:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._start_request)

    def _start_request(self) -> None:
        self._scheduled = False
        if not self._pending or self._in_flight >= self._max_in_flight:
            return
        batch, self._pending = self._pending[:self._max_items], self._pending[self._max_items:]
        self._in_flight += 1
        asyncio.get_running_loop().create_task(self._run(batch))
        self._schedule()

    async def _run(self, batch: list[tuple[Item, asyncio.Future[Result]]]) -> None:
        try:
            results = await self._submit([item for item, _ in batch])
        except BaseException as error:  # noqa: BLE001 - every caller in the batch must hear of it
            results = [error] * len(batch)
        finally:
            self._in_flight -= 1
            self._schedule()
        for (_, future), result in zip(batch, results):
            if future.done():
                continue
            if isinstance(result, BaseException):
                future.set_exception(result)
            else:
                future.set_result(result)
