"""Users: authentication (password or HMAC-SHA1 signature) and authorization of principals.

Principals are cached per user with their permissions, so ``authorize`` never touches the
database. Every change made through ``Users`` (grant, revoke, password, create, delete) reloads
that user's cached principal before returning, and ``authorize`` checks the cached principal,
not the copy a connection holds: a revoke applies at once to connections already open. Changes
written to the database by another process are seen after a restart.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading

from .errors import AccessDenied, AlreadyExists, Unauthenticated, UserNotFound
from .metadata import MetadataRepository
from .model import MAX_NAME_LENGTH, Action, Permission, Principal, ResourceKind, User

_IMPLIED_BY_ADMIN = frozenset({Action.PUBLISH, Action.SUBSCRIBE})
_DECOY_SECRET = b"\x00" * 20


def pattern_matches(pattern: str, name: str) -> bool:
    """Whether ``name`` matches ``pattern``, where ``*`` stands for any run of characters.

    Every other character is literal: no regex, no ``?`` or ``[...]`` classes.
    """
    if "*" not in pattern:
        return name == pattern
    first, *middle, last = pattern.split("*")
    if len(name) < len(first) + len(last) or not (name.startswith(first) and name.endswith(last)):
        return False
    start, end = len(first), len(name) - len(last)
    for part in middle:  # leftmost placement of each fixed part leaves the most room for the rest
        found = name.find(part, start, end)
        if found < 0:
            return False
        start = found + len(part)
    return True


def _allows(permission: Permission, action: Action, kind: ResourceKind, name: str) -> bool:
    granted = permission.actions
    return (permission.kind is kind
            and (action in granted or (Action.ADMIN in granted and action in _IMPLIED_BY_ADMIN))
            and pattern_matches(permission.pattern, name))


class Users:
    """Authentication, authorization and user management over a MetadataRepository.

    Thread-safe. ``authorize`` never blocks and may run on the event loop; ``authenticate``,
    ``authenticate_signature`` and the management calls block on SQL and scrypt, so event-loop
    callers run them in an executor.
    """

    def __init__(self, repository: MetadataRepository) -> None:
        self._repository = repository
        self._lock = threading.Lock()          # guards _principals and _generation
        self._manage_lock = threading.Lock()   # orders management changes and their reloads
        self._principals: dict[str, Principal] = {}
        self._decisions: dict[tuple, tuple[int, bool]] = {}
        """(user, action, kind, name) -> (generation, allowed), for users loaded in
        ``_principals``; any reload bumps the generation and so invalidates every entry."""
        self._generation = 0
        self._cache_key = secrets.token_bytes(32)
        self._verified: dict[str, bytes] = {}  # user -> keyed digest of the last password verified
        self._secrets: dict[str, bytes] = {}   # user -> signing secret, decrypted once

    # --- authentication ---
    def credentials_cached(self, name: str) -> bool:
        """Whether ``name``'s credentials are in memory, so authenticating needs no SQL or scrypt."""
        with self._lock:
            return name in self._verified or name in self._secrets

    def authenticate(self, username: str, password: str) -> Principal:
        """The principal of ``username`` if ``password`` is theirs; Unauthenticated otherwise.

        The first check of a password costs a scrypt hash; a password verified before is
        recognised by a keyed digest kept in memory until the user changes.
        """
        digest = hmac.new(self._cache_key, password.encode("utf-8", "surrogatepass"), hashlib.sha256).digest()
        with self._lock:
            known = self._verified.get(username)
            generation = self._generation
        if known is None or not hmac.compare_digest(known, digest):
            if self._repository.verify_password(username, password) is None:
                raise Unauthenticated(
                    f"user name or password is wrong for {username!r}: check both, or create the "
                    f"user with `sluice user create {username}`")
            with self._lock:
                if self._generation == generation:
                    self._verified[username] = digest
        return self._principal(username)

    def authenticate_signature(self, access_key: str, signed: bytes, signature_hex: str) -> Principal:
        """The principal of ``access_key`` if ``signature_hex`` is HMAC-SHA1(its secret, ``signed``)."""
        with self._lock:
            secret = self._secrets.get(access_key)
            generation = self._generation
        if secret is None:
            secret = self._repository.signing_secret(access_key)
            if secret is not None:
                with self._lock:
                    if self._generation == generation:
                        self._secrets[access_key] = secret
        expected = hmac.new(secret or _DECOY_SECRET, signed, hashlib.sha1).hexdigest().encode()
        given = signature_hex.strip().lower().encode("utf-8", "replace")
        if not hmac.compare_digest(expected, given) or secret is None:
            raise Unauthenticated(
                f"signature check failed for access key {access_key!r}: check the access key and "
                f"secret key (the user's password), or create the user with "
                f"`sluice user create {access_key}`")
        return self._principal(access_key)

    # --- authorization ---
    def authorize(self, principal: Principal, action: Action, kind: ResourceKind, name: str) -> None:
        """Return if ``principal`` may do ``action`` on the resource; AccessDenied otherwise.

        Admins and SYSTEM may do anything; ADMIN on a resource implies PUBLISH and SUBSCRIBE.
        Runs anywhere, including the event loop: no I/O.
        """
        key = (principal.user, action, kind, name)
        decided = self._decisions.get(key)
        if decided is not None and decided[0] == self._generation:
            allowed = decided[1]
        else:
            with self._lock:
                generation = self._generation
                current = self._principals.get(principal.user)
            if current is None:
                current = principal
            allowed = current.admin or any(_allows(p, action, kind, name) for p in current.permissions)
            cacheable = len(name) <= MAX_NAME_LENGTH  # longer names are invalid: never kept
            if cacheable and (current is not principal or principal.user in self._principals):
                if len(self._decisions) > 100_000:
                    self._decisions.clear()
                self._decisions[key] = (generation, allowed)
        if allowed:
            return
        raise AccessDenied(
            f"user {principal.user!r} may not {action.value} on {kind.value} {name!r}; ask an "
            f"administrator to grant {action.value} on a {kind.value} pattern matching {name!r}")

    # --- management ---
    def create_user(self, name: str, password: str, admin: bool = False) -> User:
        """Create a user; AlreadyExists if the name is taken."""
        with self._manage_lock:
            user = self._repository.create_user(name, password, admin)
            self._reload(name)
        return user

    def delete_user(self, name: str) -> bool:
        """Delete a user and its permissions; whether it existed. Its open connections lose all rights."""
        with self._manage_lock:
            deleted = self._repository.delete_user(name)
            self._reload(name)
        return deleted

    def set_password(self, name: str, password: str) -> None:
        """Replace a user's password; UserNotFound if the user does not exist."""
        with self._manage_lock:
            self._repository.set_password(name, password)
            self._reload(name)

    def list_users(self) -> list[User]:
        """Every user, by name."""
        return self._repository.list_users()

    def grant(self, permission: Permission) -> None:
        """Add or replace a permission; applies at once to the user's open connections."""
        with self._manage_lock:
            self._repository.grant(permission)
            self._reload(permission.user)

    def revoke(self, user: str, kind: ResourceKind, pattern: str) -> bool:
        """Remove a permission; whether it existed. Applies at once to the user's open connections."""
        with self._manage_lock:
            revoked = self._repository.revoke(user, kind, pattern)
            self._reload(user)
        return revoked

    def permissions(self, user: str) -> list[Permission]:
        """The user's permissions; UserNotFound if the user does not exist."""
        return self._repository.permissions(user)

    def ensure_default_user(self, name: str = "sluice", password: str = "sluice") -> bool:
        """Create admin ``name`` if there are no users at all; whether it was created."""
        if self._repository.list_users():
            return False
        try:
            self.create_user(name, password, admin=True)
        except AlreadyExists:  # another process created it meanwhile
            return False
        return True

    def principal(self, name: str) -> Principal:
        """``name``'s principal with its current permissions, without checking credentials
        (for calls that carry none, when anonymous access is on). A user that does not exist
        gets no rights until it is created. Blocks on SQL the first time."""
        return self._principal(name)

    # --- the principal cache ---
    def _principal(self, name: str) -> Principal:
        with self._lock:
            cached = self._principals.get(name)
            generation = self._generation
        if cached is not None:
            return cached
        principal = self._load(name)
        with self._lock:
            if self._generation == generation:  # no change was made while we were loading
                self._principals[name] = principal
        return principal

    def _reload(self, name: str) -> None:
        """Cache ``name``'s principal as the database has it now. Called under ``_manage_lock``."""
        principal = self._load(name)
        with self._lock:
            self._principals[name] = principal
            self._verified.pop(name, None)
            self._secrets.pop(name, None)
            self._generation += 1

    def _load(self, name: str) -> Principal:
        user = self._repository.get_user(name)
        try:
            if user is not None:
                return Principal(name, user.admin, tuple(self._repository.permissions(name)))
        except UserNotFound:  # deleted between the two reads
            pass
        return Principal(name)  # deleted: connections still holding its principal get no rights
