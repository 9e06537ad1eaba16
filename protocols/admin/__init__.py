"""The admin HTTP API (aiohttp): topics, groups, messages, users, health, metrics, OpenAPI."""

from .handlers import AdminDeps
from .server import AdminServer, build_app, start_admin_server

__all__ = ["AdminDeps", "AdminServer", "build_app", "start_admin_server"]
