"""Costly credential checks (scrypt, SQL look-ups) on a few threads of their own, fairly.

At most ``threads`` checks run at once, on a ``ThreadPoolExecutor`` that nothing else uses, so
a flood of logins neither blocks the event loop nor takes the default executor the store and
metadata writes need. Waiting checks are served round-robin across peer addresses, addresses
with a clean record before those that failed lately (``LoginThrottle``'s ``suspect``): a peer
that floods logins waits behind its own checks, while a correct login from another address
waits for at most one check of each other waiting address. A peer may have at most
``MAX_PENDING_PER_PEER`` checks waiting or running and the broker ``max_pending`` waiting;
beyond either, a login is refused at once (``LoginBusy``).

Runs on the event loop (the checks themselves run on the pool's threads); not thread-safe.
"""

from __future__ import annotations

import asyncio
import functools
from collections import OrderedDict, deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from .errors import LoginBusy

T = TypeVar("T")

MAX_PENDING_PER_PEER = 32
"""Checks one peer address may have waiting or running at once."""
THREAD_NAME = "sluice-login"
"""The name prefix of the pool's threads (tests check that checks run on them)."""


class CheckPool:
    """Runs blocking credential checks on its own threads, at most ``threads`` at once."""

    def __init__(self, threads: int = 2, max_pending: int = 1024) -> None:
        self._threads = max(1, threads)
        self._max_pending = max_pending
        self._executor = ThreadPoolExecutor(self._threads, thread_name_prefix=THREAD_NAME)
        self._running = 0
        self._waiting = 0
        self._queues: tuple[OrderedDict[str, deque[asyncio.Future[None]]], ...] = (
            OrderedDict(), OrderedDict())
        """Waiting checks by address: clean addresses' first, then suspect ones'."""
        self._per_peer: dict[str, int] = {}
        """Checks waiting or running per address (absent: none)."""
        self.served = 0
        """Checks run since start."""

    @property
    def waiting(self) -> int:
        """Checks waiting for a thread."""
        return self._waiting

    async def run(self, address: str, suspect: bool, check: Callable[..., T], *args: object) -> T:
        """``check(*args)`` on a pool thread once one is free for ``address``; LoginBusy at once
        if the address or the broker has too many checks pending. Cancelling the caller
        abandons a waiting check; a running one finishes on its thread and frees it then."""
        if self._per_peer.get(address, 0) >= MAX_PENDING_PER_PEER:
            raise LoginBusy(f"address {address} has {MAX_PENDING_PER_PEER} logins being checked "
                            "already; wait for their answers before trying again")
        if self._running >= self._threads and self._waiting >= self._max_pending:
            raise LoginBusy("the broker is checking too many logins at once "
                            "(core.login_max_pending_checks); retry in a moment")
        self._per_peer[address] = self._per_peer.get(address, 0) + 1
        try:
            await self._turn(address, suspect)
        except BaseException:
            self._forget(address)
            raise
        try:
            done = asyncio.get_running_loop().run_in_executor(
                self._executor, functools.partial(check, *args))
        except RuntimeError:  # closed: the broker is stopping
            self._finished(address)
            raise LoginBusy("the broker is shutting down; log in again once it is back") from None
        self.served += 1
        done.add_done_callback(functools.partial(self._ran, address))
        return await asyncio.shield(done)

    def close(self) -> None:
        """Stop the threads once the running checks end; waiting ones never start."""
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def _turn(self, address: str, suspect: bool) -> None:
        """Return once a thread is reserved for this check."""
        if self._running < self._threads and not self._waiting:
            self._running += 1
            return
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queues[suspect].setdefault(address, deque()).append(turn)
        self._waiting += 1
        try:
            await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():  # given a thread just now: pass it on
                self._running -= 1
                self._next()
            else:
                self._withdraw(suspect, address, turn)
            raise

    def _ran(self, address: str, done: asyncio.Future[object]) -> None:
        if not done.cancelled():
            done.exception()  # retrieved here: a caller cancelled meanwhile never reads it
        self._finished(address)

    def _finished(self, address: str) -> None:
        self._forget(address)
        self._running -= 1
        self._next()

    def _next(self) -> None:
        """Give a free thread to the first waiting check of the next address in turn."""
        while self._running < self._threads and self._waiting:
            queue = self._queues[0] or self._queues[1]
            address, turns = next(iter(queue.items()))
            turn = turns.popleft()
            if turns:
                queue.move_to_end(address)  # round-robin: this address's next check waits
            else:
                del queue[address]
            self._waiting -= 1
            self._running += 1
            turn.set_result(None)

    def _withdraw(self, suspect: bool, address: str, turn: asyncio.Future[None]) -> None:
        turns = self._queues[suspect].get(address)
        if turns is not None and turn in turns:
            turns.remove(turn)
            self._waiting -= 1
            if not turns:
                del self._queues[suspect][address]

    def _forget(self, address: str) -> None:
        left = self._per_peer[address] - 1
        if left:
            self._per_peer[address] = left
        else:
            del self._per_peer[address]
