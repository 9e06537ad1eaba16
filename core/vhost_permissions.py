"""AMQP permissions as RabbitMQ has them: per user per virtual host, three regular expressions
(configure, write, read) matched against exchange and queue names.

A user without a permission on a virtual host may not open it; an administrator may do
anything anywhere. An expression matches a name anywhere in it (a search, as RabbitMQ's
``re:run``), and ``''`` matches nothing (RabbitMQ's synonym for ``^$``). Expressions are
compiled by RE2 (``core.safe_regex``), so matching takes time linear in the name whatever an
administrator wrote; constructs RE2 cannot run (backreferences, lookarounds) are refused when a
permission is set, and a stored permission holding one (set by an older version) denies that
right until it is set again. The default exchange
is checked under the name ``amq.default``. Which right an operation needs is the adapter's
rule (``protocols/amqp``); this module only keeps and matches the expressions.

Every permission is held in memory (users × virtual hosts, each row small) and written to the
metadata database before a change is answered; ``version`` grows with every change so callers
may cache decisions. Runs on the event loop; metadata writes go to a thread.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Callable
from dataclasses import InitVar, dataclass, field

from .errors import AccessDenied, InvalidArgument
from .metadata import MetadataRepository
from .model import Principal
from .safe_regex import Pattern, compile_untrusted
from .untrusted import clip

log = logging.getLogger(__name__)

DEFAULT_EXCHANGE_NAME = "amq.default"
"""The name the default exchange ('') is checked under, as in RabbitMQ."""
MAX_EXPRESSION_CHARS = 1024


class Right(enum.Enum):
    """The three rights of a permission."""

    CONFIGURE = "configure"
    WRITE = "write"
    READ = "read"


@dataclass(frozen=True)
class VhostPermission:
    """``user``'s rights on ``vhost``: a regular expression per right.

    InvalidArgument if an expression is too long or RE2 cannot compile it; with ``restored``
    (a row read back from metadata) such an expression is logged and denies its right instead,
    so a permission stored by an older version never stops the broker from starting.
    """

    user: str
    vhost: str
    configure: str
    write: str
    read: str
    restored: InitVar[bool] = False
    _compiled: dict[Right, Pattern | None] = field(default_factory=dict, init=False,
                                                   compare=False, repr=False)

    def __post_init__(self, restored: bool) -> None:
        for right in Right:
            try:
                self._compiled[right] = self._compile(right)
            except InvalidArgument as refused:
                if not restored:
                    raise
                log.warning("the %s right of user %s on vhost %s denies everything until it is "
                            "set again (`sluice vhost permit`): %s", right.value, clip(self.user),
                            clip(self.vhost), refused)
                self._compiled[right] = None

    def _compile(self, right: Right) -> Pattern | None:
        expression = getattr(self, right.value)
        if len(expression) > MAX_EXPRESSION_CHARS:
            raise InvalidArgument(f"the {right.value} expression is longer than "
                                  f"{MAX_EXPRESSION_CHARS} characters")
        if not expression:
            return None
        return compile_untrusted(expression, f"the {right.value} expression")

    def pattern(self, right: Right) -> Pattern | None:
        """The compiled expression of ``right``; None when it matches nothing."""
        return self._compiled[right]

    def allows(self, right: Right, name: str) -> bool:
        """Whether this permission grants ``right`` on the exchange or queue ``name``: linear
        in the name's length (RE2)."""
        pattern = self._compiled[right]
        return pattern is not None and pattern.search(name) is not None

    def as_json(self) -> dict[str, str]:
        return {"user": self.user, "vhost": self.vhost, "configure": self.configure,
                "write": self.write, "read": self.read}


class VhostPermissions:
    """Every user's permissions on every virtual host, restored from and written to metadata."""

    def __init__(self, metadata: MetadataRepository | None) -> None:
        """``metadata`` None: permissions live in memory only, and there are none until set
        (a front end built without them lets only administrators in)."""
        self._metadata = metadata
        self._by_key: dict[tuple[str, str], VhostPermission] = {}
        self.version = 0
        """Grows with every change: a decision cached at one version holds until it moves."""
        self._listeners: list[Callable[[str, str], None]] = []

    def load(self, rows: list[tuple[str, str, str, str, str]]) -> None:
        """Restore from ``MetadataRepository.vhost_permissions`` rows."""
        for user, vhost, configure, write, read in rows:
            self._by_key[(user, vhost)] = VhostPermission(user, vhost, configure, write, read,
                                                          restored=True)
        self.version += 1

    def add_listener(self, listener: Callable[[str, str], None]) -> None:
        """Call ``listener(user, vhost)`` on the event loop after that permission changed
        through ``set`` or ``clear``."""
        self._listeners.append(listener)

    def _changed(self, user: str, vhost: str) -> None:
        self.version += 1
        for listener in self._listeners:
            listener(user, vhost)

    def list(self, vhost: str | None = None, user: str | None = None) -> list[VhostPermission]:
        """The permissions, optionally of one vhost or one user, by user and vhost."""
        return [p for key, p in sorted(self._by_key.items())
                if (vhost is None or p.vhost == vhost) and (user is None or p.user == user)]

    def get(self, user: str, vhost: str) -> VhostPermission | None:
        return self._by_key.get((user, vhost))

    async def set(self, permission: VhostPermission) -> None:
        """Store ``permission`` (replacing the user's on that vhost); UserNotFound if the user
        does not exist. The caller checks that the vhost does."""
        await self._write("put_vhost_permission", permission.user, permission.vhost,
                          permission.configure, permission.write, permission.read)
        self._by_key[(permission.user, permission.vhost)] = permission
        self._changed(permission.user, permission.vhost)

    async def clear(self, user: str, vhost: str) -> bool:
        """Remove ``user``'s permission on ``vhost``; whether there was one."""
        gone = await self._write("delete_vhost_permissions", user, vhost)
        found = self._by_key.pop((user, vhost), None) is not None
        self._changed(user, vhost)
        return bool(gone) or found

    async def vhost_deleted(self, vhost: str) -> None:
        """Forget every permission on ``vhost`` (it is gone)."""
        await self._write("delete_vhost_permissions", None, vhost)
        for key in [k for k in self._by_key if k[1] == vhost]:
            del self._by_key[key]
        self.version += 1

    async def _write(self, method: str, *args: str | None) -> object:
        """Call the metadata repository's ``method`` off the event loop (nothing without one)."""
        if self._metadata is None:
            return None
        return await asyncio.to_thread(getattr(self._metadata, method), *args)

    def user_changed(self, user: str, exists: bool) -> None:
        """``Users`` change listener: a deleted user's permissions went with it (the database
        cascades). May run on any thread; replacing the dict keeps readers consistent."""
        if not exists:
            self._by_key = {k: p for k, p in self._by_key.items() if k[0] != user}
            self.version += 1

    # --- decisions ---

    def may_open(self, principal: Principal, vhost: str) -> bool:
        """Whether ``principal`` may open ``vhost`` (an admin, or any permission on it)."""
        return principal.admin or (principal.user, vhost) in self._by_key

    def allows(self, principal: Principal, vhost: str, right: Right, name: str) -> bool:
        """Whether ``principal`` has ``right`` on the exchange or queue ``name`` of ``vhost``."""
        if principal.admin:
            return True
        permission = self._by_key.get((principal.user, vhost))
        return permission is not None and permission.allows(right, name)


def refusal(principal: Principal, vhost: str, kind: str, name: str) -> AccessDenied:
    """RabbitMQ's 403 for a refused operation on ``kind`` (exchange, queue) ``name``."""
    return AccessDenied(f"access to {kind} {clip(name)} in vhost {clip(vhost)} refused for "
                        f"user {clip(principal.user)}")
