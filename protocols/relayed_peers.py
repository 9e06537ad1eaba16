"""The clients behind connections a cluster follower relayed to this node.

A follower passes each client connection on to the leader over the group's authenticated
replication port; the leader opens a local connection to its own listener for it and records
here which client that local connection stands for. Every protocol names its peer through
``client_address`` (``grpc_peer`` for gRPC's peer strings), so logs, ``client list``, login
throttling and loopback-only users see the client, not the relay.
"""
from __future__ import annotations

_relayed: dict[tuple[str, int], tuple[str, int]] = {}


def register(local: tuple[str, int], client: tuple[str, int]) -> None:
    """The connection from ``local`` (the relay's end on this node) carries ``client``."""
    _relayed[local] = client


def forget(local: tuple[str, int]) -> None:
    _relayed.pop(local, None)


def client(peername: tuple | None) -> tuple | None:
    """The client a connection from ``peername`` stands for (``peername`` if not relayed)."""
    if peername is None:
        return None
    return _relayed.get((peername[0], peername[1]), peername)


def client_address(peername: tuple | None) -> str:
    """``host:port`` of the client a connection from ``peername`` stands for; ``?`` if unknown."""
    found = client(peername)
    return f"{found[0]}:{found[1]}" if found else "?"


def grpc_peer(peer: str) -> str:
    """A gRPC peer string (``ipv4:127.0.0.1:5000``, ``ipv6:[::1]:5000``) with a relayed
    connection's client in place of the relay."""
    family, _, rest = peer.partition(":")
    host, _, port = rest.rpartition(":")
    if family not in ("ipv4", "ipv6") or not port.isdigit() or not _relayed:
        return peer
    found = _relayed.get((host.strip("[]"), int(port)))
    if found is None:
        return peer
    return f"ipv6:[{found[0]}]:{found[1]}" if ":" in found[0] else f"ipv4:{found[0]}:{found[1]}"


def remote(request) -> str:
    """The client's host of an aiohttp request (``request.remote`` unless relayed)."""
    transport = request.transport
    peername = transport.get_extra_info("peername") if transport is not None else None
    found = client(peername)
    return found[0] if found else (request.remote or "")
