"""``/mqtt/retained``: the MQTT retained messages by topic (admin only: topics name others' data).

The rows come from the MQTT adapter's in-memory table of retained messages
(``protocols.mqtt.retained``); ``?prefix=`` keeps the topics that start with it, and the route
is paged like every list (``paging.py``). Bodies are not listed: reading one needs the subscribe
right, through the message routes.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from core.model import Principal

from .errors import HttpProblem
from .handlers import deps

MAX_PREFIX_CHARS = 1024


async def list_retained(request: web.Request, principal: Principal) -> list[dict[str, Any]]:
    """Retained messages whose topic starts with ``?prefix=``, by topic."""
    retained = deps(request).retained
    if retained is None:
        raise HttpProblem(503, "unavailable", "this broker serves no MQTT, so it keeps no "
                          "retained messages")
    prefix = request.query.get("prefix", "")
    if len(prefix) > MAX_PREFIX_CHARS:
        raise HttpProblem(400, "invalid_query", f"prefix is {len(prefix)} characters long; "
                          f"topics have at most {MAX_PREFIX_CHARS} here")
    return [{"topic": topic, "size": size, "qos": qos, "stored_ms": stored_ms}
            for topic, size, qos, stored_ms in retained.listing(prefix)]
