"""AMQP virtual hosts on the admin API: create, list and delete them, set and clear users'
permissions on them, list their exchanges, queues, bindings, connections and channels, and purge
or delete a queue (``core.vhost_admin``), as RabbitMQ's management API offers them.

A virtual host or queue name is one path segment: ``/`` is written ``%2F``, as RabbitMQ's API
writes it. Everything here is admin-only but ``GET /vhosts``, which shows any user the virtual
hosts it may open.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from core.model import Principal
from core.vhost_admin import VhostAdmin

from .errors import HttpProblem
from .handlers import body_of, deps, field


def vhost_admin(request: web.Request) -> VhostAdmin:
    """The virtual hosts the composition root gave the admin API."""
    admin = deps(request).vhosts
    if admin is None:
        raise HttpProblem(503, "unavailable", "this broker serves no AMQP virtual hosts")
    return admin


def _flag(request: web.Request, name: str) -> bool:
    return request.query.get(name, "").lower() in ("1", "true", "yes")


# --- virtual hosts and permissions ---

async def list_vhosts(request: web.Request, principal: Principal) -> list[dict[str, Any]]:
    """Every virtual host for an admin; for other users those they have a permission on."""
    admin = vhost_admin(request)
    return admin.list_vhosts(lambda vhost: admin.permissions.may_open(principal, vhost))


async def create_vhost(request: web.Request, principal: Principal) -> dict[str, Any]:
    body = await body_of(request)
    return await vhost_admin(request).add_vhost(field(body, "name", str))


async def delete_vhost(request: web.Request, principal: Principal) -> None:
    """Close its connections; delete it with its exchanges, queues, bindings and permissions."""
    await vhost_admin(request).delete_vhost(request.match_info["vhost"])


async def list_vhost_permissions(request: web.Request,
                                 principal: Principal) -> list[dict[str, str]]:
    """Every permission, optionally of ``?vhost=`` or ``?user=``."""
    query = request.query
    return [p.as_json() for p in vhost_admin(request).permissions.list(query.get("vhost"),
                                                                         query.get("user"))]


async def set_vhost_permission(request: web.Request, principal: Principal) -> dict[str, str]:
    """Set (or replace) a user's configure / write / read expressions on a virtual host."""
    body = await body_of(request)
    info = request.match_info
    permission = await vhost_admin(request).permit(
        info["user"], info["vhost"], field(body, "configure", str), field(body, "write", str),
        field(body, "read", str))
    return permission.as_json()


async def clear_vhost_permission(request: web.Request, principal: Principal) -> None:
    info = request.match_info
    await vhost_admin(request).unpermit(info["user"], info["vhost"])


# --- what is in them ---

async def list_exchanges(request: web.Request, principal: Principal) -> list[dict[str, Any]]:
    return vhost_admin(request).exchanges(request.query.get("vhost"))


async def list_queues(request: web.Request, principal: Principal) -> list[dict[str, Any]]:
    return vhost_admin(request).queues_of(request.query.get("vhost"))


async def show_queue(request: web.Request, principal: Principal) -> dict[str, Any]:
    info = request.match_info
    return vhost_admin(request).queue(info["vhost"], info["queue"])


async def purge_queue(request: web.Request, principal: Principal) -> dict[str, Any]:
    """Settle every ready message of a queue (nothing is deleted from the log)."""
    info = request.match_info
    return {"message_count": vhost_admin(request).purge(info["vhost"], info["queue"])}


async def delete_queue(request: web.Request, principal: Principal) -> dict[str, Any]:
    """Delete a queue (``?if_unused=true``, ``?if_empty=true`` as queue.delete has them)."""
    info = request.match_info
    ready = await vhost_admin(request).delete_queue(
        info["vhost"], info["queue"], if_unused=_flag(request, "if_unused"),
        if_empty=_flag(request, "if_empty"))
    return {"message_count": ready}


async def list_bindings(request: web.Request, principal: Principal) -> list[dict[str, Any]]:
    return vhost_admin(request).bindings(request.query.get("vhost"))


async def list_amqp_connections(request: web.Request,
                                principal: Principal) -> list[dict[str, Any]]:
    return vhost_admin(request).connections()


async def list_channels(request: web.Request, principal: Principal) -> list[dict[str, Any]]:
    return vhost_admin(request).channels()
