"""The web console's static files: ``protocols/admin/console`` served as they are.

The page holds no data: it signs in with ``POST /session`` and reads everything else through
the admin API, so its files are public. Only files that exist in the console directory (or its
``vendor`` directory) with a known type are served; a name is one path segment, never ``..``
or hidden, so nothing else on the disk is reachable. The page's Content-Security-Policy lets
it load only its own modules and style sheets and talk only to this server.
"""

from __future__ import annotations

from pathlib import Path

from aiohttp import web

from core.model import Principal

from .errors import HttpProblem

CONSOLE_DIR = Path(__file__).resolve().parent / "console"
CONTENT_TYPES = {".html": "text/html", ".js": "text/javascript", ".mjs": "text/javascript",
                 ".css": "text/css"}
PAGE_CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
            "connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
"""Own modules and style sheets only (no inline code), fetches to this server only."""


async def console_page(request: web.Request, principal: Principal) -> web.StreamResponse:
    """The console's page."""
    return _serve(CONSOLE_DIR, "index.html")


async def console_asset(request: web.Request, principal: Principal) -> web.StreamResponse:
    """One of the console's modules or style sheets."""
    return _serve(CONSOLE_DIR, request.match_info["file"])


async def console_vendor_asset(request: web.Request, principal: Principal) -> web.StreamResponse:
    """One of the libraries the console loads (preact, htm, uPlot)."""
    return _serve(CONSOLE_DIR / "vendor", request.match_info["file"])


def console_file(directory: Path, name: str) -> Path:
    """The file ``name`` directly in ``directory``; HttpProblem 404 unless it exists there and
    has a type the console serves."""
    path = (directory / name).resolve()
    if (name.startswith(".") or "/" in name or "\\" in name or path.parent != directory.resolve()
            or path.suffix not in CONTENT_TYPES or not path.is_file()):
        raise HttpProblem(404, "not_found", f"the console has no file {name!r}; open /console")
    return path


def _serve(directory: Path, name: str) -> web.Response:
    path = console_file(directory, name)
    response = web.Response(body=path.read_bytes(), content_type=CONTENT_TYPES[path.suffix],
                            charset="utf-8", headers={"Cache-Control": "no-cache"})
    if path.suffix == ".html":
        response.headers["Content-Security-Policy"] = PAGE_CSP
    return response
