"""What keeps a browser from being turned against the admin API, and bounds what a request costs.

A page on any site can make a browser send requests to ``127.0.0.1:8080`` (cross-site request
forgery). Such a page cannot read the answers, set an ``Authorization`` header or send JSON as
``application/json`` without the browser asking first (CORS preflight, which the API never
grants), so three rules close the door:

- writes (every method but GET/HEAD/OPTIONS) that carry an ``Origin`` other than this server's,
  or a ``Sec-Fetch-Site`` other than ``same-origin``/``none``, are refused before
  authentication; the CLI and curl send neither header;
- request bodies are JSON sent as ``Content-Type: application/json`` only (a form or a
  ``text/plain`` fetch is a 415), at most ``MAX_BODY_BYTES``;
- no response asks for Basic credentials (see ``errors.error_response``).

Every response also carries headers that stop content sniffing, framing and referrer leaks; the
dashboard page sets its own Content-Security-Policy, everything else forbids all content.
"""

from __future__ import annotations

import logging
from urllib.parse import urlsplit

from aiohttp import web

from core.untrusted import DenialLog, clip
from protocols import relayed_peers

from .errors import HttpProblem

MAX_BODY_BYTES = 64 * 1024
"""The largest request body the API reads; its bodies are small JSON objects."""

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
SAME_ORIGIN_FETCHES = frozenset({"same-origin", "none"})
JSON = "application/json"

SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
}
API_CSP = "default-src 'none'; frame-ancestors 'none'"
"""The Content-Security-Policy of every response but the dashboard page: JSON and text need
nothing, and nothing may frame them."""

log = logging.getLogger(__name__)
_denials = DenialLog(log)


def check_same_origin(request: web.Request) -> None:
    """Refuse (403) a write that a page of another origin made. Runs on the event loop."""
    if request.method in SAFE_METHODS:
        return
    fetch_site = request.headers.get("Sec-Fetch-Site")
    origin = request.headers.get("Origin")
    own = request.host.lower()
    if fetch_site is not None and fetch_site.lower() not in SAME_ORIGIN_FETCHES:
        source = f"a {fetch_site} page"
    elif origin is not None and _authority(origin) != own:
        source = f"origin {origin}"
    else:
        return
    _denials.denied(relayed_peers.remote(request) or "?", "cross-origin admin write",
                    "admin API refused %s %s from %s (remote %s): writes come only from the "
                    "API's own origin", request.method, clip(request.path), clip(source),
                    relayed_peers.remote(request))
    raise HttpProblem(403, "cross_origin", f"{request.method} refused: it came from {clip(source)}, "
                      f"and the admin API takes writes only from its own origin ({own}); use the "
                      "`sluice` CLI or curl, which send no Origin header")


def _authority(origin: str) -> str | None:
    """``host[:port]`` of an Origin header, lower case; None for ``null`` or garbage."""
    try:
        parts = urlsplit(origin.strip())
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return None
    return parts.netloc.lower()


def require_json(request: web.Request) -> None:
    """Refuse (415) a request body not sent as ``application/json``. Runs on the event loop."""
    if request.content_type != JSON:
        sent = request.headers.get("Content-Type")
        raise HttpProblem(415, "unsupported_media_type",
                          f"the request body must be JSON sent with Content-Type: {JSON}; this "
                          f"request sent {f'Content-Type {clip(sent)}' if sent else 'none'}")


async def add_security_headers(request: web.Request, response: web.StreamResponse) -> None:
    """``on_response_prepare``: the headers every response carries, set before any is sent."""
    response.headers.update(SECURITY_HEADERS)
    response.headers.setdefault("Content-Security-Policy", API_CSP)
