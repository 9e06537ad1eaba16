"""The admin HTTP server: registers ``routes.ROUTES`` on aiohttp, guards them, maps errors.

Every request first passes ``guards.py`` (cross-origin writes refused, bodies bounded, security
headers on every response). Every route's handler is wrapped once: check the body's media type,
authenticate (HTTP Basic, checked and throttled by core's ``Broker.authenticate``, a user's
API token as a Bearer, ``tokens.py``, or a browser session's cookie with its CSRF token on
writes, ``sessions.py``), check the route's access rule,
run the handler, encode JSON. Errors, including aiohttp's own 404/405,
leave as JSON bodies through ``errors.py``.
"""

from __future__ import annotations

import json
import logging
import ssl
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from core.errors import Unauthenticated
from core.model import Principal
from core.untrusted import clip
from protocols import relayed_peers

from . import access, guards, history, paging, sessions, tokens
from .errors import HttpProblem, error_response
from .handlers import DEPS, AdminDeps
from .metrics import METRICS, AdminMetrics
from .openapi import RAW_BODIES, SCHEMAS
from .routes import ROUTES, Route
from .tail import TAILS, close_tails

log = logging.getLogger(__name__)


def build_app(deps: AdminDeps) -> web.Application:
    """The aiohttp application serving exactly ``ROUTES``."""
    app = web.Application(middlewares=[_errors_and_counts, _same_origin_writes],
                          client_max_size=guards.MAX_BODY_BYTES)
    app.on_response_prepare.append(guards.add_security_headers)
    app[DEPS] = deps
    app[METRICS] = AdminMetrics(deps)
    app[TAILS] = set()
    app[sessions.SESSIONS] = sessions.table_for(deps)
    history.install(app)
    app.on_shutdown.append(close_tails)
    for route in ROUTES:
        app.router.add_route(route.method, route.path, _guarded(route), name=route.operation_id)
    return app


def _guarded(route: Route) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    sort_fields = paging.sortable(SCHEMAS[route.response.strip("[]")]) if route.search else ()

    async def handle(request: web.Request) -> web.StreamResponse:
        if route.body is not None and route.body not in RAW_BODIES:
            guards.require_json(request)
        principal = access.ANONYMOUS
        if route.access not in (access.Access.PUBLIC, access.Access.SESSION):
            principal = await _authenticate(request)
            access.check(principal, route.access, request, request.app[DEPS].broker)
        page = paging.parse(request.query, route.search, sort_fields) if route.search else None
        result = await route.handler(request, principal)
        if isinstance(result, web.StreamResponse):
            return result
        if route.status == 204:
            return web.Response(status=204)
        headers = {}
        if page is not None:
            total, result = page.apply(result)
            headers[paging.TOTAL_HEADER] = str(total)
        return web.json_response(result, status=route.status, headers=headers, dumps=_dumps)

    handle.__name__ = route.operation_id
    return handle


async def _authenticate(request: web.Request) -> Principal:
    token = access.bearer_token(request) or access.query_token(request)
    if token is not None:
        return await tokens.authenticate(request, token)
    given = access.credentials(request)
    if given is None:
        token = request.cookies.get(sessions.COOKIE)
        if token is not None:
            return (await sessions.principal_of(request, token))[0]
        raise Unauthenticated("this call needs a user: send HTTP Basic credentials (the first "
                              "start creates sluice/sluice), or sign in with POST /session")
    user, password = given
    return await request.app[DEPS].broker.authenticate(user, password, relayed_peers.remote(request))


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


@web.middleware
async def _errors_and_counts(request: web.Request,
                             handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
                             ) -> web.StreamResponse:
    try:
        response = await handler(request)
    except web.HTTPException as http:
        response = _http_error(request, http)
    except Exception as error:  # every error leaves as JSON; unexpected ones are logged too
        if not isinstance(error, HttpProblem) and error_response(error).status == 500:
            log.exception("admin API %s %s failed", request.method, clip(request.path))
        response = error_response(error)
    resource = request.match_info.route.resource
    route = resource.canonical if resource is not None else "unmatched"
    request.app[METRICS].requests.labels(request.method, route, str(response.status)).inc()
    return response


@web.middleware
async def _same_origin_writes(request: web.Request,
                              handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
                              ) -> web.StreamResponse:
    guards.check_same_origin(request)
    return await handler(request)


def _http_error(request: web.Request, http: web.HTTPException) -> web.StreamResponse:
    if http.status == 404:
        message = (f"no such endpoint {request.path}; GET /openapi.json lists every endpoint")
    elif http.status == 413:
        message = (f"the request body is larger than {guards.MAX_BODY_BYTES} bytes; the admin API "
                   "takes small JSON objects")
    elif http.status == 405:
        message = (f"{request.method} is not allowed on {request.path}; allowed: "
                   f"{', '.join(sorted(getattr(http, 'allowed_methods', ())))}")
    else:
        message = http.text or http.reason
    return web.json_response({"error": http.reason.lower().replace(" ", "_"), "message": message},
                             status=http.status)


class AdminServer:
    """A running admin HTTP server."""

    def __init__(self, runner: web.AppRunner, host: str, port: int, secure: bool = False) -> None:
        self._runner = runner
        self.host = host
        self.port = port
        self.secure = secure
        """Whether it serves HTTPS."""

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'https' if self.secure else 'http'}://{host}:{self.port}"

    async def stop(self) -> None:
        """Stop accepting, finish requests in progress, release the port."""
        await self._runner.cleanup()


async def start_admin_server(deps: AdminDeps, host: str, port: int,
                             ssl_context: ssl.SSLContext | None = None) -> AdminServer:
    """Serve the admin API on ``host:port`` (0 picks a free port), over HTTPS with
    ``ssl_context``; OSError if it cannot bind."""
    runner = web.AppRunner(build_app(deps), access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, port, reuse_address=True, ssl_context=ssl_context)
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    return AdminServer(runner, host, runner.addresses[0][1], ssl_context is not None)
