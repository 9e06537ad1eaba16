"""``/push-subscriptions``: create, list, show, pause, resume and delete push subscriptions
(``core.push_subscriptions``), each shown with its delivery stats.

Any user may create one on a topic it may subscribe to; it sees and changes only its own (an
admin all of them); another user's is a 404, so names do not leak. The signing secret is in
the answer to the create only.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from core.model import Principal
from core.push_model import PushSubscription

from .errors import HttpProblem
from .handlers import body_of, deps


def _engine(request: web.Request) -> Any:
    engine = deps(request).push
    if engine is None:
        raise HttpProblem(501, "not_supported", "this broker runs without push subscriptions")
    return engine


def _shown(engine: Any, subscription: PushSubscription) -> dict[str, Any]:
    return subscription.to_json() | {"stats": engine.stats(subscription.name).to_json()}


async def list_push_subscriptions(request: web.Request, principal: Principal) -> list[dict[str, Any]]:
    """The caller's subscriptions (an admin's: all), each with its stats."""
    engine = _engine(request)
    return [_shown(engine, s) for s in engine.registry.visible(principal)]


async def create_push_subscription(request: web.Request, principal: Principal) -> dict[str, Any]:
    """Create a subscription owned by the caller; the answer holds its signing secret, once."""
    engine = _engine(request)
    subscription, secret = await engine.registry.create(principal, await body_of(request))
    return _shown(engine, subscription) | {"secret": secret}


async def show_push_subscription(request: web.Request, principal: Principal) -> dict[str, Any]:
    """One subscription with its stats."""
    engine = _engine(request)
    return _shown(engine, engine.registry.get(principal, request.match_info["name"]))


async def pause_push_subscription(request: web.Request, principal: Principal) -> dict[str, Any]:
    """Stop popping new messages until resumed (the position is kept)."""
    engine = _engine(request)
    return _shown(engine, await engine.registry.set_paused(principal, request.match_info["name"], True))


async def resume_push_subscription(request: web.Request, principal: Principal) -> dict[str, Any]:
    """Deliver again from where the subscription stopped."""
    engine = _engine(request)
    return _shown(engine, await engine.registry.set_paused(principal, request.match_info["name"], False))


async def delete_push_subscription(request: web.Request, principal: Principal) -> None:
    """Stop and delete a subscription and its position."""
    await _engine(request).registry.delete(principal, request.match_info["name"])
