"""Browser sessions of the admin API: ``POST /session`` signs in, ``GET`` shows, ``DELETE`` ends.

A browser signs in once with user and password (checked and throttled by core's
``Broker.authenticate``, like every login) and gets an opaque random token in the cookie
``sluice_session`` (HttpOnly, SameSite=Strict, Path=/, Secure over HTTPS), plus a second random
token, the CSRF token, in the JSON answer. Every write made with the cookie must carry
``X-CSRF-Token`` equal to it: a page of another site can make the browser send the cookie, but
cannot read the answer that holds the CSRF token.

The table lives in the admin server's memory only: tokens are stored by their SHA-256 (a copy of
the table names no usable cookie), sessions end after ``admin.session_idle_timeout_s`` without a
request, and at most ``MAX_SESSIONS`` live at once (signing in beyond that ends the least
recently used), so a flood of sign-ins cannot grow memory without bound. The user's rights are
read afresh on every request; deleting the user ends its sessions at once.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from core.errors import Unauthenticated
from core.model import Principal
from protocols import relayed_peers

from .errors import HttpProblem
from .guards import SAFE_METHODS
from .handlers import blocking, body_of, deps, field

COOKIE = "sluice_session"
CSRF_HEADER = "X-CSRF-Token"
MAX_SESSIONS = 10_000
"""Live sessions at most; signing in beyond this ends the least recently used one."""
TOKEN_BYTES = 32
MAX_TOKEN_CHARS = 64
"""A cookie value longer than this is no token of ours (``token_urlsafe(32)`` has 43 chars)."""
_TOKEN_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
EXPIRED = ("no live session: it ended (signed out, idle too long, or the broker restarted) or "
           "never began; sign in again with POST /session")


@dataclass
class Session:
    """One signed-in browser: its user, its CSRF token and when it was last used."""

    user: str
    csrf_token: str
    last_used: float


class SessionTable:
    """Live sessions by the SHA-256 of their token, least recently used first. Thread-safe:
    requests use it on the event loop, user deletions end sessions from other threads."""

    def __init__(self, idle_timeout_s: float, max_sessions: int = MAX_SESSIONS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if idle_timeout_s <= 0 or max_sessions < 1:
            raise ValueError("a session table needs a positive idle timeout and room for one")
        self.idle_timeout_s = idle_timeout_s
        self.max_sessions = max_sessions
        self._clock = clock
        self._lock = threading.Lock()
        self._sessions: OrderedDict[bytes, Session] = OrderedDict()

    def __len__(self) -> int:
        with self._lock:
            return len(self._sessions)

    def open(self, user: str) -> tuple[str, Session]:
        """A new session of ``user``: (the cookie's token, the session)."""
        token = secrets.token_urlsafe(TOKEN_BYTES)
        session = Session(user, secrets.token_urlsafe(TOKEN_BYTES), self._clock())
        with self._lock:
            self._drop_idle(session.last_used)
            while len(self._sessions) >= self.max_sessions:
                self._sessions.popitem(last=False)
            self._sessions[_key(token)] = session
        return token, session

    def find(self, token: str) -> Session | None:
        """The live session of ``token`` (any string: a cookie is untrusted), marked used now;
        None when there is none or it was idle too long."""
        if not is_token(token):
            return None
        key, now = _key(token), self._clock()
        with self._lock:
            self._drop_idle(now)
            session = self._sessions.get(key)
            if session is None:
                return None
            session.last_used = now
            self._sessions.move_to_end(key)
            return session

    def close(self, token: str) -> None:
        """End the session of ``token``, if there is one."""
        if is_token(token):
            with self._lock:
                self._sessions.pop(_key(token), None)

    def end_user(self, user: str) -> None:
        """End every session of ``user``."""
        with self._lock:
            for key in [k for k, s in self._sessions.items() if s.user == user]:
                del self._sessions[key]

    def _drop_idle(self, now: float) -> None:
        """Under the lock: drop sessions idle too long (they are first in the order)."""
        while self._sessions:
            key, oldest = next(iter(self._sessions.items()))
            if now - oldest.last_used < self.idle_timeout_s:
                return
            del self._sessions[key]


def is_token(value: str) -> bool:
    """Whether ``value`` could be a token this module made (it parses untrusted cookies)."""
    return 0 < len(value) <= MAX_TOKEN_CHARS and _TOKEN_CHARS.issuperset(value)


def _key(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


SESSIONS: web.AppKey[SessionTable] = web.AppKey("sessions", SessionTable)


def table_for(deps_: Any) -> SessionTable:
    """The session table of an admin server: sessions of a user end when the user is deleted."""
    table = SessionTable(deps_.session_idle_timeout_s)
    users = getattr(deps_.broker, "users", None)
    if users is not None:
        users.add_listener(lambda user, exists: None if exists else table.end_user(user))
    return table


async def principal_of(request: web.Request, token: str) -> tuple[Principal, Session]:
    """The principal behind the session cookie ``token`` (with the user's current rights) and
    the session; a write must carry the session's CSRF token. Unauthenticated (401) without a
    live session, 403 ``csrf`` for a write without the right CSRF token."""
    session = request.app[SESSIONS].find(token)
    if session is None:
        raise Unauthenticated(EXPIRED)
    if request.method not in SAFE_METHODS:
        check_csrf(request, session)
    users = deps(request).broker.users
    principal = users.loaded_principal(session.user)
    if principal is None:
        principal = await blocking(users.principal, session.user)
    return principal, session


def check_csrf(request: web.Request, session: Session) -> None:
    """403 ``csrf`` unless the request's ``X-CSRF-Token`` is the session's CSRF token."""
    sent = request.headers.get(CSRF_HEADER, "")
    if not hmac.compare_digest(sent.encode(), session.csrf_token.encode()):
        what = "a wrong" if sent else "no"
        raise HttpProblem(403, "csrf", f"{request.method} refused: it carries {what} "
                          f"{CSRF_HEADER} header; a write made with the session cookie must send "
                          "the csrf_token that POST /session (or GET /session) answered")


def _session_json(request: web.Request, principal: Principal,
                  session: Session) -> dict[str, Any]:
    return {"user": session.user, "admin": principal.admin, "csrf_token": session.csrf_token,
            "idle_timeout_s": int(request.app[SESSIONS].idle_timeout_s)}


def _cookie(request: web.Request) -> str | None:
    return request.cookies.get(COOKIE)


async def sign_in(request: web.Request, principal: Principal) -> web.Response:
    """Check user and password (throttled like every login) and start a session."""
    body = await body_of(request)
    user, password = field(body, "user", str), field(body, "password", str)
    found = await deps(request).broker.authenticate(user, password, relayed_peers.remote(request))
    token, session = request.app[SESSIONS].open(found.user)
    response = web.json_response(_session_json(request, found, session))
    response.set_cookie(COOKIE, token, path="/", httponly=True, samesite="Strict",
                        secure=request.secure)
    return response


async def show(request: web.Request, principal: Principal) -> dict[str, Any]:
    """The live session of the cookie (no new token); 401 without one."""
    token = _cookie(request)
    if token is None:
        raise Unauthenticated("no session cookie: sign in with POST /session")
    return _session_json(request, *await principal_of(request, token))


async def sign_out(request: web.Request, principal: Principal) -> web.Response:
    """End the cookie's session (the write needs its CSRF token) and clear the cookie."""
    token = _cookie(request)
    if token is None:
        raise Unauthenticated("no session cookie: there is nothing to sign out of")
    await principal_of(request, token)
    request.app[SESSIONS].close(token)
    response = web.Response(status=204)
    response.del_cookie(COOKIE, path="/", secure=request.secure, httponly=True, samesite="Strict")
    return response
