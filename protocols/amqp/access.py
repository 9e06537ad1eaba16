"""One connection's rights on its virtual host, decided by core's ``VhostPermissions`` and
remembered until the permissions change (their ``version`` moves), so a publish costs a dict
lookup, not a regular expression. Runs on the event loop.
"""

from __future__ import annotations

from core.model import Principal
from core.vhost_permissions import DEFAULT_EXCHANGE_NAME, Right, VhostPermissions, refusal

EXCHANGE = "exchange"
QUEUE = "queue"
MAX_REMEMBERED = 1024
"""Decisions one connection keeps; beyond this they are forgotten and decided again."""


class VhostAccess:
    """What ``principal`` may do on ``vhost``."""

    def __init__(self, permissions: VhostPermissions, principal: Principal, vhost: str) -> None:
        self._permissions = permissions
        self._principal = principal
        self._vhost = vhost
        self._version = -1
        self._decided: dict[tuple[Right, str, str], bool] = {}

    def allows(self, right: Right, kind: str, name: str) -> bool:
        """Whether ``right`` is granted on the exchange or queue ``name``."""
        if kind == EXCHANGE and not name:
            name = DEFAULT_EXCHANGE_NAME
        permissions = self._permissions
        if self._version != permissions.version or len(self._decided) >= MAX_REMEMBERED:
            self._decided.clear()
            self._version = permissions.version
        key = (right, kind, name)
        decided = self._decided.get(key)
        if decided is None:
            decided = self._decided[key] = permissions.allows(self._principal, self._vhost,
                                                              right, name)
        return decided

    def check(self, right: Right, kind: str, name: str) -> None:
        """AccessDenied (403 ACCESS_REFUSED) unless ``right`` is granted on ``name``."""
        if not self.allows(right, kind, name):
            raise refusal(self._principal, self._vhost, kind,
                          name or DEFAULT_EXCHANGE_NAME if kind == EXCHANGE else name)
