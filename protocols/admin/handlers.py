"""Admin API handlers: each turns one HTTP request into core calls and returns plain JSON data.

Handlers run on the broker's event loop; they call the ``Broker`` facade (and ``broker.users``)
and must not block for long. Access was checked before a handler runs (see ``access.py``);
handlers that list things filter by what the caller may read. A handler returns JSON-able data
(the route's success status is in the route table) or a ready ``web.Response``.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import enum
import functools
import json
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from aiohttp import web

from core.clients import ClientDirectory
from core.named_queues import NamedQueues
from core.vhost_admin import VhostAdmin
from core.errors import AccessDenied, MessageNotFound, NotFound, UserNotFound
from core.model import (INTERNAL_PREFIX, Action, ConsumeMode, Delivery, GroupConfig, MessageType,
                        Permission, Principal, ResourceKind, RetryPolicy, TopicConfig)
from core.trace import MAX_EVENTS

from .access import may_read
from .errors import HttpProblem
from .metrics import topic_queues


@dataclass(frozen=True)
class AdminDeps:
    """What the admin API reads: the broker facade, and the store and metadata for health."""

    broker: Any
    store: Any = None
    metadata: Any = None
    queues: NamedQueues | None = None
    """Core's live listeners, for ``/topics/{topic}/tail``."""
    clients: ClientDirectory | None = None
    """Every protocol's clients, for /clients and /metrics; None if no listener reports them."""
    dashboard_dir: Path | None = None
    """The telemetry dashboard's static files (``dashboard_files.py``); None: no dashboard."""
    vhosts: VhostAdmin | None = None
    """AMQP virtual hosts, their permissions, queues and connections (``vhosts.py``)."""
    cluster: ClusterView | None = None
    """This node's place in its replica group; None for a broker of its own."""
    retained: Any = None
    """The MQTT retained messages (``protocols.mqtt.retained.RetainedMessages``: ``listing``);
    None without MQTT."""
    push: Any = None
    """Push subscriptions: their registry and delivery stats (``protocols.push.engine.PushEngine``);
    None without them."""
    session_idle_timeout_s: int = 1800
    """A browser session ends after this many seconds without a request (``sessions.py``)."""
    events_max_body_bytes: int = 1 << 20
    """The largest body ``POST /events/{topic}`` reads (``ingress.py``)."""
    tokens: Any = None
    """The users' API tokens (``core.tokens.UserTokens``); None: bearer tokens are refused."""
    tier: Any = None
    """Tiered storage (``core.tiering.TieringLoop``); None: no tier configured."""


class ClusterView(Protocol):
    """What the admin API shows of a replica group (the cluster node of ``sluice.server.cluster_node``)."""

    def health(self) -> dict[str, Any]:
        """This node's id, role, leader and epoch, without asking etcd."""
    async def status(self) -> dict[str, Any]:
        """The whole group as etcd records it (raises when etcd does not answer)."""
    def metrics(self) -> Iterator[Any]:
        """Prometheus metric families of this node's replication."""


DEPS: web.AppKey[AdminDeps] = web.AppKey("deps", AdminDeps)


def deps(request: web.Request) -> AdminDeps:
    return request.app[DEPS]


# --- JSON helpers ---

def plain(value: Any) -> Any:
    """Dataclasses, enums, sets, mappings and bytes as JSON-able values."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (set, frozenset)):
        return sorted(plain(v) for v in value)
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    return value


def message_json(delivery: Delivery) -> dict[str, Any]:
    """A stored message: body as base64, plus ``body_text`` when the body is valid UTF-8."""
    try:
        text: str | None = delivery.body.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    return {"msg_id": delivery.msg_id, "topic": delivery.topic, "queue_id": delivery.queue_id,
            "queue_offset": delivery.queue_offset, "tag": delivery.tag, "keys": list(delivery.keys),
            "properties": dict(delivery.properties), "born_ts": delivery.born_ts,
            "store_ts": delivery.store_ts, "size": len(delivery.body),
            "body_base64": base64.b64encode(delivery.body).decode(), "body_text": text}


async def body_of(request: web.Request) -> dict[str, Any]:
    """The request's JSON object, or a 400 that says what to send (the server bounds the size)."""
    return json_object(await request.read())


def json_object(data: bytes) -> dict[str, Any]:
    """``data`` decoded as a JSON object, or a 400 that says what to send. Nesting deeper than
    the interpreter's recursion limit is refused like any other bad JSON, not a crash."""
    try:
        body = json.loads(data)
    except ValueError as error:
        raise HttpProblem(400, "bad_json", f"the request body is not JSON ({error}); send a JSON "
                          "object with Content-Type: application/json") from None
    except RecursionError:
        raise HttpProblem(400, "bad_json", "the request body nests arrays or objects too deeply "
                          "to decode; the admin API takes flat JSON objects") from None
    if not isinstance(body, dict):
        raise HttpProblem(400, "bad_json", "the request body must be a JSON object")
    return body


def field(body: Mapping[str, Any], name: str, kind: type | tuple[type, ...], default: Any = ...) -> Any:
    """``body[name]`` checked against ``kind``; a missing required field is a 400 naming it."""
    if name not in body or body[name] is None:
        if default is ...:
            raise HttpProblem(400, "missing_field", f"field {name!r} is required")
        return default
    value = body[name]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        expected = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise HttpProblem(400, "invalid_field", f"field {name!r} must be {expected}, not {value!r}")
    return value


def enum_value(cls: type[enum.Enum], raw: str, name: str) -> Any:
    try:
        return cls(raw.lower())
    except ValueError:
        choices = ", ".join(m.value for m in cls)
        raise HttpProblem(400, "invalid_field", f"{name} {raw!r} is not one of: {choices}") from None


def query_int(request: web.Request, name: str, default: int) -> int:
    raw = request.query.get(name)
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        raise HttpProblem(400, "invalid_query", f"query parameter {name}={raw!r} must be a whole "
                          "number") from None


# --- service ---

async def health(request: web.Request, principal: Principal) -> web.Response:
    """Store, metadata and memory status; 503 when the store or metadata fails, and 503
    ``degraded`` (with what is wrong) while the store or the metadata database cannot write or
    the memory alarm is on (publishers are blocked then)."""
    report = await health_report(deps(request))
    return web.json_response(report, status=health_status(report))


async def health_report(d: AdminDeps) -> dict[str, Any]:
    """What ``/health`` answers: ``status`` ok, degraded or failing, and each check."""
    metadata = await _check_metadata(d)
    memory = _check_memory(d.broker)
    degraded = getattr(d.store, "degraded", None)
    cluster = {"cluster": d.cluster.health()} if d.cluster is not None else {}
    tier = {"tier": _check_tier(d.tier)} if d.tier is not None else {}
    if degraded or memory.get("alarm") or metadata["status"] == "degraded":
        return {"status": "degraded", "store": degraded or _check_store(d.store),
                "metadata": metadata, "memory": memory, **cluster, **tier}
    checks = {"store": _check_store(d.store), "metadata": metadata}
    ok = all(c["status"] == "ok" for c in checks.values())
    if ok and tier and tier["tier"]["status"] != "ok":
        return {"status": "degraded", **checks, "memory": memory, **cluster, **tier}
    return {"status": "ok" if ok else "failing", **checks, "memory": memory, **cluster, **tier}


def health_status(report: dict[str, Any]) -> int:
    """``/health``'s HTTP status: 200 when ok, and when only tiering is degraded (the broker
    serves every client from its local log meanwhile, so probes must keep it in rotation);
    503 otherwise."""
    if report["status"] == "ok":
        return 200
    tier_only = report["status"] == "degraded" and not report["memory"].get("alarm") and all(
        isinstance(report[check], dict) and report[check].get("status") == "ok"
        for check in ("store", "metadata"))
    return 200 if tier_only else 503


def _check_tier(tier: Any) -> dict[str, Any]:
    """Tiering's part of ``/health``: degraded with the reasons while it fails, stopped or lags."""
    problems = tier.problems()
    return {"status": "degraded" if problems else "ok", "problems": problems,
            "tiered_end": tier.tiered_end}


async def cluster(request: web.Request, principal: Principal) -> web.Response:
    """The replica group: leader, epoch, in-sync set, each node's role and lag (any node answers)."""
    view = deps(request).cluster
    if view is None:
        raise HttpProblem(404, "not_a_cluster", "this broker runs alone: it was not started with --cluster-etcd")
    try:
        return web.json_response(await view.status())
    except Exception as error:  # noqa: BLE001 - etcd down or partitioned: say so, do not crash
        raise HttpProblem(503, "etcd_unavailable", f"etcd does not answer ({error}); the group's state is unknown") from None


def _check_memory(broker: Any) -> dict[str, Any]:
    alarm = getattr(broker, "memory_alarm", None)
    if alarm is None:
        return {"status": "unknown"}
    return {"status": "alarm" if alarm.on else "ok", "alarm": alarm.on,
            "resident_bytes": alarm.resident, "high_watermark_bytes": alarm.limit}


def _check_store(store: Any) -> dict[str, Any]:
    if store is None:
        return {"status": "unknown"}
    try:
        return {"status": "ok", "durable_offset": store.durable_offset,
                "visible_offset": getattr(store, "visible_offset", store.durable_offset)}
    except Exception as error:  # a failed store reports itself here rather than crash the probe
        return {"status": "failing", "error": str(error)}


async def _check_metadata(d: AdminDeps) -> dict[str, Any]:
    if d.metadata is None:
        return {"status": "unknown"}
    try:
        read_only = getattr(d.metadata, "read_only", None)  # opened on a full disk
        if read_only and not await blocking(d.metadata.try_writable):
            return {"status": "degraded", "error": read_only}
        return {"status": "ok", "schema_version": await blocking(d.metadata.schema_version)}
    except Exception as error:  # same: the probe reports, never raises
        return {"status": "failing", "error": str(error)}


# --- topics ---

def topic_json(config: TopicConfig) -> dict[str, Any]:
    return plain(config)


async def list_topics(request: web.Request, principal: Principal) -> list[dict[str, Any]]:
    """The topics ``principal`` may see; internal ones (the broker's own state, for admins
    only) just with ``?internal=true``."""
    internal = request.query.get("internal", "").lower() in ("1", "true", "yes")
    return [topic_json(t) for t in deps(request).broker.list_topics()
            if (internal or not t.name.startswith(INTERNAL_PREFIX))
            and may_read(principal, ResourceKind.TOPIC, t.name)]


async def create_topic(request: web.Request, principal: Principal) -> dict[str, Any]:
    body = await body_of(request)
    config = TopicConfig(
        name=field(body, "name", str),
        queue_count=field(body, "queue_count", int, TopicConfig.queue_count),
        message_type=enum_value(MessageType, field(body, "message_type", str, "normal"), "message_type"),
        retention_ms=field(body, "retention_ms", int, None),
        compacted=field(body, "compacted", bool, False),
        tier_retention_ms=field(body, "tier_retention_ms", int, None),
        body_schema=field(body, "body_schema", str, None))
    return topic_json(await deps(request).broker.create_topic(principal, config))


TOPIC_UPDATES = ("retention_ms", "tier_retention_ms", "body_schema")
"""The settings ``PATCH /topics/{topic}`` changes."""


async def update_topic(request: web.Request, principal: Principal) -> dict[str, Any]:
    """Change the settings the body names (null clears one); the others stay."""
    body = await body_of(request)
    if unknown := sorted(set(body) - set(TOPIC_UPDATES)):
        raise HttpProblem(400, "invalid_field", f"field(s) {', '.join(unknown)} cannot change "
                          f"with an update; send only {', '.join(TOPIC_UPDATES)}")
    broker = deps(request).broker
    current = broker.get_topic(request.match_info["topic"])
    kinds = {"retention_ms": int, "tier_retention_ms": int, "body_schema": str}
    changes = {name: field(body, name, kinds[name], None) for name in body}
    return topic_json(await broker.update_topic(principal, dataclasses.replace(current, **changes)))


async def describe_topic(request: web.Request, principal: Principal) -> dict[str, Any]:
    broker = deps(request).broker
    config = broker.get_topic(request.match_info["topic"])
    queues = [{**plain(q), "messages": q.max_offset - q.min_offset}
              for q in topic_queues(broker, config)]
    return {**topic_json(config), "queues": queues,
            "messages": sum(q["messages"] for q in queues)}


async def delete_topic(request: web.Request, principal: Principal) -> None:
    await deps(request).broker.delete_topic(principal, request.match_info["topic"])


async def topic_messages(request: web.Request, principal: Principal) -> Any:
    """Messages of a topic by business key (``?key=``), newest first, a page at a time (a
    ``Link: <...>; rel="next"`` header names the next page while more carry the key), or stored
    in a time range (``?from=&to=``, ms since the epoch; ``to`` defaults to now). At most
    ``limit`` (1-1000, default 32) either way."""
    key = request.query.get("key")
    topic, limit = request.match_info["topic"], query_int(request, "limit", 32)
    broker = deps(request).broker
    if key:
        after = request.query.get("after", "")
        page = broker.lookup_key(principal, topic, key, limit=limit, after=after)
        headers: dict[str, str] = {}
        if page.next:
            headers["Link"] = f'<{request.rel_url.update_query(after=page.next)}>; rel="next"'
        return web.json_response([message_json(m) for m in page.messages], headers=headers,
                                 dumps=functools.partial(json.dumps, ensure_ascii=False))
    if "from" in request.query:
        start = query_int(request, "from", 0)
        end = query_int(request, "to", int(time.time() * 1000))
        return [message_json(m) for m in broker.find_in_time(principal, topic, start, end, limit)]
    raise HttpProblem(400, "missing_query", "pass the business key to look up (?key=KEY) or a "
                      "time range in ms since the epoch (?from=MS&to=MS)")


def _not_found(msg_id: str) -> MessageNotFound:
    return MessageNotFound(f"no message you may read has id {msg_id!r}: it may have aged out with "
                           "retention, or reading it needs the subscribe right on its topic")


async def message_by_id(request: web.Request, principal: Principal) -> dict[str, Any]:
    """A message by id (``?topic=``: in that topic only), the newest when several share it,
    with the others the caller may read in ``same_id``. A caller without the subscribe right on
    a topic hears the same 404 as for a message that does not exist: neither the message nor
    the topic's name leaks, and its messages are not searched."""
    msg_id = request.match_info["msg_id"]
    try:
        newest, *others = deps(request).broker.lookup_messages(principal, msg_id,
                                                               request.query.get("topic", ""))
    except (AccessDenied, MessageNotFound):
        raise _not_found(msg_id) from None
    return {**message_json(newest), "same_id": [message_json(m) for m in others]}


async def message_trace(request: web.Request, principal: Principal) -> dict[str, Any]:
    """A message and its trace (``core.trace``), oldest event first, the stored message's own
    event included; the message ``message_by_id`` answers with, and the same 404."""
    msg_id = request.match_info["msg_id"]
    try:
        trace = await deps(request).broker.trace_message(principal, msg_id, request.query.get("topic", ""))
    except (AccessDenied, MessageNotFound):
        raise _not_found(msg_id) from None
    m = trace.message
    stored = {"time_ms": m.store_ts, "event": "stored", "group": "", "client": "", "attempt": 0,
              "detail": f"topic {m.topic} queue {m.queue_id} offset {m.queue_offset}"}
    return {"message": message_json(m), "events": [stored, *map(plain, trace.events)],
            "truncated": trace.truncated, "max_events": MAX_EVENTS,
            "same_id": [message_json(other) for other in trace.same_id]}


# --- groups ---

async def list_groups(request: web.Request, principal: Principal) -> list[dict[str, Any]]:
    return [plain(g) for g in deps(request).broker.list_groups()
            if may_read(principal, ResourceKind.GROUP, g.name)]


RETRY_FIELDS: dict[str, type | tuple[type, ...]] = {
    "max_attempts": int, "initial_backoff_ms": int, "max_backoff_ms": int,
    "multiplier": (int, float)}
"""The JSON types of a retry policy's fields; core checks their ranges."""


async def create_group(request: web.Request, principal: Principal) -> dict[str, Any]:
    body = await body_of(request)
    retry = field(body, "retry", dict, {})
    config = GroupConfig(
        name=field(body, "name", str),
        consume_mode=enum_value(ConsumeMode, field(body, "consume_mode", str, "clustering"),
                                "consume_mode"),
        retry=RetryPolicy(**{name: field(retry, name, kind, getattr(RetryPolicy, name))
                             for name, kind in RETRY_FIELDS.items()}),
        fifo=field(body, "fifo", bool, False))
    return plain(await deps(request).broker.create_group(principal, config))


async def describe_group(request: web.Request, principal: Principal) -> dict[str, Any]:
    stats = deps(request).broker.describe_group(request.match_info["group"])
    lag = [{**plain(q), "lag": q.lag} for q in stats.lag]
    return {**plain(stats.config), "members": plain(stats.members),
            "subscriptions": plain(stats.subscriptions), "lag": lag,
            "total_lag": sum(q["lag"] for q in lag)}


async def delete_group(request: web.Request, principal: Principal) -> None:
    await deps(request).broker.delete_group(principal, request.match_info["group"])


async def reset_offset(request: web.Request, principal: Principal) -> dict[str, Any]:
    body = await body_of(request)
    topic = field(body, "topic", str)
    to = field(body, "to", str, None)
    timestamp = field(body, "timestamp_ms", int, None)
    if (to is None) == (timestamp is None):
        raise HttpProblem(400, "invalid_field", "pass exactly one of timestamp_ms (ms since the "
                          "epoch) or to ('earliest' or 'latest')")
    if to is not None:
        if to not in ("earliest", "latest"):
            raise HttpProblem(400, "invalid_field", f"to {to!r} is not one of: earliest, latest")
        timestamp = 0 if to == "earliest" else int(time.time() * 1000) + 1
    offsets = await deps(request).broker.reset_offsets(principal, request.match_info["group"],
                                                       topic, timestamp)
    return {"group": request.match_info["group"], "topic": topic, "timestamp_ms": timestamp,
            "offsets": {str(q): o for q, o in sorted(offsets.items())}}


# --- users and permissions ---

async def blocking(fn: Callable[..., Any], *args: Any) -> Any:
    """Run a call that blocks on SQL or scrypt (``Users``, metadata) in the default executor."""
    return await asyncio.get_running_loop().run_in_executor(None, fn, *args)


def users(request: web.Request) -> Any:
    return deps(request).broker.users


async def list_users(request: web.Request, principal: Principal) -> list[dict[str, Any]]:
    return [plain(u) for u in await blocking(users(request).list_users)]


async def create_user(request: web.Request, principal: Principal) -> dict[str, Any]:
    body = await body_of(request)
    user = await blocking(users(request).create_user, field(body, "name", str),
                          field(body, "password", str), field(body, "admin", bool, False))
    return plain(user)


async def delete_user(request: web.Request, principal: Principal) -> None:
    name = request.match_info["user"]
    if not await blocking(users(request).delete_user, name):
        raise UserNotFound(f"user {name!r} does not exist; `sluice user list` shows every user")


async def set_password(request: web.Request, principal: Principal) -> None:
    body = await body_of(request)
    await blocking(users(request).set_password, request.match_info["user"],
                   field(body, "password", str))


async def list_permissions(request: web.Request, principal: Principal) -> list[dict[str, Any]]:
    return [plain(p) for p in await blocking(users(request).permissions, request.match_info["user"])]


def _actions(raw: Any) -> frozenset[Action]:
    if not isinstance(raw, list) or not raw:
        raise HttpProblem(400, "invalid_field", "field 'actions' must be a non-empty list of: "
                          + ", ".join(a.value for a in Action))
    return frozenset(enum_value(Action, str(a), "action") for a in raw)


async def grant(request: web.Request, principal: Principal) -> dict[str, Any]:
    """Add a permission, or replace the actions of the user's grant on the same kind and pattern."""
    body = await body_of(request)
    permission = Permission(request.match_info["user"],
                            enum_value(ResourceKind, field(body, "kind", str), "kind"),
                            field(body, "pattern", str), _actions(field(body, "actions", list)))
    await blocking(users(request).grant, permission)
    return plain(permission)


async def revoke(request: web.Request, principal: Principal) -> None:
    query, user = request.query, request.match_info["user"]
    if "kind" not in query or "pattern" not in query:
        raise HttpProblem(400, "missing_query", "pass ?kind=topic|group&pattern=PATTERN")
    kind = enum_value(ResourceKind, query["kind"], "kind")
    if not await blocking(users(request).revoke, user, kind, query["pattern"]):
        raise NotFound(f"user {user!r} has no permission on {kind.value} pattern "
                       f"{query['pattern']!r}; `sluice user permissions {user}` lists them")
