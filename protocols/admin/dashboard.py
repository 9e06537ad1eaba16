"""The live telemetry dashboard: static files from ``analytics/dashboard`` served as they are.

The page holds no data: its script asks for credentials, then reads the results topic through
``GET /topics/{topic}/tail`` (see ``tail.py``) and draws the charts in the browser.
"""

from __future__ import annotations

from pathlib import Path

from aiohttp import web

import analytics
from core.model import Principal

from .errors import HttpProblem

DASHBOARD_DIR = Path(analytics.__file__).resolve().parent / "dashboard"
ASSETS = {"dashboard.js": "text/javascript", "dashboard.css": "text/css"}


async def page(request: web.Request, principal: Principal) -> web.StreamResponse:
    return _file("index.html", "text/html")


async def asset(request: web.Request, principal: Principal) -> web.StreamResponse:
    name = request.match_info["asset"]
    if name not in ASSETS:
        raise HttpProblem(404, "not_found", f"the dashboard has no file {name!r}; it has "
                          f"{', '.join(sorted(ASSETS))}")
    return _file(name, ASSETS[name])


def _file(name: str, content_type: str) -> web.Response:
    return web.Response(body=(DASHBOARD_DIR / name).read_bytes(), content_type=content_type,
                        charset="utf-8", headers={"Cache-Control": "no-cache"})
