"""Who may call what on the admin API: HTTP Basic authentication and one access rule per route.

The rule, kept deliberately simple:

- ``PUBLIC``: no credentials (``/health``, ``/metrics``, ``/openapi.json``), so probes and
  Prometheus scrape without a password.
- ``USER``: any authenticated user; lists show only what the user may read.
- ``TOPIC``/``GROUP``: reading one topic's or group's settings and offsets needs an admin user or
  any permission whose pattern matches that topic or group name.
- ``SUBSCRIBE``: anything that returns message bodies needs the subscribe right on the topic,
  decided by core (as for any consumer) before the topic is looked up, so a refusal says nothing
  about whether the topic exists.
- ``PUBLISH``: sending events (``POST /events/{topic}``): any user, the handler checks the
  publish right on the subject as core decides it for an MQTT publish.
- ``SELF``: a user's own API tokens: an admin, or the user the path names.
- ``ADMIN``: every other write, and everything about users and permissions.
- ``SESSION``: ``/session`` itself, a browser's sign-in (``sessions.py``).

Credentials go with every request (curl ``-u``, the CLI, the dashboard's own sign-in form, or
a user's API token as ``Authorization: Bearer slt_...``, ``core.tokens``), or a browser signs in
once and sends the session cookie, with the CSRF token on writes (``sessions.py``): the API
never answers with a ``WWW-Authenticate: Basic`` challenge, so browsers neither prompt nor keep
credentials that other sites' pages could make them replay.
"""

from __future__ import annotations

import base64
import binascii
import enum
from typing import Any

from aiohttp import web

from core.auth import pattern_matches
from core.errors import AccessDenied, Unauthenticated
from core.model import INTERNAL_PREFIX, Action, Principal, ResourceKind

ANONYMOUS = Principal("anonymous")


class Access(enum.Enum):
    """What a route requires of its caller."""

    PUBLIC = "public"
    USER = "user"
    TOPIC = "topic"
    GROUP = "group"
    SUBSCRIBE = "subscribe"
    PUBLISH = "publish"
    SELF = "self"
    ADMIN = "admin"
    SESSION = "session"

    @property
    def describe(self) -> str:
        """One sentence for the OpenAPI document."""
        return {
            Access.PUBLIC: "No credentials needed.",
            Access.USER: "Any user; the answer lists only topics/groups the user has a "
                         "permission on (admins see everything).",
            Access.TOPIC: "An admin user, or a user with any permission matching the topic.",
            Access.GROUP: "An admin user, or a user with any permission matching the group.",
            Access.SUBSCRIBE: "An admin user, or a user with the subscribe right on the topic.",
            Access.PUBLISH: "Any user with the publish right on the subject (an admin, a topic "
                            "permission on its first level, or an access rule allowing it).",
            Access.SELF: "An admin user, or the user the path names, signed in with its "
                         "password (not with a bearer token).",
            Access.ADMIN: "An admin user.",
            Access.SESSION: "Your own browser session: signing in takes user and password in "
                            "the body; showing and ending it take the session cookie (ending "
                            "it, a write, also the X-CSRF-Token header).",
        }[self]


def bearer_token(request: web.Request) -> str | None:
    """The token of a Bearer Authorization header, None if the request sends no Bearer."""
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else None


QUERY_TOKEN = "access_token"
"""RFC 6750's URI query parameter for a bearer token."""
INGRESS_PREFIX = "/events/"


def query_token(request: web.Request) -> str | None:
    """An API token in the ``access_token`` query parameter of ``POST /events/...`` (RFC 6750,
    section 2.3), for event sources that cannot set headers, as Knative's PingSource; None
    elsewhere: no other route takes a token in its URL."""
    if request.method == "POST" and request.path.startswith(INGRESS_PREFIX):
        return request.query.get(QUERY_TOKEN)
    return None


def credentials(request: web.Request) -> tuple[str, str] | None:
    """The (user, password) of a Basic Authorization header, None if there is none."""
    header = request.headers.get("Authorization")
    if header is None:
        return None
    scheme, _, encoded = header.partition(" ")
    if scheme.lower() != "basic":
        raise Unauthenticated(f"the admin API takes HTTP Basic credentials or a Bearer API "
                              f"token, not {scheme!r}; send -u USER:PASSWORD (curl), "
                              "--user/--password (sluice) or Authorization: Bearer slt_...")
    try:
        user, sep, password = base64.b64decode(encoded.strip(), validate=True).decode().partition(":")
    except (binascii.Error, UnicodeDecodeError):
        sep = ""
    if not sep:
        raise Unauthenticated("the Basic Authorization header is malformed; it must be "
                              "base64 of USER:PASSWORD")
    return user, password


def may_read(principal: Principal, kind: ResourceKind, name: str) -> bool:
    """Whether ``principal`` may see topic or group ``name`` (admin, or any matching permission;
    internal topics, which hold the broker's own state, are for admins only)."""
    if principal.admin:
        return True
    if kind is ResourceKind.TOPIC and name.startswith(INTERNAL_PREFIX):
        return False
    return any(p.kind is kind and pattern_matches(p.pattern, name) for p in principal.permissions)


def check(principal: Principal, access: Access, request: web.Request, broker: Any) -> None:
    """Raise AccessDenied unless ``principal`` satisfies ``access`` for this request; ``broker``
    (the core facade) decides the subscribe right. Runs on the event loop; no I/O."""
    if access in (Access.PUBLIC, Access.USER, Access.SESSION, Access.PUBLISH) or principal.admin:
        return
    if access is Access.SELF:
        if request.match_info["user"] != principal.user:
            raise AccessDenied(f"user {principal.user!r} may manage only its own API tokens; "
                               "an admin manages every user's")
        return
    if access is Access.ADMIN:
        raise AccessDenied(f"user {principal.user!r} is not an admin; this call needs an admin "
                           "user (ask one to run `sluice user create NAME --superuser`)")
    if access is Access.SUBSCRIBE:
        topic = request.match_info["topic"]
        if not broker.allowed(principal, Action.SUBSCRIBE, topic):
            raise AccessDenied(
                f"user {principal.user!r} may not read messages of topic {topic!r}: that needs the "
                f"subscribe right; an admin can grant it with "
                f"`sluice user grant {principal.user} topic {topic} subscribe`")
        return
    kind = ResourceKind.TOPIC if access is Access.TOPIC else ResourceKind.GROUP
    name = request.match_info[kind.value]
    if not may_read(principal, kind, name):
        raise AccessDenied(
            f"user {principal.user!r} has no permission on {kind.value} {name!r}; an admin can "
            f"grant one with `sluice user grant {principal.user} {kind.value} {name} subscribe`")
