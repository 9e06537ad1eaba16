"""Users: authentication (password or HMAC-SHA1 signature) and authorization of principals.

Principals are cached per user with their permissions and access-control rules, so
``authorize`` never touches the database. Every change made through ``Users`` (grant, revoke,
rules, password, create, delete) reloads the affected cached principals before returning, and
``authorize`` checks the cached principal, not the copy a connection holds: a revoke applies at
once to connections already open, and change listeners let adapters end what it no longer
allows. Changes written to the database by another process are seen after a restart.

Topics whose names start with ``INTERNAL_PREFIX`` hold the broker's own state: only admins may
use them, whatever a user's patterns say.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
from collections.abc import Callable

from .acl import EVERYONE, RuleSet, check_rule
from .bounded_cache import BoundedCache
from .errors import AccessDenied, AlreadyExists, Unauthenticated, UserNotFound
from .metadata import MetadataRepository
from .model import INTERNAL_PREFIX, AclRule, Action, Permission, Principal, ResourceKind, User
from .routing import TopicSyntax
from .topic_map import SubjectTopics
from .untrusted import clip

_IMPLIED_BY_ADMIN = frozenset({Action.PUBLISH, Action.SUBSCRIBE})
_DECOY_SECRET = b"\x00" * 20
DECISION_CACHE_BYTES = 16 << 20
"""Decisions are cached until their keys hold this many bytes of names, then forgotten."""
UNKNOWN_KEYS_BYTES = 1 << 20
"""Access keys found to name no user are remembered up to this many bytes, so a signature
under an unknown key is refused as cheaply as one under a known key (no timing difference)."""
MAX_ACCESS_KEY_CHARS = 1024
RightsListener = Callable[[str, bool], None]
"""Called with (user name, whether the user still exists) after a user's rights changed;
the user name is ``*`` when a rule for everyone changed. Runs on the thread that made the change."""


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


def _wrong_credentials(what: str, name: str) -> str:
    """The refusal of a login, the same whether or not the user exists (so it tells nobody
    which names exist), with what an operator can do about it."""
    return (f"{what}: check both; an admin can list users (`sluice user list`) and set a "
            f"password (`sluice user passwd {name}`)")


def _allows(permission: Permission, action: Action, kind: ResourceKind, name: str) -> bool:
    granted = permission.actions
    return (permission.kind is kind
            and (action in granted or (Action.ADMIN in granted and action in _IMPLIED_BY_ADMIN))
            and pattern_matches(permission.pattern, name))


class Users:
    """Authentication, authorization and user management over a MetadataRepository.

    Thread-safe. ``authorize``, ``cached_login`` and ``cached_signature`` never block and may
    run on the event loop; ``authenticate``, ``authenticate_signature`` and the management
    calls block on SQL and scrypt, so event-loop callers run them on other threads
    (``core.logins`` does, for every adapter).
    """

    def __init__(self, repository: MetadataRepository, subject_syntax: TopicSyntax,
                 subject_topics: SubjectTopics | None = None) -> None:
        """``subject_syntax``: how access-control rules and subscription filters are written;
        ``subject_topics``: which topic stores a subject (default: its first level)."""
        self._repository = repository
        self._syntax = subject_syntax
        self._topics = subject_topics or SubjectTopics(subject_syntax)
        self._lock = threading.Lock()          # guards _principals and _generation
        self._manage_lock = threading.Lock()   # orders management changes and their reloads
        self._principals: dict[str, Principal] = {}
        self._decisions: dict[tuple, tuple[int, bool]] = {}
        """(user, client id, action, kind or filter flag, name) -> (generation, allowed), for
        users loaded in ``_principals``; any reload bumps the generation and so invalidates
        every entry. Bounded by ``DECISION_CACHE_BYTES`` of names."""
        self._decision_bytes = 0
        self._generation = 0
        self._listeners: list[RightsListener] = []
        self._cache_key = secrets.token_bytes(32)
        self._verified: dict[str, bytes] = {}  # user -> keyed digest of the last password verified
        self._secrets: dict[str, bytes] = {}   # user -> signing secret, decrypted once
        self._unknown_keys: BoundedCache[bool] = BoundedCache(UNKNOWN_KEYS_BYTES,
                                                              MAX_ACCESS_KEY_CHARS)
        """Access keys that named no user when looked up; guarded by ``_lock``, cleared by
        every reload (a user may have been created)."""

    # --- authentication ---
    def cached_login(self, username: str, password: str) -> Principal | None:
        """``username``'s principal if ``password`` is the one last verified for it and both are
        in memory; None otherwise (``authenticate`` decides, off the event loop). Costs one
        keyed SHA-256: runs on the event loop."""
        digest = self._digest(password)
        with self._lock:
            known = self._verified.get(username)
            principal = self._principals.get(username)
        if known is not None and principal is not None and hmac.compare_digest(known, digest):
            return principal
        return None

    def login_key(self, username: str, password: str) -> tuple[str, bytes]:
        """What identifies one set of credentials without holding the password (a keyed
        digest): logins with the same key share one check. Runs on the event loop."""
        return username, self._digest(password)

    def authenticate(self, username: str, password: str) -> Principal:
        """The principal of ``username`` if ``password`` is theirs; Unauthenticated otherwise.

        Blocks: a password not verified before costs a scrypt hash (an unknown user name one as
        well, so it answers as slowly), and loading the principal costs SQL. A password verified
        before is recognised by a keyed digest kept in memory until the user changes.
        """
        digest = self._digest(password)
        with self._lock:
            known = self._verified.get(username)
            generation = self._generation
        if known is None or not hmac.compare_digest(known, digest):
            if self._repository.verify_password(username, password) is None:
                raise Unauthenticated(_wrong_credentials(f"user name or password is wrong for "
                                                         f"{username!r}", username))
            with self._lock:
                if self._generation == generation:
                    self._verified[username] = digest
        return self._principal(username)

    def certificate_login(self, username: str) -> Principal:
        """The principal of ``username``, named by a client certificate the TLS layer verified;
        Unauthenticated when no such user exists (the certificate proves the name, not that
        the broker knows it). Blocks on SQL."""
        if self._repository.get_user(username) is None:
            raise Unauthenticated(f"the client certificate names user {username!r}, which does "
                                  f"not exist: create it (`sluice user create {username}`) or "
                                  "issue the certificate with an existing user's name as its CN")
        return self._principal(username)

    def cached_signature(self, access_key: str, signed: bytes, signature_hex: str) -> Principal | None:
        """``access_key``'s principal if its secret is in memory and ``signature_hex`` is the
        HMAC-SHA1 of ``signed`` under it; Unauthenticated if the signature is wrong or the key is
        known to name no user; None when that takes a look-up (``authenticate_signature``).
        Costs one HMAC-SHA1, the same for known and unknown keys: runs on the event loop."""
        with self._lock:
            secret = self._secrets.get(access_key)
            unknown = secret is None and self._unknown_keys.get(access_key) is not None
            principal = self._principals.get(access_key)
        if secret is None and not unknown:
            return None
        self._check_signature(access_key, secret, signed, signature_hex)
        return principal

    def authenticate_signature(self, access_key: str, signed: bytes, signature_hex: str) -> Principal:
        """The principal of ``access_key`` if ``signature_hex`` is HMAC-SHA1(its secret, ``signed``).
        Blocks on SQL when the secret is not in memory yet."""
        with self._lock:
            secret = self._secrets.get(access_key)
            generation = self._generation
        if secret is None:
            secret = self._repository.signing_secret(access_key)
            with self._lock:
                if self._generation == generation:
                    if secret is not None:
                        self._secrets[access_key] = secret
                    else:
                        self._unknown_keys.put(access_key, True)
        self._check_signature(access_key, secret, signed, signature_hex)
        return self._principal(access_key)

    def _digest(self, password: str) -> bytes:
        return hmac.new(self._cache_key, password.encode("utf-8", "surrogatepass"),
                        hashlib.sha256).digest()

    @staticmethod
    def _check_signature(access_key: str, secret: bytes | None, signed: bytes,
                         signature_hex: str) -> None:
        """Unauthenticated unless ``secret`` exists and signs ``signed`` as ``signature_hex``;
        an unknown key costs the same HMAC, under a decoy secret."""
        expected = hmac.new(secret or _DECOY_SECRET, signed, hashlib.sha1).hexdigest().encode()
        given = signature_hex.strip().lower().encode("utf-8", "replace")
        if not hmac.compare_digest(expected, given) or secret is None:
            raise Unauthenticated(_wrong_credentials(
                f"signature check failed for access key {access_key!r} (the user name; the "
                "secret key is its password)", access_key))

    # --- authorization ---
    @property
    def generation(self) -> int:
        """Moves whenever any user's rights change: decisions cached elsewhere expire with it."""
        return self._generation

    def authorize(self, principal: Principal, action: Action, kind: ResourceKind, name: str) -> None:
        """Return if ``principal`` may do ``action`` on the resource; AccessDenied otherwise.

        Admins and SYSTEM may do anything; ADMIN on a resource implies PUBLISH and SUBSCRIBE;
        internal topics are for admins only. Runs anywhere, including the event loop: no I/O.
        """
        if self._decided(principal, (principal.user, "", action, kind, name), self._may_resource):
            return
        shown = clip(name)
        raise AccessDenied(
            f"user {clip(principal.user)} may not {action.value} on {kind.value} {shown}; ask an "
            f"administrator to grant {action.value} on a {kind.value} pattern matching {shown}")

    def subject_allowed(self, principal: Principal, action: Action, subject: str) -> bool:
        """Whether ``principal`` may publish to, or receive messages of, ``subject`` (an MQTT
        topic): the most specific matching access-control rule, else the topic permission on
        the subject's topic (``core.acl``). Runs anywhere: no I/O."""
        key = (principal.user, principal.client_id, action, False, subject)
        return self._decided(principal, key, self._may_subject)

    def filter_allowed(self, principal: Principal, topic_filter: str) -> bool:
        """Whether ``principal`` may subscribe to ``topic_filter``: the most specific rule
        covering the whole filter, else subscribe on the topic its first level names (any
        topic, ``*``, for a leading wildcard). Runs anywhere: no I/O."""
        key = (principal.user, principal.client_id, Action.SUBSCRIBE, True, topic_filter)
        return self._decided(principal, key, self._may_filter)

    def rules_bind(self, principal: Principal, action: Action) -> bool:
        """Whether any access-control rule on ``action`` applies to ``principal`` now (its own
        or everyone's; admins are bound by none). When none does, ``rule_denies`` is False for
        every subject and a reader skips it. Cached like every decision. Runs anywhere: no I/O."""
        key = (principal.user, "", action, "any rule", "")
        return not self._decided(principal, key, self._no_rule)

    def rule_denies(self, principal: Principal, action: Action, subject: str) -> bool:
        """Whether the most specific access-control rule matching ``subject`` denies it to
        ``principal`` (``core.acl``). Unlike ``subject_allowed``, no rule means no objection:
        for readers whose own operation decided the topic or queue permission. Cached per
        (user, client id, subject) like every decision. Runs anywhere: no I/O."""
        key = (principal.user, principal.client_id, action, "rules", subject)
        return not self._decided(principal, key, self._rules_allow)

    def _decided(self, principal: Principal, key: tuple,
                 decide: Callable[[Principal, Principal, tuple], bool]) -> bool:
        decided = self._decisions.get(key)
        if decided is not None and decided[0] == self._generation:
            return decided[1]
        with self._lock:
            generation = self._generation
            current = self._principals.get(principal.user)
        if current is None:
            current = principal
        allowed = current.admin or decide(current, principal, key)
        if current is not principal or principal.user in self._principals:
            size = len(key[-1]) + len(key[1])
            if self._decision_bytes + size > DECISION_CACHE_BYTES:
                self._decisions.clear()
                self._decision_bytes = 0
            self._decisions[key] = (generation, allowed)
            self._decision_bytes += size
        return allowed

    @staticmethod
    def _may_resource(current: Principal, _: Principal, key: tuple) -> bool:
        _, _, action, kind, name = key
        if kind is ResourceKind.TOPIC and name.startswith(INTERNAL_PREFIX):
            return False
        return any(_allows(p, action, kind, name) for p in current.permissions)

    def _may_subject(self, current: Principal, principal: Principal, key: tuple) -> bool:
        action, subject = key[2], key[4]
        topic = self._topics.topic_of(subject)
        if topic.startswith(INTERNAL_PREFIX):
            return False
        verdict = RuleSet(current.acl, self._syntax).decide(action, current.user, principal.client_id,
                                              subject) if current.acl else None
        if verdict is None:
            verdict = any(_allows(p, action, ResourceKind.TOPIC, topic) for p in current.permissions)
        return verdict

    @staticmethod
    def _no_rule(current: Principal, _: Principal, key: tuple) -> bool:
        action = key[2]
        return not any(action in rule.actions for rule in current.acl)

    def _rules_allow(self, current: Principal, principal: Principal, key: tuple) -> bool:
        action, subject = key[2], key[4]
        return RuleSet(current.acl, self._syntax).decide(
            action, current.user, principal.client_id, subject) is not False

    def _may_filter(self, current: Principal, principal: Principal, key: tuple) -> bool:
        topic_filter, syntax = key[4], self._syntax
        verdict = RuleSet(current.acl, syntax).decide(
            Action.SUBSCRIBE, current.user, principal.client_id, topic_filter,
            is_filter=True) if current.acl else None
        if verdict is None:
            verdict = all(
                not topic.startswith(INTERNAL_PREFIX) and any(
                    _allows(p, Action.SUBSCRIBE, ResourceKind.TOPIC, topic)
                    for p in current.permissions)
                for topic in self._topics.topics_for_filter(topic_filter))
        return verdict

    # --- management ---
    def create_user(self, name: str, password: str, admin: bool = False) -> User:
        """Create a user; AlreadyExists if the name is taken."""
        with self._manage_lock:
            user = self._repository.create_user(name, password, admin)
            self._reload(name)
        return user

    def ensure_user(self, name: str, password: str, admin: bool = False) -> bool:
        """Create ``name`` unless it exists; whether it was created now."""
        try:
            self.create_user(name, password, admin)
        except AlreadyExists:
            return False
        return True

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

    def put_rule(self, rule: AclRule) -> None:
        """Add or replace an access-control rule; applies at once to open connections."""
        check_rule(rule, self._syntax)
        with self._manage_lock:
            self._repository.put_rule(rule)
            self._reload_for_rule(rule.user)

    def delete_rule(self, user: str, pattern: str, allow: bool) -> bool:
        """Remove an access-control rule; whether it existed. Applies at once."""
        with self._manage_lock:
            deleted = self._repository.delete_rule(user, pattern, allow)
            self._reload_for_rule(user)
        return deleted

    def rules(self, user: str | None = None) -> list[AclRule]:
        """Every rule, or those that apply to ``user`` (its own and everyone's)."""
        return self._repository.rules(None if user is None else (user, EVERYONE))

    def add_listener(self, listener: RightsListener) -> None:
        """Call ``listener(user, exists)`` after every change of a user's rights."""
        self._listeners.append(listener)

    def ensure_default_user(self, name: str = "sluice", password: str = "sluice") -> bool:
        """Create admin ``name`` if there are no users at all; whether it was created."""
        if self._repository.list_users():
            return False
        try:
            self.create_user(name, password, admin=True)
        except AlreadyExists:  # another process created it meanwhile
            return False
        return True

    def loaded_principal(self, name: str) -> Principal | None:
        """``name``'s principal if it is in memory (no I/O), else None."""
        with self._lock:
            return self._principals.get(name)

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
        """Cache ``name``'s principal as the database has it now, then tell the listeners.
        Called under ``_manage_lock``."""
        principal = self._load(name)
        with self._lock:
            self._principals[name] = principal
            self._verified.pop(name, None)
            self._secrets.pop(name, None)
            self._unknown_keys.clear()
            self._generation += 1
        self._notify(name, self._repository.get_user(name) is not None)

    def _reload_for_rule(self, user: str) -> None:
        """Reload the principals a rule of ``user`` (``*``: everyone) applies to."""
        if user != EVERYONE:
            self._reload(user)
            return
        with self._lock:
            names = list(self._principals)
        loaded = {name: self._load(name) for name in names}
        with self._lock:
            self._principals.update(loaded)
            self._generation += 1
        self._notify(EVERYONE, True)

    def _notify(self, name: str, exists: bool) -> None:
        for listener in self._listeners:
            listener(name, exists)

    def _load(self, name: str) -> Principal:
        user = self._repository.get_user(name)
        try:
            if user is not None:
                return Principal(name, user.admin, tuple(self._repository.permissions(name)),
                                 tuple(self._repository.rules((name, EVERYONE))))
        except UserNotFound:  # deleted between the two reads
            pass
        return Principal(name)  # deleted: connections still holding its principal get no rights
