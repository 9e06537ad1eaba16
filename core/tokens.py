"""API tokens: long random secrets that stand for a user where a password cannot go (an HTTP
client sending ``Authorization: Bearer slt_...``, a Knative sink, a webhook sender).

A token is ``slt_`` + its id (16 hex digits, shown in lists) + ``_`` + 32 random bytes
(url-safe base64). It is shown once, when made; the metadata keeps only its SHA-256, per user,
so a copy of the database names no usable token, and it replicates like users do. A token acts
with its user's current rights; deleting the token or the user ends it (changing the password
does not).

Checking a token costs a SHA-256 and a constant-time comparison with the stored hash, an
unknown id the same against a decoy hash. A token checked once is recognised in memory for
``CACHE_S`` seconds; after that it is looked up again, which also records its last use (so
``last_used_ms`` is exact to about a minute). In a replica group only the leader checks
tokens (followers relay the admin API to it), so deleting a token ends it at once everywhere.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
import secrets
import threading
import time
from collections.abc import Callable
from typing import Final

from .auth import Users
from .errors import Unauthenticated
from .metadata import MetadataRepository
from .model import Principal, StoredToken

log = logging.getLogger(__name__)

PREFIX: Final = "slt_"
MAX_TOKENS_PER_USER: Final = 100
CACHE_S: Final = 60.0
"""How long a verified token is recognised without a look-up."""
_SHAPE: Final = re.compile(r"slt_([0-9a-f]{16})_[A-Za-z0-9_-]{43}\Z")
_DECOY_HASH: Final = hashlib.sha256(b"no such token").hexdigest()
WRONG: Final = ("the bearer token is wrong, deleted, or its user was deleted; make a new one "
                "with `sluice user token create USER` (or POST /users/USER/tokens)")


def token_id(token: str) -> str:
    """The id a token carries; Unauthenticated when ``token`` (untrusted) is no token's shape."""
    match = _SHAPE.match(token)
    if match is None:
        raise Unauthenticated("the bearer token is malformed: a Sluice API token looks like "
                              "slt_<16 hex digits>_<43 characters>, as `sluice user token "
                              "create` printed it")
    return match.group(1)


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class UserTokens:
    """Users' API tokens over the metadata repository. Thread-safe: ``cached`` never blocks
    and runs on the event loop; the other calls block on SQL (event-loop callers run them on
    other threads)."""

    def __init__(self, repository: MetadataRepository, users: Users,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._repository = repository
        self._users = users
        self._clock = clock
        self._lock = threading.Lock()
        self._verified: dict[str, tuple[str, str, float]] = {}
        """Token id -> (user, hash, when verified), for tokens checked in the last CACHE_S."""
        users.add_listener(self._rights_changed)

    def create(self, user: str) -> tuple[str, StoredToken]:
        """A new token of ``user``: (the token, shown only now; what is stored).
        UserNotFound, or PreconditionFailed at MAX_TOKENS_PER_USER."""
        token_id_ = secrets.token_hex(8)
        token = f"{PREFIX}{token_id_}_{secrets.token_urlsafe(32)}"
        stored = StoredToken(token_id_, user, _hash(token), int(time.time() * 1000))
        self._repository.add_token(stored, MAX_TOKENS_PER_USER)
        return token, stored

    def list(self, user: str) -> list[StoredToken]:
        """The user's tokens, oldest first (hashes included: callers show ids and times)."""
        return self._repository.tokens(user)

    def delete(self, user: str, token_id_: str) -> bool:
        """End one of the user's tokens at once; whether it existed."""
        deleted = self._repository.delete_token(user, token_id_)
        with self._lock:
            self._verified.pop(token_id_, None)
        return deleted

    def cached(self, token: str) -> Principal | None:
        """The principal of ``token`` when it was verified lately and its user is in memory;
        Unauthenticated when it is malformed or wrong; None when a look-up must decide
        (``authenticate``). Runs on the event loop: one SHA-256, no I/O."""
        key = token_id(token)
        with self._lock:
            known = self._verified.get(key)
        if known is None or self._clock() - known[2] >= CACHE_S:
            return None
        user, expected, _ = known
        if not hmac.compare_digest(expected, _hash(token)):
            raise Unauthenticated(WRONG)
        return self._users.loaded_principal(user)

    def authenticate(self, token: str) -> Principal:
        """The principal of ``token``'s user; Unauthenticated when it is no live token. Blocks
        on SQL: looks the token up and records its use."""
        key = token_id(token)
        stored = self._repository.token(key)
        digest = _hash(token)
        if not hmac.compare_digest(stored.token_hash if stored else _DECOY_HASH, digest) \
                or stored is None:
            raise Unauthenticated(WRONG)
        with self._lock:
            self._verified[key] = (stored.user, digest, self._clock())
        try:
            self._repository.token_used(key, int(time.time() * 1000))
        except Exception as error:  # noqa: BLE001 - a full metadata disk must not refuse the token
            log.warning("could not record the use of API token %s: %s", key, error)
        return self._users.principal(stored.user)

    def _rights_changed(self, user: str, exists: bool) -> None:
        """A deleted user's tokens end at once (the database dropped them with the user)."""
        if not exists:
            with self._lock:
                for key in [k for k, v in self._verified.items() if v[0] == user]:
                    del self._verified[key]
