"""Users' API tokens on the admin API: Bearer authentication and ``/users/{user}/tokens``.

``Authorization: Bearer slt_...`` is accepted on every route as the token's user
(``core.tokens``); a token is checked in memory when it was verified lately, else on a login
thread, and failures are throttled and delayed like wrong passwords (``core.logins``: per
address, and per address and token id). Making, listing and deleting tokens takes the user's
password (Basic or a browser session), not a token: a leaked token cannot mint its successor.

Runs on the event loop.
"""

from __future__ import annotations

import functools
from typing import Any

from aiohttp import web

from core.errors import AccessDenied, NotFound, NotSupported, Unauthenticated
from core.model import Principal, StoredToken
from core.tokens import UserTokens, token_id
from protocols import relayed_peers

from .handlers import blocking, deps

BEARER = web.RequestKey("bearer", bool)
"""Set on a request authenticated by an API token."""


def _tokens(request: web.Request) -> UserTokens:
    tokens = deps(request).tokens
    if tokens is None:
        raise NotSupported("this broker has no API tokens (no metadata database)")
    return tokens


async def authenticate(request: web.Request, token: str) -> Principal:
    """The principal of a Bearer ``token``, throttled like every login."""
    tokens = _tokens(request)
    request[BEARER] = True
    try:
        throttle_key = "token:" + token_id(token)
    except Unauthenticated:
        throttle_key = "token:malformed"
    return await deps(request).broker.logins.decide(
        relayed_peers.remote(request), throttle_key, functools.partial(tokens.cached, token),
        functools.partial(tokens.authenticate, token))


def _password_only(request: web.Request) -> None:
    if request.get(BEARER):
        raise AccessDenied("API tokens are managed with the user's password (Basic or a "
                           "browser session), not with a bearer token")


def token_json(token: StoredToken) -> dict[str, Any]:
    """A token as lists show it: never its secret or hash."""
    return {"id": token.id, "user": token.user, "created_ms": token.created_ms,
            "last_used_ms": token.last_used_ms}


async def create_token(request: web.Request, principal: Principal) -> dict[str, Any]:
    """Make a token for the user; the answer holds the token, the only time it is shown."""
    _password_only(request)
    token, stored = await blocking(_tokens(request).create, request.match_info["user"])
    return {**token_json(stored), "token": token}


async def list_tokens(request: web.Request, principal: Principal) -> list[dict[str, Any]]:
    """The user's tokens: ids, when made and last used."""
    _password_only(request)
    return [token_json(t) for t in await blocking(_tokens(request).list, request.match_info["user"])]


async def delete_token(request: web.Request, principal: Principal) -> None:
    """End one of the user's tokens at once."""
    _password_only(request)
    user, token = request.match_info["user"], request.match_info["token_id"]
    if not await blocking(_tokens(request).delete, user, token):
        raise NotFound(f"user {user!r} has no API token {token!r}; `sluice user token list "
                       f"{user}` shows its tokens")
