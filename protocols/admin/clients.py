"""``/clients``: list connected clients and kept sessions of every protocol, show one, kick one.

Answers come from core's ``ClientDirectory``, which gathers each adapter's view. A kick ends the
connection the way the protocol says an administrator does (MQTT 5: DISCONNECT 0x98
Administrative action); the session stays as the protocol keeps it. Each connection's message
totals and rates (the overview sampler turns its counts into rates every few seconds) are row
fields, so the list sorts by them. Admin only: a client list names other users and their
addresses.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from aiohttp import web

from core.clients import ClientDirectory, ClientView
from core.model import Principal

from .errors import HttpProblem
from .handlers import deps, plain


def client_directory(request: web.Request) -> ClientDirectory:
    """The directory the composition root gave the admin API."""
    directory = deps(request).clients
    if directory is None:
        raise HttpProblem(503, "unavailable", "this broker lists no clients (no protocol "
                          "listener reports them)")
    return directory


def client_json(view: ClientView) -> dict[str, Any]:
    """A client as the API shows it: its connection's totals and rates are null for a session
    kept without one."""
    row = {f.name: plain(getattr(view, f.name)) for f in fields(view) if f.name != "counters"}
    counters = view.counters
    return row | {
        "subscriptions": list(view.subscriptions),
        "published": counters.published if counters else None,
        "delivered": counters.delivered if counters else None,
        "publish_rate": counters.publish_rate if counters else None,
        "deliver_rate": counters.deliver_rate if counters else None}


async def list_clients(request: web.Request, principal: Principal) -> list[dict[str, Any]]:
    """Connected clients and kept sessions, optionally of ``?protocol=`` or ``?user=``."""
    query = request.query
    views = client_directory(request).list(query.get("protocol"), query.get("user"))
    if query.get("connected") in ("true", "1"):
        views = [v for v in views if v.connected]
    return [client_json(v) for v in views]


async def show_client(request: web.Request, principal: Principal) -> dict[str, Any]:
    """One client with its subscriptions and protocol details."""
    info = request.match_info
    return client_json(client_directory(request).get(info["protocol"], info["client_id"]))


async def kick_client(request: web.Request, principal: Principal) -> None:
    """Disconnect one client now."""
    info = request.match_info
    client_directory(request).kick(info["protocol"], info["client_id"])
