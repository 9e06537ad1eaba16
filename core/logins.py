"""The way every login goes, whatever its protocol: throttle, cheap check, costly check, answer.

1. ``LoginThrottle.admit``: a banned address, or address and user name, is refused at once.
2. The cheap check, on the event loop: credentials already verified and held in memory (a
   keyed digest of the last password verified, a signing secret). A match logs in at once.
3. Otherwise the costly check (scrypt, SQL) on ``CheckPool``'s threads, if the throttle lets
   this address have one (``may_check``). Logins with the same credentials (``shared``) that
   arrive while one of them is being checked wait for that check's answer rather than queue
   their own: a fleet sharing one user and password reconnecting at once costs one scrypt.
4. A failure is counted and answered ``login_failure_delay_ms`` late; refusals by the throttle
   or the pool are neither counted nor delayed (they cost the broker nothing).

Runs on the event loop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Hashable

from .errors import LoginBusy, LoginThrottled, Unauthenticated
from .login_checks import CheckPool
from .login_throttle import LoginLimits, LoginThrottle
from .model import Principal
from .settings import CoreConfig


class Logins:
    """Decides logins for every adapter (``Broker.authenticate`` and ``authenticate_signature``)."""

    def __init__(self, config: CoreConfig = CoreConfig(), *,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[object]] = asyncio.sleep) -> None:
        """``clock`` and ``sleep`` are the throttle's time (tests give their own)."""
        self.throttle = LoginThrottle(LoginLimits.of(config), clock)
        self.checks = CheckPool(config.login_check_threads, config.login_max_pending_checks)
        self._sleep = sleep
        self._checking: dict[Hashable, asyncio.Future[Principal]] = {}
        """Costly checks running, by their ``shared`` key."""

    async def decide(self, peer_host: str, user: str, cheap: Callable[[], Principal | None],
                     costly: Callable[[], Principal], shared: Hashable | None = None) -> Principal:
        """The principal of ``user`` logging in from ``peer_host``; Unauthenticated if refused.

        ``cheap()`` runs here on the event loop and must not block: the principal, None when it
        cannot tell, or Unauthenticated. ``costly()`` runs on a check thread: the principal or
        Unauthenticated. Logins with equal ``shared`` keys share a costly check running already."""
        attempt = self.throttle.admit(peer_host, user)
        try:
            principal = cheap()
            if principal is None:
                self.throttle.may_check(attempt)
                running = self._checking.get(shared) if shared is not None else None
                if running is not None:
                    principal = await asyncio.shield(running)
                else:
                    principal = await self._check(shared, attempt.address, attempt.suspect, costly)
        except (LoginThrottled, LoginBusy):
            raise
        except Unauthenticated:
            await self._sleep(self.throttle.failed(attempt))
            raise
        self.throttle.succeeded(attempt)
        return principal

    async def _check(self, shared: Hashable | None, address: str, suspect: bool,
                     costly: Callable[[], Principal]) -> Principal:
        """Run ``costly`` on the pool; others with the same ``shared`` key await it meanwhile."""
        if shared is None:
            return await self.checks.run(address, suspect, costly)
        check = asyncio.ensure_future(self.checks.run(address, suspect, costly))
        self._checking[shared] = check
        check.add_done_callback(lambda done: self._settled(shared, done))
        return await asyncio.shield(check)

    def _settled(self, shared: Hashable, check: asyncio.Future[Principal]) -> None:
        del self._checking[shared]
        if not check.cancelled():
            check.exception()  # read here: every caller may have gone meanwhile

    def close(self) -> None:
        """Stop the check threads (running checks finish first)."""
        self.checks.close()
