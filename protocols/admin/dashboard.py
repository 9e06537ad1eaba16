"""The live telemetry dashboard: static files from ``analytics/dashboard`` served as they are.

The page holds no data: its script asks for credentials, then reads the results topic through
``GET /topics/{topic}/tail`` (see ``tail.py``) and draws the charts in the browser. The page's
Content-Security-Policy lets it load only its own script and style sheet and talk only to this
server, so nothing injected into it (a topic name, a message body) can run or send data away.
"""

from __future__ import annotations

from pathlib import Path

from aiohttp import web

import analytics
from core.model import Principal

from .errors import HttpProblem

DASHBOARD_DIR = Path(analytics.__file__).resolve().parent / "dashboard"
ASSETS = {"dashboard.js": "text/javascript", "dashboard.css": "text/css"}
PAGE_CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src data:; "
            "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
"""Own script and styles only (no inline code), fetches to this server only, the empty icon."""


async def page(request: web.Request, principal: Principal) -> web.StreamResponse:
    response = _file("index.html", "text/html")
    response.headers["Content-Security-Policy"] = PAGE_CSP
    return response


async def asset(request: web.Request, principal: Principal) -> web.StreamResponse:
    name = request.match_info["asset"]
    if name not in ASSETS:
        raise HttpProblem(404, "not_found", f"the dashboard has no file {name!r}; it has "
                          f"{', '.join(sorted(ASSETS))}")
    return _file(name, ASSETS[name])


def _file(name: str, content_type: str) -> web.Response:
    return web.Response(body=(DASHBOARD_DIR / name).read_bytes(), content_type=content_type,
                        charset="utf-8", headers={"Cache-Control": "no-cache"})
