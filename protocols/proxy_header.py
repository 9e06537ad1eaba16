"""The PROXY protocol, version 1 (HAProxy's text header): how a relay tells the server behind it
which client a connection comes from.

A relaying cluster node opens each connection to the leader with one line,

    PROXY TCP4 <client ip> <relay ip> <client port> <relay port>\\r\\n

(``TCP6`` for IPv6, ``UNKNOWN`` when the relay does not know), at most 107 bytes. A listener
accepts the header only from peers it trusts (the group's own nodes); anyone else sending it is
an ordinary client whose first bytes are garbage to its protocol.
"""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass

PREFIX = b"PROXY "
MAX_LINE = 107
"""Longest valid header, CRLF included (the specification's bound)."""


class ProxyHeaderError(ValueError):
    """A PROXY header that does not parse; the connection is closed."""


@dataclass(frozen=True)
class ProxiedAddress:
    """The client a relayed connection comes from (None: the relay did not know)."""

    host: str | None
    port: int | None


def encode(client: tuple[str, int] | None, relay: tuple[str, int] | None) -> bytes:
    """The header for a connection from ``client`` arriving at the relay on ``relay``."""
    if client is None or relay is None:
        return b"PROXY UNKNOWN\r\n"
    family = "TCP6" if ipaddress.ip_address(client[0]).version == 6 else "TCP4"
    return f"PROXY {family} {client[0]} {relay[0]} {client[1]} {relay[1]}\r\n".encode("ascii")


def decode(line: bytes) -> ProxiedAddress:
    """Parse one header line (CRLF included)."""
    if len(line) > MAX_LINE or not line.startswith(PREFIX) or not line.endswith(b"\r\n"):
        raise ProxyHeaderError("not a PROXY v1 header line")
    try:
        fields = line[:-2].decode("ascii").split(" ")
    except UnicodeDecodeError:
        raise ProxyHeaderError("a PROXY header that is not ASCII") from None
    if len(fields) > 1 and fields[1] == "UNKNOWN":
        return ProxiedAddress(None, None)
    if len(fields) != 6 or fields[1] not in ("TCP4", "TCP6"):
        raise ProxyHeaderError("a PROXY header needs TCP4|TCP6, two addresses and two ports")
    _, family, source, destination, source_port, destination_port = fields
    version = 4 if family == "TCP4" else 6
    try:
        addresses_fit = all(ipaddress.ip_address(a).version == version for a in (source, destination))
    except ValueError:
        addresses_fit = False
    ports_fit = all(port.isascii() and port.isdigit() and int(port) <= 65535 and str(int(port)) == port
                    for port in (source_port, destination_port))
    if not (addresses_fit and ports_fit):
        raise ProxyHeaderError(f"a PROXY header with a bad {family} address or port")
    return ProxiedAddress(source, int(source_port))


def header_length(data: bytes) -> int | None:
    """Bytes of the header at the start of ``data`` (CRLF included), None while more are needed;
    raises ProxyHeaderError if ``data`` cannot start with one."""
    if not PREFIX.startswith(data[:len(PREFIX)]):
        raise ProxyHeaderError("not a PROXY v1 header")
    end = data.find(b"\r\n", 0, MAX_LINE)
    if end >= 0:
        return end + 2
    if len(data) >= MAX_LINE:
        raise ProxyHeaderError(f"a PROXY header longer than {MAX_LINE} bytes")
    return None
