"""`sluice vhost|queue|exchange|binding|channel ...`: AMQP virtual hosts, their permissions and
what is in them, as `rabbitmqctl` lists them (admin API: /vhosts, /queues, /exchanges,
/bindings, /amqp/channels)."""

from __future__ import annotations

import argparse
import urllib.parse
from typing import Any

from .admin import AdminClient, Commands, show, table

VHOST_HELP = "the virtual host (default: /)"


def _segment(name: str) -> str:
    """One path segment of the admin API: ``/`` written ``%2F``, as RabbitMQ's API writes it."""
    return urllib.parse.quote(name, safe="")


def _vhost_query(args: argparse.Namespace) -> dict[str, Any] | None:
    return {"vhost": args.vhost} if args.vhost is not None else None


def _yes(value: bool) -> str:
    return "yes" if value else "no"


# --- vhost ---

def vhost_add(client: AdminClient, args: argparse.Namespace) -> int:
    client.call("POST", "/vhosts", {"name": args.name})
    print(f"created virtual host {args.name}")
    return 0


def vhost_delete(client: AdminClient, args: argparse.Namespace) -> int:
    client.call("DELETE", f"/vhosts/{_segment(args.name)}", quoted=True)
    print(f"deleted virtual host {args.name} with its exchanges, queues and permissions")
    return 0


def vhost_list(client: AdminClient, args: argparse.Namespace) -> int:
    return show(args, client.call("GET", "/vhosts"), lambda rows: table(
        [(v["name"], v["exchanges"], v["queues"], v["messages_ready"]) for v in rows],
        ["VHOST", "EXCHANGES", "QUEUES", "MESSAGES READY"]) if rows else "no virtual hosts")


def vhost_permit(client: AdminClient, args: argparse.Namespace) -> int:
    body = {"configure": args.configure, "write": args.write, "read": args.read}
    client.call("PUT", f"/vhosts/{_segment(args.vhost_name)}/permissions/{_segment(args.name)}",
                body, quoted=True)
    print(f"user {args.name} on virtual host {args.vhost_name}: configure {args.configure!r}, "
          f"write {args.write!r}, read {args.read!r}")
    return 0


def vhost_unpermit(client: AdminClient, args: argparse.Namespace) -> int:
    client.call("DELETE",
                f"/vhosts/{_segment(args.vhost_name)}/permissions/{_segment(args.name)}",
                quoted=True)
    print(f"cleared the permission of user {args.name} on virtual host {args.vhost_name}")
    return 0


def vhost_permissions(client: AdminClient, args: argparse.Namespace) -> int:
    query = {k: v for k, v in (("vhost", args.vhost), ("user", args.for_user)) if v is not None}
    rows = client.call("GET", "/vhost-permissions", query=query or None)
    return show(args, rows, lambda found: table(
        [(p["user"], p["vhost"], p["configure"], p["write"], p["read"]) for p in found],
        ["USER", "VHOST", "CONFIGURE", "WRITE", "READ"]) if found else "no permissions")


# --- queue ---

def queue_list(client: AdminClient, args: argparse.Namespace) -> int:
    rows = client.call("GET", "/queues", query=_vhost_query(args))
    return show(args, rows, lambda found: table(
        [(q["vhost"], q["name"], q["messages_ready"], q["messages_unacknowledged"],
          q["consumers"], f"{q['publish_rate']:.1f}", f"{q['deliver_rate']:.1f}",
          _yes(q["durable"])) for q in found],
        ["VHOST", "QUEUE", "READY", "UNACKED", "CONSUMERS", "PUBLISH/S", "DELIVER/S",
         "DURABLE"]) if found else "no queues")


def _queue_path(args: argparse.Namespace) -> str:
    return f"/queues/{_segment(args.vhost or '/')}/{_segment(args.name)}"


def queue_purge(client: AdminClient, args: argparse.Namespace) -> int:
    answer = client.call("POST", _queue_path(args) + "/purge", quoted=True)
    print(f"purged {answer['message_count']} messages from queue {args.name}")
    return 0


def queue_delete(client: AdminClient, args: argparse.Namespace) -> int:
    query = {k: "true" for k, v in (("if_unused", args.if_unused), ("if_empty", args.if_empty))
             if v}
    path = _queue_path(args)
    if query:
        path += "?" + urllib.parse.urlencode(query)
    answer = client.call("DELETE", path, quoted=True)
    print(f"deleted queue {args.name} ({answer['message_count']} messages were ready)")
    return 0


# --- exchange, binding, channel ---

def exchange_list(client: AdminClient, args: argparse.Namespace) -> int:
    rows = client.call("GET", "/exchanges", query=_vhost_query(args))
    return show(args, rows, lambda found: table(
        [(e["vhost"], e["name"] or "(default)", e["type"], _yes(e["durable"]),
          _yes(e["auto_delete"]), _yes(e["internal"])) for e in found],
        ["VHOST", "EXCHANGE", "TYPE", "DURABLE", "AUTO DELETE", "INTERNAL"]))


def binding_list(client: AdminClient, args: argparse.Namespace) -> int:
    rows = client.call("GET", "/bindings", query=_vhost_query(args))
    return show(args, rows, lambda found: table(
        [(b["vhost"], b["source"] or "(default)", b["destination"], b["destination_type"],
          b["routing_key"], b["arguments"] or "") for b in found],
        ["VHOST", "SOURCE", "DESTINATION", "KIND", "ROUTING KEY", "ARGUMENTS"])
        if found else "no bindings")


def channel_list(client: AdminClient, args: argparse.Namespace) -> int:
    rows = client.call("GET", "/amqp/channels")
    return show(args, rows, lambda found: table(
        [(c["connection"], c["number"], c["user"], c["vhost"], c["consumers"],
          c["messages_unacknowledged"], c["prefetch_count"], _yes(c["confirm"]))
         for c in found],
        ["CONNECTION", "CHANNEL", "USER", "VHOST", "CONSUMERS", "UNACKED", "PREFETCH",
         "CONFIRM"]) if found else "no channels")


# --- the parser ---

def add_vhost_commands(commands: argparse._SubParsersAction) -> None:
    """Register `vhost`, `queue`, `exchange`, `binding` and `channel` under ``commands``."""
    c = Commands(commands)
    _vhost_family(c)
    _queue_family(c)
    for family, text, handler in (
            ("exchange", "List AMQP exchanges (admin only).", exchange_list),
            ("binding", "List AMQP bindings, the default exchange's included (admin only).",
             binding_list)):
        section = c.section(family, text)
        c.add(section, "list", text, handler).add_argument(
            "--vhost", help="only this virtual host's")
    section = c.section("channel", "List AMQP channels (admin only).")
    c.add(section, "list", "List open AMQP channels: consumers, unacked deliveries, prefetch, "
                           "confirm mode.", channel_list)


def _vhost_family(c: Commands) -> None:
    vhost = c.section("vhost", "Manage AMQP virtual hosts and users' permissions on them.")
    c.add(vhost, "add", "Create a virtual host.", vhost_add).add_argument("name", metavar="VHOST")
    c.add(vhost, "delete", "Delete a virtual host with everything in it (its connections are "
                           "closed).", vhost_delete).add_argument("name", metavar="VHOST")
    c.add(vhost, "list", "List virtual hosts.", vhost_list)
    permit = c.add(vhost, "permit", "Set a user's permission on a virtual host: regular "
                                    "expressions over exchange and queue names, as RabbitMQ's "
                                    "set_permissions.", vhost_permit)
    permit.add_argument("name", metavar="USER")
    permit.add_argument("vhost_name", metavar="VHOST")
    for right, text in (("configure", "declare and delete"),
                        ("write", "publish to (exchanges) and bind to (queues)"),
                        ("read", "consume, get and purge (queues) and bind from (exchanges)")):
        permit.add_argument(f"--{right}", default="", metavar="RE",
                            help=f"what the user may {text}; '' (the default) is nothing, "
                                 f"'.*' everything")
    unpermit = c.add(vhost, "unpermit", "Clear a user's permission on a virtual host.",
                     vhost_unpermit)
    unpermit.add_argument("name", metavar="USER")
    unpermit.add_argument("vhost_name", metavar="VHOST")
    listing = c.add(vhost, "permissions", "List users' permissions on virtual hosts.",
                    vhost_permissions)
    listing.add_argument("--vhost", help="only this virtual host's")
    listing.add_argument("--for", dest="for_user", metavar="USER", help="only this user's")


def _queue_family(c: Commands) -> None:
    queue = c.section("queue", "List, purge and delete AMQP queues (admin only).")
    c.add(queue, "list", "List queues: messages ready and unacknowledged, consumers, publish "
                         "and deliver rates.", queue_list).add_argument(
        "--vhost", help="only this virtual host's")
    for name, text, handler in (
            ("purge", "Settle every ready message of a queue (the log keeps them).",
             queue_purge),
            ("delete", "Delete a queue (its consumers are cancelled).", queue_delete)):
        command = c.add(queue, name, text, handler)
        command.add_argument("name", metavar="QUEUE")
        command.add_argument("--vhost", help=VHOST_HELP)
        if name == "delete":
            command.add_argument("--if-unused", action="store_true",
                                 help="only if it has no consumers")
            command.add_argument("--if-empty", action="store_true",
                                 help="only if no message is ready")
