"""`sluice client list|show|kick`: connected clients and kept sessions of every protocol."""

from __future__ import annotations

import argparse
import urllib.parse
from datetime import datetime
from typing import Any

from .admin import AdminClient, Commands, show, table


def _since(ms: int | None) -> str:
    return "" if ms is None else datetime.fromtimestamp(ms / 1000).strftime("%Y-%m-%d %H:%M:%S")


def _path(args: argparse.Namespace) -> str:
    quote = lambda part: urllib.parse.quote(part, safe="")  # noqa: E731
    return f"/clients/{quote(args.protocol)}/{quote(args.client_id)}"


def _traffic(count: int | None, rate: float | None) -> str:
    """``120 (2.5/s)``: a total since the client connected and its current rate; ``-`` for a
    session kept without a connection."""
    return "-" if count is None else f"{count} ({rate or 0.0:.1f}/s)"


def _inflight(c: dict[str, Any]) -> Any:
    return c["details"].get("inflight", "-")


def client_list(client: AdminClient, args: argparse.Namespace) -> int:
    query = {k: v for k, v in (("protocol", args.protocol), ("user", args.for_user),
                               ("connected", "true" if args.connected else None)) if v}
    return show(args, client.call("GET", "/clients", query=query or None), lambda found: table(
        [(c["protocol"], c["client_id"], c["user"], c["address"] if c["connected"] else "(away)",
          _since(c["connected_at_ms"]), len(c["subscriptions"]),
          _traffic(c["published"], c["publish_rate"]), _traffic(c["delivered"], c["deliver_rate"]),
          _inflight(c)) for c in found],
        ["PROTOCOL", "CLIENT ID", "USER", "ADDRESS", "CONNECTED SINCE", "SUBSCRIPTIONS",
         "PUBLISHED", "DELIVERED", "INFLIGHT"])
        if found else "no clients")


def render_client(c: dict[str, Any]) -> str:
    """One client, its traffic, details and subscriptions, as lines."""
    lines = [f"{c['protocol']} client {c['client_id']}",
             f"  user:      {c['user']}",
             f"  address:   {c['address'] if c['connected'] else '(not connected; session kept)'}"]
    if c["connected_at_ms"] is not None:
        lines.append(f"  connected: {_since(c['connected_at_ms'])}")
    if c["published"] is not None:
        lines += [f"  published: {_traffic(c['published'], c['publish_rate'])}",
                  f"  delivered: {_traffic(c['delivered'], c['deliver_rate'])}"]
    lines += [f"  {key}: {value}" for key, value in sorted(c["details"].items())]
    lines.append("  subscriptions:" + ("" if c["subscriptions"] else " none"))
    lines += [f"    {s}" for s in c["subscriptions"]]
    return "\n".join(lines)


def client_show(client: AdminClient, args: argparse.Namespace) -> int:
    return show(args, client.call("GET", _path(args)), render_client)


def client_kick(client: AdminClient, args: argparse.Namespace) -> int:
    client.call("DELETE", _path(args))
    print(f"disconnected {args.protocol} client {args.client_id}")
    return 0


def add_client_commands(commands: argparse._SubParsersAction) -> None:
    """Register `client list|show|kick` under ``commands``."""
    c = Commands(commands)
    family = c.section("client", "List, show and disconnect the clients of every protocol "
                                 "(admin only).")
    listing = c.add(family, "list", "List connected clients and kept sessions: messages "
                              "published and delivered since each connected (per second now), "
                              "deliveries not acknowledged yet (INFLIGHT).", client_list)
    listing.add_argument("--protocol", help="only this protocol's clients (mqtt, amqp, native)")
    listing.add_argument("--for", dest="for_user", metavar="USER", help="only this user's clients")
    listing.add_argument("--connected", action="store_true",
                         help="only connected clients, not sessions kept while away")
    for name, text, handler in (
            ("show", "Show one client: address, user, messages published and delivered "
                     "(totals and rates), subscriptions, protocol details.",
             client_show),
            ("kick", "Disconnect a client now (its session stays as the protocol keeps it).",
             client_kick)):
        command = c.add(family, name, text, handler)
        command.add_argument("protocol", metavar="PROTOCOL", help="mqtt, amqp or native")
        command.add_argument("client_id", metavar="CLIENT_ID")
