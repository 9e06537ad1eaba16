"""Who may call what on the admin API: HTTP Basic authentication and one access rule per route.

The rule, kept deliberately simple:

- ``PUBLIC``: no credentials (``/health``, ``/metrics``, ``/openapi.json``), so probes and
  Prometheus scrape without a password.
- ``USER``: any authenticated user; lists show only what the user may read.
- ``TOPIC``/``GROUP``: reading one topic or group (and its messages) needs an admin user or any
  permission whose pattern matches that topic or group name.
- ``ADMIN``: every write, and everything about users and permissions.
"""

from __future__ import annotations

import base64
import binascii
import enum
from aiohttp import web

from core.auth import pattern_matches
from core.errors import AccessDenied, Unauthenticated
from core.model import Principal, ResourceKind

ANONYMOUS = Principal("anonymous")


class Access(enum.Enum):
    """What a route requires of its caller."""

    PUBLIC = "public"
    USER = "user"
    TOPIC = "topic"
    GROUP = "group"
    ADMIN = "admin"

    @property
    def describe(self) -> str:
        """One sentence for the OpenAPI document."""
        return {
            Access.PUBLIC: "No credentials needed.",
            Access.USER: "Any user; the answer lists only topics/groups the user has a "
                         "permission on (admins see everything).",
            Access.TOPIC: "An admin user, or a user with any permission matching the topic.",
            Access.GROUP: "An admin user, or a user with any permission matching the group.",
            Access.ADMIN: "An admin user.",
        }[self]


def credentials(request: web.Request) -> tuple[str, str] | None:
    """The (user, password) of a Basic Authorization header, None if there is none."""
    header = request.headers.get("Authorization")
    if header is None:
        return None
    scheme, _, encoded = header.partition(" ")
    if scheme.lower() != "basic":
        raise Unauthenticated(f"the admin API takes HTTP Basic credentials, not {scheme!r}; "
                              "send -u USER:PASSWORD (curl) or --user/--password (sluice)")
    try:
        user, sep, password = base64.b64decode(encoded.strip(), validate=True).decode().partition(":")
    except (binascii.Error, UnicodeDecodeError):
        sep = ""
    if not sep:
        raise Unauthenticated("the Basic Authorization header is malformed; it must be "
                              "base64 of USER:PASSWORD")
    return user, password


def may_read(principal: Principal, kind: ResourceKind, name: str) -> bool:
    """Whether ``principal`` may see topic or group ``name`` (admin, or any matching permission)."""
    return principal.admin or any(p.kind is kind and pattern_matches(p.pattern, name)
                                  for p in principal.permissions)


def check(principal: Principal, access: Access, request: web.Request) -> None:
    """Raise AccessDenied unless ``principal`` satisfies ``access`` for this request."""
    if access in (Access.PUBLIC, Access.USER) or principal.admin:
        return
    if access is Access.ADMIN:
        raise AccessDenied(f"user {principal.user!r} is not an admin; this call needs an admin "
                           "user (ask one to run `sluice user create NAME --superuser`)")
    kind = ResourceKind.TOPIC if access is Access.TOPIC else ResourceKind.GROUP
    name = request.match_info[kind.value]
    if not may_read(principal, kind, name):
        raise AccessDenied(
            f"user {principal.user!r} has no permission on {kind.value} {name!r}; an admin can "
            f"grant one with `sluice user grant {principal.user} {kind.value} {name} subscribe`")
