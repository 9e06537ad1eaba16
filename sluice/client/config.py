"""Client configuration: where the broker is, who the client is, and how long to wait.

Plain data, no I/O: a config can be built on a Spark driver and shipped to executors.
"""

from __future__ import annotations

import itertools
import os
import socket
import time
from dataclasses import dataclass
from functools import cache
from importlib import metadata

_client_index = itertools.count()
_BASE36 = "0123456789abcdefghijklmnopqrstuvwxyz"


@cache
def sdk_version() -> str:
    """The installed Sluice version, sent to the broker as the client version."""
    try:
        return metadata.version("sluice")
    except metadata.PackageNotFoundError:  # shipped as plain files, e.g. to Spark executors
        return "unknown"


def _base36(n: int) -> str:
    digits = []
    while True:
        n, r = divmod(n, 36)
        digits.append(_BASE36[r])
        if not n:
            return "".join(reversed(digits))


def new_client_id() -> str:
    """A fresh client id, ``hostname@pid@index@base36(time_ns)`` as the official clients make it."""
    return f"{socket.gethostname()}@{os.getpid()}@{next(_client_index)}@{_base36(time.time_ns())}"


def split_endpoint(endpoint: str) -> tuple[str, int]:
    """``("host", port)`` from ``"host:port"`` or ``"[v6addr]:port"``; ValueError if malformed."""
    host, sep, port = endpoint.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"endpoint {endpoint!r} is not 'host:port' (IPv6 as '[addr]:port')")
    return host, int(port)


@dataclass(frozen=True)
class ClientConfig:
    """How a client reaches the broker. Durations are in seconds.

    ``client_id`` empty (the default) gives every client built from this config its own id;
    set it only to make one client recognisable across restarts.
    """

    endpoint: str = "127.0.0.1:8081"
    """``host:port``, or several separated by commas (the nodes of a cluster): the client uses
    the first and moves on to the next whenever the one it uses becomes unreachable."""
    access_key: str = ""
    secret_key: str = ""
    namespace: str = ""
    request_timeout: float = 3.0
    reconnect_timeout: float = 30.0
    """How long a call keeps reconnecting while the broker is unreachable before it fails."""
    heartbeat_interval: float = 10.0
    client_id: str = ""
    tls: bool = False
    """Connect over TLS, verifying the broker's certificate against the system's trusted CAs
    (or ``ca_file``)."""
    ca_file: str | None = None
    """PEM file of the CA certificates to verify the broker with (`sluice dev-cert` writes
    ``ca.pem``); setting it turns ``tls`` on."""

    def __post_init__(self) -> None:
        if not self.endpoints:
            raise ValueError("endpoint is empty: give host:port, or several separated by commas")
        for endpoint in self.endpoints:
            split_endpoint(endpoint)
        if self.ca_file is not None and not os.path.isfile(self.ca_file):
            raise ValueError(f"ca_file {self.ca_file!r} is not a file: give the PEM file of the CA "
                             "that signed the broker's certificate")
        if bool(self.access_key) != bool(self.secret_key):
            raise ValueError("set both access_key and secret_key, or neither")
        for name in ("request_timeout", "reconnect_timeout", "heartbeat_interval"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")

    @property
    def endpoints(self) -> tuple[str, ...]:
        """Every ``host:port`` of ``endpoint``, in order."""
        return tuple(part.strip() for part in self.endpoint.split(",") if part.strip())

    @property
    def secure(self) -> bool:
        """Whether the client connects over TLS."""
        return self.tls or self.ca_file is not None

    @property
    def host(self) -> str:
        """The (first) broker's host name or address."""
        return split_endpoint(self.endpoints[0])[0]

    @property
    def port(self) -> int:
        """The (first) broker's port."""
        return split_endpoint(self.endpoints[0])[1]
