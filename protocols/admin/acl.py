"""``/acl``: list, add and remove access-control rules on MQTT topics (``core.acl``).

A rule allows or denies publish and/or subscribe on subjects matching an MQTT topic filter
(``%u`` the user name, ``%c`` the client id), for one user or, with user ``*``, for everyone.
Changes apply at once: connections lose what a rule no longer allows. Admin only.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from core.acl import EVERYONE
from core.errors import NotFound
from core.model import AclRule, Action, Principal

from .errors import HttpProblem
from .handlers import blocking, body_of, enum_value, field, users

_EFFECTS = {"allow": True, "deny": False}


def rule_json(rule: AclRule) -> dict[str, Any]:
    """A rule as the API shows it."""
    return {"user": rule.user, "pattern": rule.pattern,
            "actions": sorted(a.value for a in rule.actions),
            "effect": "allow" if rule.allow else "deny"}


def _effect(raw: str) -> bool:
    if raw not in _EFFECTS:
        raise HttpProblem(400, "invalid_field", f"effect must be allow or deny, not {raw[:40]!r}")
    return _EFFECTS[raw]


async def list_rules(request: web.Request, principal: Principal) -> list[dict[str, Any]]:
    """Every rule, or (``?user=NAME``) those that apply to one user: its own and everyone's."""
    return [rule_json(r) for r in await blocking(users(request).rules, request.query.get("user"))]


async def add_rule(request: web.Request, principal: Principal) -> dict[str, Any]:
    """Add a rule, or replace the actions of the rule with the same user, pattern and effect."""
    body = await body_of(request)
    actions = field(body, "actions", list)
    if not actions:
        raise HttpProblem(400, "invalid_field", "field 'actions' must list publish and/or subscribe")
    rule = AclRule(field(body, "user", str, EVERYONE), field(body, "pattern", str),
                   frozenset(enum_value(Action, str(a), "action") for a in actions),
                   _effect(field(body, "effect", str)))
    await blocking(users(request).put_rule, rule)
    return rule_json(rule)


async def remove_rule(request: web.Request, principal: Principal) -> None:
    """Remove the rule of ``?user=`` (default everyone) with ``?pattern=`` and ``?effect=``."""
    query = request.query
    if "pattern" not in query or "effect" not in query:
        raise HttpProblem(400, "missing_query", "pass ?pattern=PATTERN&effect=allow|deny "
                          "(and &user=NAME for a user's own rule)")
    user = query.get("user", EVERYONE)
    if not await blocking(users(request).delete_rule, user, query["pattern"], _effect(query["effect"])):
        raise NotFound(f"there is no {query['effect']} rule on {query['pattern'][:200]!r} for "
                       f"{'everyone' if user == EVERYONE else repr(user)}; `sluice acl list` "
                       "shows every rule")
