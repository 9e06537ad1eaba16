"""`sluice push create|list|show|pause|resume|delete`: push subscriptions, which deliver a topic's
or an AMQP queue's events to an HTTP endpoint (admin API: /push-subscriptions)."""

from __future__ import annotations

import argparse
import json
import urllib.parse
from typing import Any

from .admin import AdminClient, CliError, Commands, show, table

FORMATS = ("binary", "structured", "raw")


def _path(name: str, action: str = "") -> str:
    return f"/push-subscriptions/{urllib.parse.quote(name, safe='')}{action}"


def parse_queue(text: str) -> tuple[str, str]:
    """``VHOST/QUEUE`` as (vhost, queue): ``//orders`` and ``orders`` are queue orders on vhost
    ``/``, ``prod/orders`` is queue orders on vhost prod."""
    vhost, slash, queue = text.rpartition("/")
    if not queue:
        raise CliError(f"--queue {text!r}: name the queue, as VHOST/QUEUE (//orders for "
                       "queue orders on vhost /)", code=2)
    return (vhost or "/") if slash else "/", queue


def parse_filter(text: str) -> Any:
    """One ``--filter``: JSON syntax is checked here, its meaning by the broker."""
    try:
        return json.loads(text)
    except ValueError as error:
        raise CliError(f"--filter {text!r} is not JSON ({error}); write e.g. "
                       "'{\"exact\": {\"type\": \"com.example.created\"}}' in single quotes",
                       code=2) from None


_OPTIONAL = ("subject_filter", "format", "transform", "concurrency", "rate_limit", "timeout_ms",
             "max_attempts", "dead_letter_topic", "reply_topic", "secret")


def create_body(args: argparse.Namespace) -> dict[str, Any]:
    """The POST /push-subscriptions body of `sluice push create`: only what was given, so the
    broker's defaults apply to the rest."""
    if bool(args.topic) == bool(args.queue):
        raise CliError("give the source: either --topic TOPIC or --queue VHOST/QUEUE", code=2)
    if args.subject_filter and not args.topic:
        raise CliError("--subject-filter filters a topic's subjects; use it with --topic", code=2)
    body: dict[str, Any] = {"name": args.name, "sink": args.sink}
    if args.topic:
        body["topic"] = args.topic
    else:
        body["vhost"], body["queue"] = parse_queue(args.queue)
    if args.filter:
        body["filters"] = [parse_filter(text) for text in args.filter]
    if args.ordered:
        body["ordered"] = True
    body.update({key: getattr(args, key) for key in _OPTIONAL if getattr(args, key) is not None})
    return body


def source(s: dict[str, Any]) -> str:
    """Where a subscription's events come from: ``sensors``, ``sensors (sensors/+/t)`` or
    ``queue //orders``."""
    if s.get("queue"):
        return f"queue {s['vhost']}/{s['queue']}"
    return s["topic"] + (f" ({s['subject_filter']})" if s.get("subject_filter") else "")


def render_created(s: dict[str, Any]) -> str:
    """`push create`'s answer, with the signing secret shown this once."""
    lines = [f"created push subscription {s['name']}: {source(s)} -> {s['sink']} ({s['format']})"]
    if s.get("secret"):
        lines += [f"signing secret: {s['secret']}",
                  "keep it now: it is not shown again, and the receiver needs it to verify the "
                  "webhook-signature header (Standard Webhooks)"]
    return "\n".join(lines)


def render_list(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "no push subscriptions (create one with `sluice push create`)"
    return table([(s["name"], source(s), s["sink"], s["format"], s["stats"]["state"],
                   s["stats"]["delivered"], s["stats"]["failed"], s["stats"]["retrying"],
                   s["stats"]["lag"]) for s in rows],
                 ["NAME", "SOURCE", "SINK", "FORMAT", "STATE", "DELIVERED", "FAILED",
                  "RETRYING", "LAG"])


def _ms(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value} ms" if isinstance(value, int) else f"{value:.1f} ms"


def render_subscription(s: dict[str, Any]) -> str:
    """Everything about one subscription: settings, then counters, latency and the last error."""
    stats = s["stats"]
    latency = stats.get("latency_ms") or {}
    settings = [
        ("owner", s.get("owner")), ("source", source(s)), ("sink", s["sink"]),
        ("format", s["format"]),
        ("filters", json.dumps(s["filters"]) if s.get("filters") else "none"),
        ("transform", s.get("transform") or "none"),
        ("concurrency", s.get("concurrency")),
        ("rate limit", f"{s['rate_limit']}/s" if s.get("rate_limit") else "unlimited"),
        ("timeout", _ms(s.get("timeout_ms"))), ("max attempts", s.get("max_attempts")),
        ("backoff", f"{s.get('backoff_min_ms')} ms to {s.get('backoff_max_ms')} ms"),
        ("dead letters to", s.get("dead_letter_topic") or "(default)"),
        ("ordered", "yes" if s.get("ordered") else "no"),
        ("replies to", s.get("reply_topic") or "(dropped)"),
        ("state", stats["state"]),
        ("delivered", stats["delivered"]), ("failed", stats["failed"]),
        ("retrying", stats["retrying"]), ("dead-lettered", stats.get("dead_lettered")),
        ("replies", stats.get("replies")), ("lag", stats["lag"]),
        ("latency", f"p50 {_ms(latency.get('p50'))}, p99 {_ms(latency.get('p99'))}"),
        ("last status", stats.get("last_status") or "-"),
        ("last error", stats.get("last_error") or "none"),
    ]
    width = max(len(key) for key, _ in settings) + 1
    return "\n".join([f"push subscription {s['name']}"] +
                     [f"  {key + ':':<{width}} {'' if value is None else value}"
                      for key, value in settings])


def push_create(client: AdminClient, args: argparse.Namespace) -> int:
    created = client.call("POST", "/push-subscriptions", create_body(args))
    return show(args, created, render_created)


def push_list(client: AdminClient, args: argparse.Namespace) -> int:
    return show(args, client.call("GET", "/push-subscriptions"), render_list)


def push_show(client: AdminClient, args: argparse.Namespace) -> int:
    return show(args, client.call("GET", _path(args.name), quoted=True), render_subscription)


def push_pause(client: AdminClient, args: argparse.Namespace) -> int:
    client.call("POST", _path(args.name, "/pause"), quoted=True)
    print(f"paused push subscription {args.name}: events wait in the source until it resumes")
    return 0


def push_resume(client: AdminClient, args: argparse.Namespace) -> int:
    client.call("POST", _path(args.name, "/resume"), quoted=True)
    print(f"resumed push subscription {args.name}")
    return 0


def push_delete(client: AdminClient, args: argparse.Namespace) -> int:
    client.call("DELETE", _path(args.name), quoted=True)
    print(f"deleted push subscription {args.name}")
    return 0


def add_push_commands(commands: argparse._SubParsersAction) -> None:
    """Register `push create|list|show|pause|resume|delete` under ``commands``."""
    c = Commands(commands)
    family = c.section("push", "Deliver a topic's or an AMQP queue's events to an HTTP "
                               "endpoint (push subscriptions).")
    _add_create(c, family)
    c.add(family, "list", "List push subscriptions (yours; an admin sees all) with their "
                          "state and counters.", push_list)
    for name, text, handler in (
            ("show", "Show one push subscription: settings, counters, latency, last error.",
             push_show),
            ("pause", "Stop delivering; events wait in the source.", push_pause),
            ("resume", "Deliver again, from where it paused.", push_resume),
            ("delete", "Delete a push subscription.", push_delete)):
        c.add(family, name, text, handler).add_argument("name", metavar="NAME", help="the subscription's name")


def _add_create(c: Commands, family: argparse._SubParsersAction) -> None:
    create = c.add(family, "create", "Create a push subscription; prints its signing secret "
                   "once.", push_create)
    create.add_argument("name", metavar="NAME", help="a name for the subscription, unique in the broker")
    where = create.add_argument_group("source (one of)")
    where.add_argument("--topic", metavar="TOPIC", help="a topic's events (its subjects)")
    where.add_argument("--subject-filter", metavar="FILTER",
                       help="with --topic: only subjects matching this MQTT-style filter, "
                            "e.g. sensors/+/temp")
    where.add_argument("--queue", metavar="VHOST/QUEUE",
                       help="an AMQP queue's messages, e.g. //orders (queue orders on vhost /)")
    create.add_argument("--sink", metavar="URL", required=True,
                        help="the http(s) URL events are POSTed to; a loopback or private "
                             "address needs the broker's push.allowed_sinks to list it")
    create.add_argument("--filter", metavar="JSON", action="append",
                        help="a CloudEvents Subscriptions API filter, e.g. "
                             "'{\"prefix\": {\"type\": \"com.example.\"}}' or "
                             "'{\"sql\": \"temp > 20\"}'; repeat it: all must match")
    create.add_argument("--format", choices=FORMATS,
                        help="binary: ce-* headers + data (default); structured: one "
                             "application/cloudevents+json body; raw: the data alone")
    create.add_argument("--transform", metavar="EXPR",
                        help="JMESPath over the JSON data, e.g. '{id: id, temp: readings[0].value}'")
    create.add_argument("--concurrency", type=int, metavar="N",
                        help="requests in flight, 1..256 (default: 16)")
    create.add_argument("--rate-limit", type=float, metavar="R",
                        help="requests per second (default: 0, unlimited)")
    create.add_argument("--timeout-ms", type=int, metavar="MS",
                        help="per request (default: 10000)")
    create.add_argument("--max-attempts", type=int, metavar="N",
                        help="attempts before an event is dead-lettered (default: 10)")
    create.add_argument("--dead-letter-topic", metavar="TOPIC",
                        help="where undeliverable events go")
    create.add_argument("--ordered", action="store_true",
                        help="one request at a time per message group, in order")
    create.add_argument("--reply-topic", metavar="TOPIC",
                        help="publish the response body here as a reply event")
    create.add_argument("--secret", metavar="SECRET",
                        help="the signing secret (whsec_ + base64; default: a new random one)")
