"""`sluice user token create|list|delete`: users' API tokens (admin API:
/users/{user}/tokens). A token stands for its user where a password cannot go, sent as
``Authorization: Bearer slt_...``; it is shown once, when made."""

from __future__ import annotations

import argparse
import datetime
import urllib.parse

from .admin import AdminClient, Commands, show, table


def _user_path(user: str) -> str:
    return f"/users/{urllib.parse.quote(user, safe='')}/tokens"


def _when(ms: int | None) -> str:
    if ms is None:
        return "never"
    return datetime.datetime.fromtimestamp(ms / 1000).isoformat(sep=" ", timespec="seconds")


def token_create(client: AdminClient, args: argparse.Namespace) -> int:
    made = client.call("POST", _user_path(args.name), quoted=True)
    return show(args, made, lambda t: (
        f"{t['token']}\n\nAPI token {t['id']} of {t['user']}: this is the only time it is "
        "shown; send it as the header `Authorization: Bearer TOKEN`"))


def token_list(client: AdminClient, args: argparse.Namespace) -> int:
    return show(args, client.call("GET", _user_path(args.name), quoted=True), lambda tokens: table(
        [(t["id"], _when(t["created_ms"]), _when(t["last_used_ms"])) for t in tokens],
        ["ID", "CREATED", "LAST USED"]) if tokens else f"{args.name} has no API tokens")


def token_delete(client: AdminClient, args: argparse.Namespace) -> int:
    client.call("DELETE", f"{_user_path(args.name)}/{urllib.parse.quote(args.id, safe='')}",
                quoted=True)
    print(f"deleted API token {args.id} of {args.name}: it no longer works")
    return 0


def add_token_commands(commands: argparse._SubParsersAction, user: argparse._SubParsersAction) -> None:
    """Register `sluice user token ...` under the `user` family of ``commands``."""
    c = Commands(commands)
    text = ("Make, list and delete a user's API tokens, sent as `Authorization: Bearer TOKEN` "
            "(e.g. by a Knative sink or curl) to act as the user.")
    parser = user.add_parser("token", help=text, description=text)
    tokens = parser.add_subparsers(dest="token_command", required=True, metavar="COMMAND")
    for name, summary, handler in [
            ("create", "Make an API token for a user (an admin, or the user itself with its "
                       "password); it is printed once: store it now. Send it as the header "
                       "`Authorization: Bearer TOKEN`.", token_create),
            ("list", "List a user's API tokens: ids, when made and last used.", token_list),
            ("delete", "Delete one of a user's API tokens; it stops working at once.",
             token_delete)]:
        sub = c.add(tokens, name, summary, handler)
        sub.add_argument("name", metavar="USER", help="the user the token acts as")
        if name == "delete":
            sub.add_argument("id", metavar="ID", help="the token's id, as `list` shows it")
