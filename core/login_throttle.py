"""Failed logins counted per peer address, per (peer address, user name) and per user name.

The policy, RabbitMQ's late refusal with EMQX's flapping ban (settings in ``CoreConfig``):

- every failed login is answered ``login_failure_delay_ms`` late;
- a peer address that fails ``login_max_failures_per_peer`` times in a window is refused, right
  password or not and without any check, for ``login_ban_ms``; so is one user name from one
  address after ``login_max_failures_per_peer_user`` failures;
- a user name that fails ``login_max_failures_per_user`` times in a window, from whatever
  addresses, has its costly checks limited to addresses with no failure in their own window:
  the others are refused without a check. A user name alone is never banned: that would let
  anyone lock a user out by failing on purpose, and a correct login from an address that has
  not failed always gets its check.

Addresses are counted by host (IPv6 by its /64, which one machine usually holds whole); user
names by a keyed digest, so a long name costs what a short one does. Counts live in a
``BoundedCache`` of ``login_throttle_bytes``: a flood of new addresses or names makes the
broker forget the oldest counts, never grow.

Runs on the event loop; not thread-safe.
"""

from __future__ import annotations

import hashlib
import ipaddress
import logging
import math
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from .bounded_cache import BoundedCache
from .errors import LoginThrottled
from .settings import CoreConfig
from .untrusted import clip

log = logging.getLogger(__name__)

MAX_ADDRESS_CHARS = 64
"""A peer name that is not an IP address (a Unix socket path) is counted by this many
characters."""
_RECORD_BYTES = 120
"""About what one count costs besides its key: the record object and its three numbers."""


@dataclass(frozen=True)
class LoginLimits:
    """The throttle's settings, in milliseconds and counts."""

    failure_delay_ms: int = 1_000
    window_ms: int = 60_000
    max_failures_per_peer: int = 30
    max_failures_per_peer_user: int = 10
    max_failures_per_user: int = 100
    ban_ms: int = 300_000
    memory_bytes: int = 4 << 20

    @classmethod
    def of(cls, config: CoreConfig) -> LoginLimits:
        """The limits ``config`` sets (its ``login_*`` settings)."""
        return cls(config.login_failure_delay_ms, config.login_failure_window_ms,
                   config.login_max_failures_per_peer, config.login_max_failures_per_peer_user,
                   config.login_max_failures_per_user, config.login_ban_ms,
                   config.login_throttle_bytes)


def peer_address(host: str) -> str:
    """The address a peer's failures are counted under: an IPv4 address (IPv4-mapped IPv6
    ones too), an IPv6 /64 network, or the first characters of anything else."""
    bare = host.strip().strip("[]").partition("%")[0]
    try:
        address = ipaddress.ip_address(bare)
    except ValueError:
        return host[:MAX_ADDRESS_CHARS] or "unknown"
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is None:
            return str(ipaddress.IPv6Network((address, 64), strict=False))
        address = address.ipv4_mapped
    return str(address)


@dataclass
class _Count:
    """Failures of one key in its current window, and until when the key is refused."""

    failures: int
    window_ends: float
    banned_until: float = 0.0


@dataclass(frozen=True)
class Attempt:
    """One login being decided: the keys its failure would count under."""

    address: str
    user: str
    """The user name, for messages only (clip before logging)."""
    peer_key: str
    pair_key: str
    user_key: str
    suspect: bool
    """Whether its address failed in its current window: its costly checks wait behind those
    of clean addresses and are the ones a user name's limit refuses."""


class LoginThrottle:
    """Decides whether a login may be checked, and counts its failure. Runs on the event loop."""

    def __init__(self, limits: LoginLimits = LoginLimits(),
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.limits = limits
        self._clock = clock
        self._counts: BoundedCache[_Count] = BoundedCache(limits.memory_bytes, 256)
        self._key = secrets.token_bytes(16)

    @property
    def held_bytes(self) -> int:
        """About how much memory the counts take (at most ``limits.memory_bytes``)."""
        return self._counts.size

    def admit(self, peer_host: str, user: str) -> Attempt:
        """The attempt of ``user`` from ``peer_host``; LoginThrottled, before any check, while
        the address or the (address, user name) pair is banned."""
        address = peer_address(peer_host)
        digest = hashlib.blake2b(user.encode("utf-8", "surrogatepass"), key=self._key,
                                 digest_size=16).hexdigest()
        attempt = Attempt(address, user, f"p {address}", f"pu {address} {digest}", f"u {digest}",
                          suspect=self._failing(f"p {address}"))
        now = self._clock()
        for key, whom in ((attempt.peer_key, f"address {address}"),
                          (attempt.pair_key, f"user {clip(user)} from address {address}")):
            count = self._counts.get(key)
            if count is not None and count.banned_until > now:
                retry = max(1, math.ceil(count.banned_until - now))
                raise LoginThrottled(
                    f"too many failed logins for {whom}: logins are refused without being "
                    f"checked for another {retry} s; check the user name and password, then "
                    f"retry after that (core.login_ban_ms)", retry)
        return attempt

    def may_check(self, attempt: Attempt) -> None:
        """LoginThrottled if ``attempt`` may not have a costly check: its user name failed too
        often lately and its own address failed too."""
        if attempt.suspect and self._failures(attempt.user_key) >= self.limits.max_failures_per_user:
            count = self._counts.get(attempt.user_key)
            retry = max(1, math.ceil(count.window_ends - self._clock())) if count else 1
            raise LoginThrottled(
                f"too many failed logins for user {clip(attempt.user)} from several addresses, "
                f"and address {attempt.address} failed too: its logins for this user are refused "
                f"without being checked for another {retry} s (core.login_max_failures_per_user)",
                retry)

    def failed(self, attempt: Attempt) -> float:
        """Count a failed check of ``attempt``, banning its address or its (address, user name)
        pair if that was one failure too many; the seconds its refusal is to wait."""
        limits = self.limits
        self._count(attempt.user_key).failures += 1
        self._fail(attempt.peer_key, limits.max_failures_per_peer,
                   f"from address {attempt.address}")
        self._fail(attempt.pair_key, limits.max_failures_per_peer_user,
                   f"of user {clip(attempt.user)} from address {attempt.address}")
        return limits.failure_delay_ms / 1000

    def succeeded(self, attempt: Attempt) -> None:
        """Forget the failures of ``attempt``'s (address, user name) pair: the user got in.
        The address's own count stays, or a guesser could clear it with an account of its own."""
        count = self._counts.get(attempt.pair_key)
        if count is not None:
            count.failures = 0

    def _fail(self, key: str, most: int, whose: str) -> None:
        count = self._count(key)
        count.failures += 1
        now = self._clock()
        if count.failures >= most and count.banned_until <= now:
            count.banned_until = now + self.limits.ban_ms / 1000
            log.warning("logins %s are refused for %d s after %d failures in %d s "
                        "(core.login_ban_ms)", whose, self.limits.ban_ms // 1000,
                        count.failures, self.limits.window_ms // 1000)

    def _count(self, key: str) -> _Count:
        """``key``'s count in its current window (a new window if the last one ended), put
        back as the newest entry so the cache forgets idle keys first."""
        now = self._clock()
        count = self._counts.get(key)
        if count is None:
            count = _Count(0, now + self.limits.window_ms / 1000)
        elif count.window_ends <= now:
            count.failures, count.window_ends = 0, now + self.limits.window_ms / 1000
        self._counts.put(key, count, _RECORD_BYTES)
        return count

    def _failures(self, key: str) -> int:
        count = self._counts.get(key)
        return count.failures if count is not None and count.window_ends > self._clock() else 0

    def _failing(self, key: str) -> bool:
        return self._failures(key) > 0
