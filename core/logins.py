"""The way every login goes, whatever its protocol: throttle, cheap check, costly check, answer.

1. ``LoginThrottle.admit``: a banned address, or address and user name, is refused at once.
2. The cheap check, on the event loop: credentials already verified and held in memory (a
   keyed digest of the last password verified, a signing secret). A match logs in at once.
3. Otherwise the costly check (scrypt, SQL) on ``CheckPool``'s threads, if the throttle lets
   this address have one (``may_check``).
4. A failure is counted and answered ``login_failure_delay_ms`` late; refusals by the throttle
   or the pool are neither counted nor delayed (they cost the broker nothing).

Runs on the event loop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

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

    async def decide(self, peer_host: str, user: str, cheap: Callable[[], Principal | None],
                     costly: Callable[[], Principal]) -> Principal:
        """The principal of ``user`` logging in from ``peer_host``; Unauthenticated if refused.

        ``cheap()`` runs here on the event loop and must not block: the principal, None when it
        cannot tell, or Unauthenticated. ``costly()`` runs on a check thread: the principal or
        Unauthenticated."""
        attempt = self.throttle.admit(peer_host, user)
        try:
            principal = cheap()
            if principal is None:
                self.throttle.may_check(attempt)
                principal = await self.checks.run(attempt.address, attempt.suspect, costly)
        except (LoginThrottled, LoginBusy):
            raise
        except Unauthenticated:
            await self._sleep(self.throttle.failed(attempt))
            raise
        self.throttle.succeeded(attempt)
        return principal

    def close(self) -> None:
        """Stop the check threads (running checks finish first)."""
        self.checks.close()
