"""Which addresses push subscriptions may send to (server-side request forgery safety).

A push sink is a URL a user chooses and the broker requests, so without a rule any user could
make the broker reach what only the broker can: the host itself, the private network, a cloud
metadata service (169.254.169.254). Only public (globally routable, not multicast) addresses are
allowed, unless ``push.allowed_sinks`` lists the address (a CIDR) or the sink's host name. The
check is made on the literal address when a subscription is created and on every address a
host name resolves to when the broker connects. Pure: no I/O.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass

from .errors import InvalidArgument
from .untrusted import clip

SETTING = "push.allowed_sinks (SLUICE_PUSH_ALLOWED_SINKS)"
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True)
class SinkPolicy:
    """The allow-list: networks any sink may be in, and host names allowed whatever they resolve to."""

    networks: tuple[Network, ...] = ()
    hosts: frozenset[str] = frozenset()

    @classmethod
    def parse(cls, entries: str | Iterable[str]) -> SinkPolicy:
        """The policy of comma-separated CIDRs (or single addresses) and host names; ValueError
        naming the entry that is neither."""
        items = entries.split(",") if isinstance(entries, str) else list(entries)
        networks: list[Network] = []
        hosts: set[str] = set()
        for raw in items:
            entry = raw.strip()
            if not entry:
                continue
            try:
                networks.append(ipaddress.ip_network(entry, strict=False))
                continue
            except ValueError:
                pass
            name = entry.lower().rstrip(".")
            if not _host_name(name):
                raise ValueError(f"{SETTING}: {clip(entry)} is neither a CIDR (10.0.0.0/8, "
                                 "127.0.0.1) nor a host name (hooks.example.com)")
            hosts.add(name)
        return cls(tuple(networks), frozenset(hosts))

    def host_listed(self, host: str) -> bool:
        """Whether the sink host name itself is on the list (then every address it resolves to is allowed)."""
        return host.lower().rstrip(".") in self.hosts

    def address_allowed(self, address: str | Address) -> bool:
        """Whether the broker may connect to ``address``: public, or inside a listed network."""
        ip = ipaddress.ip_address(address) if isinstance(address, str) else address
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        if any(ip.version == net.version and ip in net for net in self.networks):
            return True
        return ip.is_global and not ip.is_multicast

    def check_sink_host(self, host: str) -> None:
        """InvalidArgument, naming the setting, when ``host`` is a literal address not allowed."""
        try:
            ip = ipaddress.ip_address(host.strip("[]"))
        except ValueError:
            return  # a host name: decided on each address it resolves to, at connect time
        if not self.address_allowed(ip):
            raise InvalidArgument(refusal(str(ip)))


def refusal(address: str, host: str = "") -> str:
    """Why a sink address is refused, and what the operator may change."""
    named = f"{clip(host)} resolves to {address}, which" if host else f"address {address}"
    return (f"sink {named} is not public (loopback, private, link-local, metadata or multicast), "
            f"so the broker refuses to send there; an operator may allow it by listing the "
            f"network or the host name in {SETTING}")


def _host_name(name: str) -> bool:
    labels = name.split(".")
    return 0 < len(name) <= 253 and all(
        0 < len(label) <= 63 and label.replace("-", "").isalnum() and label.isascii()
        for label in labels)
