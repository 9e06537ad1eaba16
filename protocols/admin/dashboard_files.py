"""The live telemetry dashboard: its static files served as they are, from the directory the
composition root gives in ``AdminDeps.dashboard_dir`` (``analytics/dashboard``).

The page holds no data: its script asks for credentials, then reads the results topic through
``GET /topics/{topic}/tail`` (see ``tail.py``) and draws the charts in the browser. The page's
Content-Security-Policy lets it load only its own script and style sheet and talk only to this
server, so nothing injected into it (a topic name, a message body) can run or send data away.
"""

from __future__ import annotations


from aiohttp import web

from core.model import Principal

from .errors import HttpProblem
from .handlers import deps

ASSETS = {"dashboard.js": "text/javascript", "dashboard.css": "text/css"}
PAGE_CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src data:; "
            "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
"""Own script and styles only (no inline code), fetches to this server only, the empty icon."""


async def page(request: web.Request, principal: Principal) -> web.StreamResponse:
    response = _file(request, "index.html", "text/html")
    response.headers["Content-Security-Policy"] = PAGE_CSP
    return response


async def asset(request: web.Request, principal: Principal) -> web.StreamResponse:
    name = request.match_info["asset"]
    if name not in ASSETS:
        raise HttpProblem(404, "not_found", f"the dashboard has no file {name!r}; it has "
                          f"{', '.join(sorted(ASSETS))}")
    return _file(request, name, ASSETS[name])


def _file(request: web.Request, name: str, content_type: str) -> web.Response:
    directory = deps(request).dashboard_dir
    if directory is None:
        raise HttpProblem(404, "not_found", "this server has no dashboard")
    return web.Response(body=(directory / name).read_bytes(), content_type=content_type,
                        charset="utf-8", headers={"Cache-Control": "no-cache"})
