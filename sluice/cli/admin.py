"""`sluice topic|group|message|user ...`: admin commands that call a running broker's HTTP API.

Each command is one or two requests to the admin API (``--admin URL``, default
``http://127.0.0.1:8080``) with HTTP Basic credentials (``--user``/``--password``, default
``SLUICE_USER``/``SLUICE_PASSWORD``, then sluice/sluice). Read commands print a table, or the
API's JSON with ``--json``. Errors print the API's message, which says what to do next.
"""

from __future__ import annotations

import argparse
import base64
import getpass
import json
import os
import ssl
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

DEFAULT_ADMIN_URL = "http://127.0.0.1:8080"
START_HINT = "is `sluice serve` running? start it with `make run`"


class CliError(Exception):
    """A command failed; the message says what to do next. ``code`` is the exit status."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


class AdminClient:
    """A blocking JSON client of the admin API."""

    def __init__(self, url: str, user: str, password: str, timeout: float = 30.0,
                 ca: str | None = None) -> None:
        """``ca``: PEM file of the CA that signed an https admin API's certificate (else the
        system's trusted CAs)."""
        self.url = url.rstrip("/")
        self.timeout = timeout
        self._ca = ca
        self._context: ssl.SSLContext | None = None
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        self._headers = {"Authorization": f"Basic {token}", "Accept": "application/json"}

    def call(self, method: str, path: str, body: Any = None,
             query: dict[str, Any] | None = None, *, quoted: bool = False) -> Any:
        """The decoded JSON answer (None for 204); CliError for refusals and HTTP errors.
        ``quoted``: ``path`` is already percent-encoded (segments holding a ``/``)."""
        return self._request(method, path, body, query, quoted)[0]

    def page(self, path: str, query: dict[str, Any]) -> tuple[Any, str]:
        """``call`` a GET that pages: the decoded answer, and the ``after`` value of the next
        page its ``Link: <...>; rel="next"`` header names ("" for none)."""
        answer, headers = self._request("GET", path, None, query, False)
        target, _, rel = (headers.get("Link") or "").partition(";")
        if rel.strip() != 'rel="next"':
            return answer, ""
        following = urllib.parse.parse_qs(urllib.parse.urlsplit(target.strip("<> ")).query)
        return answer, following.get("after", [""])[0]

    def _request(self, method: str, path: str, body: Any, query: dict[str, Any] | None,
                 quoted: bool) -> tuple[Any, Any]:
        target = self.url + (path if quoted else urllib.parse.quote(path))
        if query:
            target += "?" + urllib.parse.urlencode({k: v for k, v in query.items() if v is not None})
        data = None if body is None else json.dumps(body).encode()
        headers = dict(self._headers, **({"Content-Type": "application/json"} if data else {}))
        request = urllib.request.Request(target, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout,
                                        context=self._tls()) as response:
                raw, answered = response.read(), response.headers
        except urllib.error.HTTPError as error:
            raise _http_error(error) from None
        except urllib.error.URLError as error:
            if isinstance(error.reason, ssl.SSLCertVerificationError):
                raise CliError(f"the admin API at {self.url} has a certificate this command does "
                               f"not trust ({error.reason.verify_message}); pass --ca FILE (or "
                               "SLUICE_CA) naming the CA that signed it") from None
            raise CliError(f"cannot reach the admin API at {self.url} ({error.reason}); "
                           f"{START_HINT}, or pass --admin URL") from None
        except (ConnectionError, TimeoutError) as error:
            raise CliError(f"the admin API at {self.url} did not answer ({error}); {START_HINT}") from None
        return json.loads(raw) if raw else None, answered

    def _tls(self) -> ssl.SSLContext | None:
        """The client context of an https URL: ``ca`` if given, else the system's CAs."""
        if not self.url.startswith("https:"):
            return None
        if self._context is None:
            try:
                self._context = ssl.create_default_context(cafile=self._ca)
            except (OSError, ssl.SSLError) as error:
                raise CliError(f"--ca {self._ca}: cannot read it as PEM CA certificates "
                               f"({error}); pass the CA file `sluice dev-cert` wrote "
                               "(ca.pem) or your own") from None
        return self._context


def _http_error(error: urllib.error.HTTPError) -> CliError:
    try:
        message = json.loads(error.read())["message"]
    except (ValueError, KeyError, TypeError):
        message = error.reason
    if error.code == 401:
        message += " (admin credentials: --user/--password or SLUICE_USER/SLUICE_PASSWORD)"
    return CliError(f"{error.code}: {message}")


# --- output ---

def table(rows: Sequence[Sequence[Any]], headers: Sequence[str]) -> str:
    """Rows as left-aligned columns under ``headers``."""
    cells = [list(map(str, headers))] + [["" if v is None else str(v) for v in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells)


def plural(count: int, noun: str) -> str:
    """``1 message``, ``2 messages``: a count with its noun."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def show(args: argparse.Namespace, data: Any, render: Callable[[Any], str]) -> int:
    print(json.dumps(data, indent=2, ensure_ascii=False) if args.json else render(data))
    return 0


# --- topics ---

def body_schema_text(path: str | None) -> str | None:
    """The text of ``--body-schema FILE`` (``-`` reads standard input), None without one."""
    if path is None:
        return None
    try:
        return sys.stdin.read() if path == "-" else Path(path).read_text()
    except (OSError, UnicodeDecodeError) as error:
        raise CliError(f"--body-schema {path}: cannot read it ({error}); pass a JSON Schema "
                       "file such as schema.json", code=2) from None


def topic_create(client: AdminClient, args: argparse.Namespace) -> int:
    body = {"name": args.name, "queue_count": args.queues, "message_type": args.type,
            "retention_ms": args.retention_ms, "compacted": args.compacted,
            "tier_retention_ms": args.tier_retention_ms,
            "body_schema": body_schema_text(args.body_schema)}
    try:
        created = client.call("POST", "/topics", body)
    except CliError as error:
        if str(error).startswith("409:"):  # name the command that deletes it
            raise CliError(f"{error} (`sluice topic delete {args.name}`)") from None
        raise
    print(f"created topic {created['name']} ({created['queue_count']} queues, "
          f"{created['message_type']})")
    return 0


def topic_update(client: AdminClient, args: argparse.Namespace) -> int:
    body: dict[str, Any] = {}
    if args.retention_ms is not None:
        body["retention_ms"] = args.retention_ms
    if args.tier_retention_ms is not None:
        body["tier_retention_ms"] = args.tier_retention_ms
    if args.body_schema is not None:
        body["body_schema"] = body_schema_text(args.body_schema)
    body.update({name: None for name in args.clear})
    if not body:
        raise CliError("nothing to change: give --retention-ms, --tier-retention-ms, "
                       "--body-schema or --clear SETTING", code=2)
    updated = client.call("PATCH", f"/topics/{args.name}", body)
    tier = updated["tier_retention_ms"]
    print(f"updated topic {updated['name']}: retention_ms {updated['retention_ms'] or 'default'}, "
          f"tier_retention_ms {tier or 'forever'}, body schema "
          f"{'set' if updated['body_schema'] else 'none'}")
    return 0


def topic_list(client: AdminClient, args: argparse.Namespace) -> int:
    query = {"internal": "true"} if args.all else None
    return show(args, client.call("GET", "/topics", query=query), lambda topics: table(
        [(t["name"], t["queue_count"], t["message_type"], t["retention_ms"] or "default",
          "yes" if t["compacted"] else "no") for t in topics],
        ["TOPIC", "QUEUES", "TYPE", "RETENTION_MS", "COMPACTED"]) if topics else "no topics")


def topic_describe(client: AdminClient, args: argparse.Namespace) -> int:
    def render(t: dict[str, Any]) -> str:
        head = (f"topic {t['name']}: {t['queue_count']} queues, {t['message_type']}, "
                f"{t['messages']} messages retained")
        return head + "\n" + table([(q["queue_id"], q["min_offset"], q["max_offset"], q["messages"])
                                    for q in t["queues"]], ["QUEUE", "MIN", "MAX", "MESSAGES"])
    return show(args, client.call("GET", f"/topics/{args.name}"), render)


def topic_delete(client: AdminClient, args: argparse.Namespace) -> int:
    client.call("DELETE", f"/topics/{args.name}")
    print(f"deleted topic {args.name}")
    return 0


# --- groups ---

def group_create(client: AdminClient, args: argparse.Namespace) -> int:
    body = {"name": args.name, "consume_mode": "broadcast" if args.broadcast else "clustering",
            "fifo": args.fifo, "retry": {"max_attempts": args.max_attempts}}
    created = client.call("POST", "/groups", body)
    print(f"created group {created['name']} ({group_mode(created)})")
    return 0


def group_mode(group: dict[str, Any]) -> str:
    """How a group consumes: ``clustering`` or ``broadcast``, and ``FIFO`` when it is one."""
    return group["consume_mode"] + (", FIFO" if group["fifo"] else "")


def group_list(client: AdminClient, args: argparse.Namespace) -> int:
    return show(args, client.call("GET", "/groups"), lambda groups: table(
        [(g["name"], g["consume_mode"], "yes" if g["fifo"] else "no", g["retry"]["max_attempts"])
         for g in groups], ["GROUP", "MODE", "FIFO", "MAX_ATTEMPTS"]) if groups else "no groups")


def group_describe(client: AdminClient, args: argparse.Namespace) -> int:
    def render(g: dict[str, Any]) -> str:
        parts = [f"group {g['name']}: {group_mode(g)}, {plural(len(g['members']), 'live member')}, "
                 f"total lag {g['total_lag']}"]
        if g["members"]:
            parts.append(table([(m["client_id"], " ".join(f"{t}/{q}" for t, q in m["queues"]))
                                for m in g["members"]], ["MEMBER", "QUEUES"]))
        if g["subscriptions"]:
            parts.append(table([(s["topic"], s["expression"]) for s in g["subscriptions"]],
                               ["SUBSCRIBED TOPIC", "FILTER"]))
        parts.append(table([(q["topic"], q["queue_id"], q["committed"], q["max_offset"],
                             q["inflight"], q["lag"]) for q in g["lag"]],
                           ["TOPIC", "QUEUE", "COMMITTED", "MAX", "INFLIGHT", "LAG"])
                     if g["lag"] else "no committed offsets yet")
        return "\n".join(parts)
    return show(args, client.call("GET", f"/groups/{args.name}"), render)


def group_delete(client: AdminClient, args: argparse.Namespace) -> int:
    client.call("DELETE", f"/groups/{args.name}")
    print(f"deleted group {args.name}")
    return 0


def group_reset(client: AdminClient, args: argparse.Namespace) -> int:
    body: dict[str, Any] = {"topic": args.topic}
    if args.to:
        body["to"] = args.to
    else:
        body["timestamp_ms"] = parse_time(args.time)
    result = client.call("POST", f"/groups/{args.name}/reset-offset", body)
    print(f"group {args.name} on topic {args.topic} now starts at:")
    print(table(sorted(result["offsets"].items(), key=lambda kv: int(kv[0])), ["QUEUE", "OFFSET"]))
    return 0


def parse_time(text: str, option: str = "--time") -> int:
    """Milliseconds since the epoch, or an ISO 8601 date/time (local time if no zone)."""
    if text.isdigit():
        return int(text)
    try:
        return int(datetime.fromisoformat(text).timestamp() * 1000)
    except ValueError:
        raise CliError(f"{option} {text!r} is neither milliseconds since the epoch nor an ISO date "
                       "such as 2024-05-01T12:00:00", code=2) from None


# --- messages ---

def message_get(client: AdminClient, args: argparse.Namespace) -> int:
    if args.key:
        return _messages_by_key(client, args)
    if not args.msg_id:
        raise CliError("pass a message id, or --topic T --key K", code=2)
    found = client.call("GET", f"/messages/{args.msg_id}", query={"topic": args.topic})
    if args.json:
        print(json.dumps(found, indent=2, ensure_ascii=False))
        return 0
    print(render_message(found))
    if found["same_id"]:
        print(f"{len(found['same_id'])} more message(s) you may read have this id (producers choose "
              "ids); pass --topic T for one topic's:")
    for other in found["same_id"]:
        print(render_message(other))
    return 0


def _messages_by_key(client: AdminClient, args: argparse.Namespace) -> int:
    if not args.topic:
        raise CliError("a lookup by key needs the topic: sluice message get --topic T --key K", 2)
    found, after = client.page(f"/topics/{args.topic}/messages",
                               {"key": args.key, "limit": args.limit, "after": args.after})
    if args.json:
        print(json.dumps(found, indent=2, ensure_ascii=False))
    elif not found:
        print(f"no message on topic {args.topic} has key {args.key!r}")
    for message in [] if args.json else found:
        print(render_message(message))
    if after:
        print(f"more messages carry this key: add --after {after} for the next {args.limit}",
              file=sys.stderr)
    return 0


def message_find(client: AdminClient, args: argparse.Namespace) -> int:
    start = parse_time(args.since, "--from")
    query = {"from": start, "limit": args.limit}
    if args.until is not None:
        query["to"] = parse_time(args.until, "--to")
    found = client.call("GET", f"/topics/{args.topic}/messages", query=query)
    if args.json:
        print(json.dumps(found, indent=2, ensure_ascii=False))
        return 0
    if not found:
        print(f"no message of topic {args.topic} was stored in that time range")
    for message in found:
        print(render_message(message))
    return 0


def message_trace(client: AdminClient, args: argparse.Namespace) -> int:
    """The trace of a message by id, or of each message of ``--topic`` with ``--key``."""
    if args.key:
        if not args.topic or args.msg_id:
            raise CliError("pass a message id, or --topic T --key K", 2)
        found = client.call("GET", f"/topics/{args.topic}/messages", query={"key": args.key,
                                                                            "limit": args.limit})
        if not found:
            raise CliError(f"no message on topic {args.topic} has key {args.key!r}")
        ids = [message["msg_id"] for message in found]
    elif args.msg_id:
        ids = [args.msg_id]
    else:
        raise CliError("pass a message id, or --topic T --key K", 2)
    traces = [client.call("GET", f"/messages/{msg_id}/trace", query={"topic": args.topic})
              for msg_id in ids]
    if args.json:
        print(json.dumps(traces if args.key else traces[0], indent=2, ensure_ascii=False))
    else:
        print("\n\n".join(render_trace(trace) for trace in traces))
    return 0


def render_trace(trace: dict[str, Any]) -> str:
    """A message's trace as a timeline: one row per event, oldest first."""
    m = trace["message"]
    rows = [(_local_time(e["time_ms"]), e["event"], e["group"] or "-", e["client"] or "-",
             e["attempt"] or "-", e["detail"]) for e in trace["events"]]
    lines = [f"message {m['msg_id']}  topic {m['topic']}  tag {m['tag'] or '-'}  "
             f"keys {','.join(m['keys']) or '-'}",
             table(rows, ["TIME", "EVENT", "GROUP", "CLIENT", "ATTEMPT", "DETAIL"])]
    if trace["truncated"]:
        lines.append(f"(only the newest {trace['max_events']} events are shown; older ones "
                     "were left out)")
    if trace.get("same_id"):
        topics = ", ".join(sorted({other["topic"] for other in trace["same_id"]}))
        lines.append(f"(other messages you may read have this id, in {topics}: trace one with "
                     "--topic T)")
    return "\n".join(lines)


def _local_time(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000).isoformat(sep=" ", timespec="milliseconds")


def render_message(m: dict[str, Any]) -> str:
    body = m["body_text"] if m["body_text"] is not None else f"(binary, base64) {m['body_base64']}"
    lines = [f"id {m['msg_id']}  topic {m['topic']}  queue {m['queue_id']}  offset {m['queue_offset']}",
             f"  tag {m['tag'] or '-'}  keys {','.join(m['keys']) or '-'}  stored "
             f"{datetime.fromtimestamp(m['store_ts'] / 1000).isoformat(timespec='milliseconds')}"
             f"  size {m['size']}"]
    lines += [f"  {k} = {v}" for k, v in sorted(m["properties"].items())]
    return "\n".join(lines + [f"  body: {body}"])


# --- users and permissions ---

def new_password(args: argparse.Namespace) -> str:
    if args.new_password is not None:
        return args.new_password
    if not sys.stdin.isatty():
        raise CliError("pass the new user's password with --new-password (no terminal to ask on)", 2)
    first = getpass.getpass(f"password for {args.name}: ")
    if first != getpass.getpass("again: "):
        raise CliError("the two passwords differ; run the command again", 2)
    return first


def user_create(client: AdminClient, args: argparse.Namespace) -> int:
    user = client.call("POST", "/users", {"name": args.name, "password": new_password(args),
                                          "admin": args.make_admin})
    print(f"created user {user['name']}{' (admin)' if user['admin'] else ''}")
    return 0


def user_list(client: AdminClient, args: argparse.Namespace) -> int:
    return show(args, client.call("GET", "/users"), lambda users: table(
        [(u["name"], "yes" if u["admin"] else "no") for u in users], ["USER", "ADMIN"]))


def user_delete(client: AdminClient, args: argparse.Namespace) -> int:
    client.call("DELETE", f"/users/{args.name}")
    print(f"deleted user {args.name}")
    return 0


def user_passwd(client: AdminClient, args: argparse.Namespace) -> int:
    client.call("PUT", f"/users/{args.name}/password", {"password": new_password(args)})
    print(f"password of {args.name} changed")
    return 0


def user_grant(client: AdminClient, args: argparse.Namespace) -> int:
    granted = client.call("POST", f"/users/{args.name}/permissions",
                          {"kind": args.kind, "pattern": args.pattern, "actions": args.actions})
    print(f"granted {','.join(granted['actions'])} on {args.kind} {args.pattern} to {args.name}")
    return 0


def user_revoke(client: AdminClient, args: argparse.Namespace) -> int:
    client.call("DELETE", f"/users/{args.name}/permissions",
                query={"kind": args.kind, "pattern": args.pattern})
    print(f"revoked {args.name}'s permission on {args.kind} {args.pattern}")
    return 0


def user_permissions(client: AdminClient, args: argparse.Namespace) -> int:
    return show(args, client.call("GET", f"/users/{args.name}/permissions"), lambda perms: table(
        [(p["kind"], p["pattern"], ",".join(p["actions"])) for p in perms],
        ["KIND", "PATTERN", "ACTIONS"]) if perms else f"{args.name} has no permissions")


def acl_add(client: AdminClient, args: argparse.Namespace) -> int:
    rule = client.call("POST", "/acl", {"user": args.who, "pattern": args.pattern,
                                        "actions": args.actions, "effect": args.effect})
    who = "everyone" if rule["user"] == "*" else rule["user"]
    print(f"{rule['effect']} {','.join(rule['actions'])} on {rule['pattern']} for {who}")
    return 0


def acl_remove(client: AdminClient, args: argparse.Namespace) -> int:
    client.call("DELETE", "/acl", query={"user": args.who, "pattern": args.pattern,
                                         "effect": args.effect})
    print(f"removed the {args.effect} rule on {args.pattern}")
    return 0


def acl_list(client: AdminClient, args: argparse.Namespace) -> int:
    query = {"user": args.who} if args.who != "*" else None
    return show(args, client.call("GET", "/acl", query=query), lambda rules: table(
        [(r["effect"], "everyone" if r["user"] == "*" else r["user"], r["pattern"],
          ",".join(r["actions"])) for r in rules],
        ["EFFECT", "FOR", "PATTERN", "ACTIONS"]) if rules else "no rules")


# --- parser ---

def admin_options() -> argparse.ArgumentParser:
    """Options every admin command takes: where the API is and who is asking."""
    common = argparse.ArgumentParser(add_help=False)
    group = common.add_argument_group("admin API")
    group.add_argument("--admin", metavar="URL",
                       default=os.environ.get("SLUICE_ADMIN_URL", DEFAULT_ADMIN_URL),
                       help="admin API base URL (default: $SLUICE_ADMIN_URL or %(default)s)")
    add_credentials(group)
    group.add_argument("--ca", metavar="PEM", default=os.environ.get("SLUICE_CA"),
                       help="CA certificate(s) to verify an https admin API with (default: "
                       "$SLUICE_CA, else the system's trusted CAs)")
    group.add_argument("--json", action="store_true", help="print the API's JSON answer")
    return common


def add_credentials(group: argparse._ArgumentGroup) -> None:
    """``--user``/``--password``, defaulting to $SLUICE_USER/$SLUICE_PASSWORD, then sluice/sluice."""
    group.add_argument("--user", default=os.environ.get("SLUICE_USER", "sluice"),
                       help="user (default: $SLUICE_USER or sluice)")
    group.add_argument("--password", default=os.environ.get("SLUICE_PASSWORD", "sluice"),
                       help="its password (default: $SLUICE_PASSWORD or sluice)")


class Commands:
    """Adds admin-API commands to the ``sluice`` parser, each with the admin options."""

    def __init__(self, commands: argparse._SubParsersAction) -> None:
        self.commands = commands
        self.common = admin_options()

    def section(self, name: str, text: str) -> argparse._SubParsersAction:
        """A command family (``sluice topic ...``)."""
        parser = self.commands.add_parser(name, help=text, description=text)
        return parser.add_subparsers(dest=f"{name}_command", required=True, metavar="COMMAND")

    def add(self, parent: argparse._SubParsersAction, name: str, text: str,
            handler: Callable[[AdminClient, argparse.Namespace], int]) -> argparse.ArgumentParser:
        """One command of a family, running ``handler`` against the admin API."""
        sub = parent.add_parser(name, help=text, description=text, parents=[self.common])
        sub.set_defaults(handler=lambda args: run(handler, args))
        return sub


def add_admin_commands(commands: argparse._SubParsersAction) -> argparse._SubParsersAction:
    """Register `topic`, `group`, `message`, `user` and `acl` under ``commands``; the `user`
    family, for the commands other modules add to it (`user token`)."""
    adder = Commands(commands)
    for add_family in (_topic_commands, _group_commands, _message_commands, _acl_commands):
        add_family(adder)
    return _user_commands(adder)


def _topic_commands(c: Commands) -> None:
    topic = c.section("topic", "Create, update, list, describe and delete topics.")
    sub = c.add(topic, "create", "Create a topic.", topic_create)
    sub.add_argument("name", metavar="TOPIC")
    sub.add_argument("--queues", type=int, default=8, help="number of queues (default: %(default)s)")
    sub.add_argument("--type", default="normal",
                     choices=["normal", "fifo", "delay", "transaction", "priority", "lite"],
                     help="message type (default: %(default)s); a priority topic's queue N holds "
                          "priority N, so give it as many queues as priorities; a lite topic's "
                          "messages each name a lite topic inside it")
    sub.add_argument("--retention-ms", type=int, help="keep messages this long (default: store-wide)")
    sub.add_argument("--compacted", action="store_true", help="keep the newest message per key")
    _tier_arguments(sub)
    sub = c.add(topic, "update", "Change a topic's retention, tier retention or body schema.",
                topic_update)
    sub.add_argument("name", metavar="TOPIC")
    sub.add_argument("--retention-ms", type=int, help="keep messages this long in the local log")
    _tier_arguments(sub)
    sub.add_argument("--clear", action="append", default=[],
                     choices=["retention_ms", "tier_retention_ms", "body_schema"],
                     help="reset a setting to its default (repeatable)")
    c.add(topic, "list", "List topics.", topic_list).add_argument(
        "--all", action="store_true",
        help="include internal topics (%%SYS%%..., the broker's own state; admins only)")
    c.add(topic, "describe", "Show a topic's queues and offsets.", topic_describe).add_argument(
        "name", metavar="TOPIC")
    c.add(topic, "delete", "Delete a topic.", topic_delete).add_argument("name", metavar="TOPIC")


def _tier_arguments(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--tier-retention-ms", type=int, metavar="MS",
                     help="drop the topic's tiered files older than this (default: keep them "
                          "forever; needs tier.url on the broker)")
    sub.add_argument("--body-schema", metavar="FILE",
                     help="JSON Schema of the message bodies (a flat object of string, integer, "
                          "number, boolean and object properties; - reads standard input): "
                          "tiered Parquet files get a typed data column")


def _group_commands(c: Commands) -> None:
    group = c.section("group", "Create, list, describe and delete consumer groups; reset offsets.")
    sub = c.add(group, "create", "Create a consumer group.", group_create)
    sub.add_argument("name", metavar="GROUP")
    sub.add_argument("--broadcast", action="store_true", help="every member gets every message")
    sub.add_argument("--fifo", action="store_true", help="deliver each message group in order")
    sub.add_argument("--max-attempts", type=int, default=16,
                     help="deliveries before a message goes to the dead-letter topic")
    c.add(group, "list", "List consumer groups.", group_list)
    c.add(group, "describe", "Show a group's members, subscriptions and lag.",
        group_describe).add_argument("name", metavar="GROUP")
    c.add(group, "delete", "Delete a consumer group.", group_delete).add_argument("name", metavar="GROUP")
    sub = c.add(group, "reset-offset", "Move a group's offsets on a topic to a point in time.",
              group_reset)
    sub.add_argument("name", metavar="GROUP")
    sub.add_argument("--topic", required=True)
    where = sub.add_mutually_exclusive_group(required=True)
    where.add_argument("--time", help="ms since the epoch, or ISO 8601 (2024-05-01T12:00:00)")
    where.add_argument("--to", choices=["earliest", "latest"], help="the first or the next message")


def _message_commands(c: Commands) -> None:
    message = c.section("message", "Look up stored messages and trace their path.")
    sub = c.add(message, "get", "Show a message by id, or the messages of a topic with a key.",
              message_get)
    sub.add_argument("msg_id", nargs="?", metavar="MSG_ID")
    sub.add_argument("--topic", help="topic to search by key; with an id, the one topic to look in "
                     "(default: every topic you may read)")
    sub.add_argument("--key", help="business key (needs --topic)")
    sub.add_argument("--limit", type=int, default=32,
                     help="at most this many, 1-1000 (default: %(default)s)")
    sub.add_argument("--after", metavar="CURSOR", help="with --key: the next page, as the last one said")
    sub = c.add(message, "trace", "Show a message's path as a timeline: stored, delivered to "
                "which group and client, retried, acked, dead-lettered (the broker needs "
                "core.message_trace = true).", message_trace)
    sub.add_argument("msg_id", nargs="?", metavar="MSG_ID")
    sub.add_argument("--topic", help="the topic of the message (when several topics hold its "
                     "id), or to search by key")
    sub.add_argument("--key", help="trace the messages with this business key (needs --topic)")
    sub.add_argument("--limit", type=int, default=32, help="at most this many (default: %(default)s)")
    sub = c.add(message, "find", "Show the messages of a topic stored in a time range, oldest first.",
                message_find)
    sub.add_argument("topic", metavar="TOPIC")
    sub.add_argument("--from", dest="since", required=True,
                     help="first store time: ms since the epoch, or ISO 8601 (2024-05-01T12:00:00)")
    sub.add_argument("--to", dest="until", help="last store time, as --from (default: now)")
    sub.add_argument("--limit", type=int, default=32, help="at most this many (default: %(default)s)")


def _user_commands(c: Commands) -> argparse._SubParsersAction:
    user = c.section("user", "Manage users and their permissions.")
    for name, text, handler in [("create", "Create a user.", user_create),
                                ("passwd", "Set a user's password.", user_passwd)]:
        sub = c.add(user, name, text, handler)
        sub.add_argument("name", metavar="NAME")
        sub.add_argument("--new-password", metavar="PASSWORD",
                         help="the user's password (asked for on a terminal when omitted)")
        if name == "create":
            sub.add_argument("--superuser", dest="make_admin", action="store_true",
                             help="make the user an admin: it may do anything")
    c.add(user, "list", "List users.", user_list)
    c.add(user, "delete", "Delete a user, its permissions and its API tokens.", user_delete).add_argument("name", metavar="NAME")
    c.add(user, "permissions", "List a user's permissions.", user_permissions).add_argument(
        "name", metavar="NAME")
    for name, text, handler in [("grant", "Grant actions on topics or groups matching a pattern.",
                                 user_grant),
                                ("revoke", "Revoke a user's permission on a pattern.", user_revoke)]:
        sub = c.add(user, name, text, handler)
        sub.add_argument("name", metavar="NAME")
        sub.add_argument("kind", choices=["topic", "group"])
        sub.add_argument("pattern", metavar="PATTERN", help="a name, or a pattern with * wildcards")
        if name == "grant":
            sub.add_argument("actions", nargs="+", choices=["publish", "subscribe", "admin"],
                             metavar="ACTION", help="publish, subscribe and/or admin")
    return user


def _acl_commands(c: Commands) -> None:
    acl = c.section("acl", "Allow or deny publish/subscribe on MQTT topics, per user or for "
                         "everyone: the most specific matching rule wins (deny on a tie); where "
                         "no rule matches, topic permissions decide.")
    for effect in ("allow", "deny"):
        sub = c.add(acl, effect, f"Add a rule that {effect}s actions on topics matching a filter.",
                  acl_add)
        sub.set_defaults(effect=effect)
        sub.add_argument("pattern", metavar="FILTER",
                         help="an MQTT topic filter; %%u stands for the user name and %%c for "
                              "the client id, e.g. 'devices/%%c/#'")
        sub.add_argument("actions", nargs="+", choices=["publish", "subscribe"], metavar="ACTION",
                         help="publish and/or subscribe")
        sub.add_argument("--for", dest="who", default="*", metavar="USER",
                         help="the user the rule is for (default: everyone)")
    sub = c.add(acl, "remove", "Remove a rule.", acl_remove)
    sub.add_argument("pattern", metavar="FILTER", help="the rule's filter, exactly as added")
    sub.add_argument("--effect", choices=["allow", "deny"], required=True)
    sub.add_argument("--for", dest="who", default="*", metavar="USER",
                     help="the rule's user (default: everyone)")
    sub = c.add(acl, "list", "List rules (with --for, those that apply to one user).", acl_list)
    sub.add_argument("--for", dest="who", default="*", metavar="USER")


def run(handler: Callable[[AdminClient, argparse.Namespace], int], args: argparse.Namespace) -> int:
    """Run an admin command; print a CliError's message and return its code."""
    try:
        return handler(AdminClient(args.admin, args.user, args.password, ca=args.ca), args)
    except CliError as error:
        print(f"error: {error}", file=sys.stderr)
        return error.code
