"""Connect-time sink checks (``core.sink_policy``): an aiohttp resolver that refuses a host name
resolving to an address the policy refuses, and the check of literal addresses, which aiohttp
connects to without resolving."""

from __future__ import annotations

import ipaddress
import socket
from typing import Any

from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver

from core.sink_policy import SinkPolicy, refusal


class SinkRefused(OSError):
    """The sink's address is not allowed; the message names the setting that allows it."""


class GuardedResolver(AbstractResolver):
    """Resolves like aiohttp's default resolver, then refuses when any address is not allowed
    (all of them are checked: a connection may go to any)."""

    def __init__(self, policy: SinkPolicy) -> None:
        self._policy = policy
        self._resolver = DefaultResolver()

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        found = await self._resolver.resolve(host, port, family)
        if not self._policy.host_listed(host):
            for entry in found:
                if not self._policy.address_allowed(entry["host"]):
                    raise SinkRefused(refusal(entry["host"], host))
        return found

    async def close(self) -> None:
        await self._resolver.close()


def literal_refusal(policy: SinkPolicy, host: str) -> str:
    """Why the policy refuses ``host`` when it is a literal address; '' when it is allowed or
    a host name (checked by ``GuardedResolver`` on every address it resolves to)."""
    try:
        address: Any = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return ""
    return "" if policy.address_allowed(address) else refusal(str(address))
