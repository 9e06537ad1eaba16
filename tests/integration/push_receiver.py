"""An HTTP receiver for push tests: a real aiohttp server on 127.0.0.1, on an event loop of its
own thread, that records every request and answers as the test's ``answer`` decides."""
from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.waiting import wait_for


@dataclass
class Seen:
    """One request as the receiver got it."""

    path: str
    headers: dict[str, str]
    body: bytes
    at: float = field(default_factory=time.monotonic)
    peer: tuple[str, int] | None = None
    """The sender's (address, port), while its connection is open."""


Answer = Callable[[Seen, int], Awaitable[web.StreamResponse] | web.StreamResponse]
"""``answer(request, how many requests came before it)``."""


def ok(_: Seen, __: int) -> web.StreamResponse:
    return web.Response(status=204)


class Receiver:
    """Started on construction; ``url`` is where it listens, ``seen`` what it got."""

    def __init__(self, answer: Answer = ok, host: str = "127.0.0.1") -> None:
        self.answer = answer
        self.host = host
        self.seen: list[Seen] = []
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.port = asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)
        self.url = f"http://{host}:{self.port}/hook"

    async def _start(self) -> int:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, self.host, 0)
        await site.start()
        return site._server.sockets[0].getsockname()[1]

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        peer = request.transport.get_extra_info("peername") if request.transport else None
        seen = Seen(request.path, dict(request.headers), await request.read(),
                    peer=tuple(peer[:2]) if peer else None)
        count = len(self.seen)
        self.seen.append(seen)
        answer: Any = self.answer(seen, count)
        if asyncio.iscoroutine(answer):
            answer = await answer
        return answer

    def wait(self, count: int, timeout: float = 60) -> list[Seen]:
        """The first ``count`` requests, once they came."""
        wait_for(lambda: len(self.seen) >= count, f"{count} request(s) at the receiver", timeout,
                 lambda: len(self.seen))
        return self.seen[:count]

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
