"""`sluice cluster status|elect-unclean` and `sluice dev-cluster`.

``status`` asks any node's admin port (``GET /cluster``, answered by followers too).
``elect-unclean`` is the operator's last resort when no in-sync node survives: it names a node in
etcd, which then campaigns without being in sync (whatever the old in-sync set confirmed and this
node lacks is lost), so it talks to etcd directly, as only an operator of the group can.
"""
from __future__ import annotations

import argparse
import asyncio
import sys

from .admin import AdminClient, Commands, show, table


def _render_status(status: dict) -> str:
    head = (f"leader {status['leader'] or '(none)'}, epoch {status['epoch'] or '-'}, in sync: "
            f"{', '.join(status['isr'])}; confirmed up to offset {status['confirmed'] if status['confirmed'] is not None else '?'}")
    if status.get("refusal"):
        head += f"\npublishes refused: {status['refusal']}"
    rows = [(n["id"], n["address"] or "-", n["role"], _or_dash(n["durable_end"]), _or_dash(n["lag_bytes"]),
             _or_dash(n["lag_s"])) for n in status["nodes"]]
    return head + "\n" + table(rows, ["NODE", "ADDRESS", "ROLE", "DURABLE END", "LAG BYTES", "LAG S"])


def _or_dash(value: object) -> object:
    return "-" if value is None else value


def cluster_status(client: AdminClient, args: argparse.Namespace) -> int:
    return show(args, client.call("GET", "/cluster"), _render_status)


def _elect_unclean(args: argparse.Namespace) -> int:
    from sluice.cluster.etcd import Etcd, EtcdUnavailable

    async def name_node() -> None:
        etcd = Etcd([url.strip() for url in args.etcd.split(",") if url.strip()])
        try:
            await etcd.put(f"/sluice/{args.group}/unclean".encode(), args.node.encode())
        finally:
            await etcd.close()
    try:
        asyncio.run(name_node())
    except EtcdUnavailable as error:
        print(f"error: {error}; check --etcd", file=sys.stderr)
        return 1
    print(f"{args.node} will take the lead while no node leads, without being in sync: records the old "
          "in-sync set confirmed and it lacks are lost. Watch it with `sluice cluster status`.")
    return 0


def add_cluster_commands(commands: argparse._SubParsersAction) -> None:
    """Register `cluster status|elect-unclean` and `dev-cluster` under ``commands``."""
    c = Commands(commands)
    family = c.section("cluster", "The replica group: who leads, who is in sync, how far behind.")
    c.add(family, "status", "Show the leader, epoch, in-sync set and each node's role and lag (any node "
                            "answers).", cluster_status)
    text = ("Last resort when no in-sync node survives: let NODE lead without being in sync. What the "
            "lost in-sync nodes confirmed and NODE lacks is lost.")
    unclean = family.add_parser("elect-unclean", help=text, description=text)
    unclean.add_argument("node", metavar="NODE", help="the node to elect (its --node-id)")
    unclean.add_argument("--etcd", required=True, metavar="URL[,URL...]", help="the group's etcd, as "
                         "given to the nodes with --cluster-etcd")
    unclean.add_argument("--group", default="sluice", help="the group's name, [cluster] name (default: sluice)")
    unclean.set_defaults(handler=_elect_unclean)
    from .dev_cluster import add_dev_cluster_command

    add_dev_cluster_command(commands)
