"""The OpenAPI 3.0 document, generated from the route table (``routes.ROUTES``) and SCHEMAS."""

from __future__ import annotations

import re
from typing import Any

from .access import Access
from .errors import STATUS
from .guards import SAFE_METHODS
from .history import STEP_S

TITLE = "Sluice admin API"
VERSION = "0.1.0"

_STR, _INT, _BOOL = {"type": "string"}, {"type": "integer"}, {"type": "boolean"}


def _obj(required: list[str], **properties: Any) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        schema["required"] = required
    return schema


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


def _list(item: Any) -> dict[str, Any]:
    return {"type": "array", "items": item}


def _count(what: str) -> dict[str, Any]:
    return {"type": "integer", "nullable": True,
            "description": f"{what} (null: a session kept with no connection)"}


def _rate(what: str) -> dict[str, Any]:
    return {"type": "number", "nullable": True,
            "description": f"{what} per second over the last sampling interval ({STEP_S} s; 0 "
                           f"until the first sample; null: a session kept with no connection)"}


_TOPIC = dict(name=_STR, queue_count=_INT,
              message_type={"type": "string", "enum": ["normal", "fifo", "delay", "transaction"]},
              retention_ms={"type": "integer", "nullable": True}, compacted=_BOOL,
              tier_retention_ms={"type": "integer", "nullable": True, "description":
                                 "drop tiered files older than this (null: keep them forever)"},
              body_schema={"type": "string", "nullable": True, "description":
                           "JSON Schema (text) of the bodies: tiered files get a typed data "
                           "column"})
_TOPIC_UPDATE = {name: _TOPIC[name] for name in ("retention_ms", "tier_retention_ms",
                                                 "body_schema")}
_RETRY = _obj([], max_attempts=_INT, initial_backoff_ms=_INT, max_backoff_ms=_INT,
              multiplier={"type": "number"})
_GROUP = dict(name=_STR, consume_mode={"type": "string", "enum": ["clustering", "broadcast"]},
              retry=_RETRY, fifo=_BOOL)
_ACTIONS = _list({"type": "string", "enum": ["publish", "subscribe", "admin"]})

_NUM = {"type": "number"}
_PUSH_FIELDS = dict(
    name=_STR, sink={"type": "string", "description": "the http(s) URL events are POSTed to"},
    topic={"type": "string", "description": "the source topic (or vhost and queue)"},
    subject_filter={"type": "string", "description": "MQTT-style filter on the subject"},
    vhost=_STR, queue=_STR,
    filters=_list({"type": "object", "description": "a CloudEvents Subscriptions API filter"}),
    format={"type": "string", "enum": ["binary", "structured", "raw"]},
    transform={"type": "string", "description": "JMESPath over the JSON data"},
    concurrency=_INT, rate_limit={"type": "number", "description": "requests/s, 0: unlimited"},
    timeout_ms=_INT, max_attempts=_INT, backoff_min_ms=_INT, backoff_max_ms=_INT,
    dead_letter_topic={"type": "string", "description": "default NAME.dlq"},
    ordered=_BOOL, reply_topic=_STR)
_PUSH_STATS = _obj(
    ["state"], state={"type": "string", "enum": ["running", "paused", "failing", "refused",
                                                 "stopped"]},
    delivered=_INT, failed=_INT, retrying=_INT, dead_lettered=_INT, replies=_INT, filtered=_INT,
    lag=_INT, latency_ms=_obj([], p50={**_NUM, "nullable": True}, p99={**_NUM, "nullable": True}),
    last_error=_STR, last_status={"type": "integer", "nullable": True})
_PUSH = dict(_PUSH_FIELDS, owner=_STR, paused=_BOOL, created_ms=_INT, stats=_PUSH_STATS)

SCHEMAS: dict[str, dict[str, Any]] = {
    "PushSubscription": _obj(["name", "owner", "sink"], **_PUSH),
    "PushSubscriptionCreate": _obj(["name", "sink"], **_PUSH_FIELDS, secret={
        "type": "string", "description": "whsec_ + base64 of 24+ bytes; made for you if left out"}),
    "PushSubscriptionCreated": _obj(["name", "owner", "sink", "secret"], **_PUSH, secret={
        "type": "string", "description": "the Standard Webhooks signing secret: shown only here"}),
    "Error": _obj(["error", "message"], error=_STR, message={
        "type": "string", "description": "what went wrong and what to do next"}),
    "Health": _obj(["status"], status={"type": "string", "enum": ["ok", "degraded", "failing"]},
                   store=_obj([], status=_STR, durable_offset=_INT, visible_offset=_INT),
                   metadata=_obj([], status=_STR),
                   tier=_obj([], status=_STR, problems=_list(_STR), tiered_end=_INT)),
    "TierStatus": {"type": "object", "required": ["enabled", "description"], "properties": dict(
        enabled=_BOOL, description={"type": "string", "description": "where the tier is"},
        tiered_end={"type": "integer", "description": "every record below this log offset is "
                    "tiered (or past tier retention)"},
        lag_ms={"type": "integer", "description": "how long the oldest sealed segment not yet "
                "tiered has waited"},
        max_lag_ms=_INT, failing=_BOOL,
        failing_since_ms={"type": "integer", "nullable": True},
        last_error={"type": "string", "nullable": True},
        stopped={"type": "string", "nullable": True, "description": "why this node stopped "
                 "tiering (a newer leader tiers)"},
        local_retention=_obj([], deleted_segments=_INT, deleted_bytes=_INT, log_start={
            "type": "integer", "description": "the local log's first offset afterwards"})),
        "additionalProperties": True},
    "Topic": _obj(["name"], **_TOPIC),
    "TopicCreate": _obj(["name"], **_TOPIC),
    "TopicUpdate": _obj([], **_TOPIC_UPDATE),
    "TopicDetail": _obj(["name", "queues"], **_TOPIC, messages=_INT, queues=_list(_obj(
        [], queue_id=_INT, min_offset=_INT, max_offset=_INT, messages=_INT))),
    "Message": _obj(["msg_id", "topic", "body_base64"], msg_id=_STR, topic=_STR, queue_id=_INT,
                    queue_offset=_INT, tag=_STR, keys=_list(_STR),
                    properties={"type": "object", "additionalProperties": _STR},
                    born_ts=_INT, store_ts=_INT, size=_INT, body_base64=_STR,
                    body_text={"type": "string", "nullable": True,
                               "description": "the body as UTF-8, null when it is not valid UTF-8"}),
    "MessageById": {"allOf": [_ref("Message"), _obj(["same_id"], same_id={
        **_list(_ref("Message")),
        "description": "other messages with this id you may read, newest first (producers "
                       "choose ids, so several may share one); ?topic= picks one"})]},
    "MessageTrace": _obj(
        ["message", "events", "truncated"], message=_ref("Message"),
        events=_list(_obj(["time_ms", "event"], time_ms=_INT, event={"type": "string", "enum": [
            "stored", "delivered", "retried", "acked", "rejected", "dead_lettered"]}, group=_STR,
            client=_STR, attempt=_INT, detail=_STR)),
        truncated={"type": "boolean",
                   "description": "true: only the newest max_events events are listed"},
        max_events=_INT, same_id={
            **_list(_ref("Message")),
            "description": "other messages with this id you may read, newest first; pass "
                           "?topic= to trace one of them"}),
    "Group": _obj(["name"], **_GROUP),
    "GroupCreate": _obj(["name"], **_GROUP),
    "GroupDetail": _obj(["name", "members", "subscriptions", "lag"], **_GROUP, total_lag=_INT,
                        members=_list(_obj([], client_id=_STR, last_heartbeat_ms=_INT,
                                           queues=_list(_list({})))),
                        subscriptions=_list(_obj([], group=_STR, topic=_STR, expression=_STR,
                                                 expression_type=_STR)),
                        lag=_list(_obj([], topic=_STR, queue_id=_INT, committed=_INT,
                                       max_offset=_INT, inflight=_INT, lag=_INT))),
    "ResetOffset": {**_obj(["topic"], topic=_STR, timestamp_ms=_INT,
                           to={"type": "string", "enum": ["earliest", "latest"]}),
                    "description": "exactly one of timestamp_ms or to"},
    "ResetResult": _obj([], group=_STR, topic=_STR, timestamp_ms=_INT,
                        offsets={"type": "object", "additionalProperties": _INT}),
    "User": _obj(["name"], name=_STR, admin=_BOOL),
    "UserCreate": _obj(["name", "password"], name=_STR, password=_STR, admin=_BOOL),
    "Password": _obj(["password"], password=_STR),
    "Permission": _obj([], user=_STR, kind={"type": "string", "enum": ["topic", "group"]},
                       pattern=_STR, actions=_ACTIONS),
    "Grant": _obj(["kind", "pattern", "actions"], kind={"type": "string", "enum": ["topic", "group"]},
                  pattern={"type": "string", "description": "a name, or a pattern with * wildcards"},
                  actions=_ACTIONS),
    "Client": _obj(["protocol", "client_id", "connected"], protocol=_STR, client_id=_STR,
                   user=_STR, address=_STR, connected=_BOOL,
                   connected_at_ms={"type": "integer", "nullable": True},
                   subscriptions=_list(_STR),
                   details={"type": "object", "description": "what only this protocol has; "
                            "inflight: deliveries the client has not acknowledged yet (MQTT "
                            "QoS 1/2, AMQP over every channel)"},
                   published=_count("messages the client sent since it connected"),
                   delivered=_count("messages sent to the client since it connected, "
                                    "redeliveries included"),
                   publish_rate=_rate("messages the client sent"),
                   deliver_rate=_rate("messages sent to the client")),
    "Vhost": _obj(["name"], name=_STR, exchanges=_INT, queues=_INT, messages_ready=_INT),
    "VhostCreate": _obj(["name"], name=_STR),
    "VhostPermission": _obj([], user=_STR, vhost=_STR, configure=_STR, write=_STR, read=_STR),
    "VhostPermissionSet": _obj(
        ["configure", "write", "read"],
        **{right: {"type": "string", "description": f"a regular expression (RE2: no "
                   f"backreferences or lookarounds): the exchanges and queues the user may "
                   f"{right} ('' for none, '.*' for all)"}
           for right in ("configure", "write", "read")}),
    "Exchange": _obj([], vhost=_STR, name=_STR, type=_STR, durable=_BOOL, auto_delete=_BOOL,
                     internal=_BOOL, arguments={"type": "object"}),
    "AmqpQueue": _obj([], vhost=_STR, name=_STR, durable=_BOOL, auto_delete=_BOOL,
                      exclusive=_BOOL, arguments={"type": "object"}, messages_ready=_INT,
                      messages_unacknowledged=_INT, consumers=_INT, published=_INT,
                      delivered=_INT, acked=_INT, publish_rate={"type": "number"},
                      deliver_rate={"type": "number"}, ack_rate={"type": "number"}),
    "MessageCount": _obj(["message_count"], message_count=_INT),
    "AmqpBinding": _obj([], vhost=_STR, source=_STR, destination=_STR,
                        destination_type={"type": "string", "enum": ["queue", "exchange"]},
                        routing_key=_STR, arguments={"type": "object"}),
    "AmqpConnection": _obj([], id=_STR, user=_STR, peer=_STR, vhost=_STR, channels=_INT,
                           connected_at_ms=_INT, heartbeat_s=_INT, frame_max=_INT,
                           connection_name=_STR, product=_STR),
    "AmqpChannel": _obj([], connection=_STR, number=_INT, user=_STR, vhost=_STR, peer=_STR,
                        consumers=_INT, messages_unacknowledged=_INT, prefetch_count=_INT,
                        global_prefetch_count=_INT, confirm=_BOOL, messages_unconfirmed=_INT),
    "Overview": _obj(
        ["status", "role", "connections", "messages", "alarms"],
        status={"type": "string", "enum": ["ok", "degraded", "failing"]},
        role={"type": "string", "description": "standalone, or the node's role in its group"},
        connections={"type": "object", "additionalProperties": _INT,
                     "description": "open connections per protocol, and total"},
        messages=_obj([], published=_INT, delivered=_INT, acked=_INT),
        alarms=_list(_obj(["name", "on"], name={"type": "string", "enum": ["disk", "memory"]},
                          on=_BOOL, detail={"type": "string", "description": "admins only"})),
        health={"type": "object", "description": "admins only: what /health answers"},
        cluster={"type": "object", "nullable": True, "description": "admins only"},
        store={**_obj([], bytes={"type": "integer", "nullable": True}, disk_free_bytes=_INT,
                      disk_total_bytes=_INT), "description": "admins only"}),
    "OverviewHistory": _obj(
        ["step_s", "t", "series"], step_s=_INT,
        t={**_list(_INT), "description": "sample times, seconds since the epoch, oldest first"},
        series={"type": "object", "additionalProperties": _list({"type": "number",
                                                                 "nullable": True}),
                "description": "one value per time: published_per_s, delivered_per_s, "
                               "acked_per_s, store_bytes, connections_mqtt, connections_amqp, "
                               "connections_native"}),
    "RetainedMessage": _obj(["topic", "size", "qos", "stored_ms"], topic=_STR, size=_INT,
                            qos=_INT, stored_ms=_INT),
    "SessionLogin": _obj(["user", "password"], user=_STR, password=_STR),
    "Session": _obj(["user", "admin", "csrf_token", "idle_timeout_s"], user=_STR, admin=_BOOL,
                    csrf_token={"type": "string", "description": "send it as X-CSRF-Token with "
                                "every write made with the session cookie"},
                    idle_timeout_s={"type": "integer", "description": "the session ends after "
                                    "this many seconds without a request"}),
    "AclRule": _obj([], user=_STR, pattern=_STR, actions=_ACTIONS,
                    effect={"type": "string", "enum": ["allow", "deny"]}),
    "AclRuleCreate": _obj(
        ["pattern", "actions", "effect"],
        user={"type": "string", "description": "a user name, or * (the default) for everyone"},
        pattern={"type": "string", "description": "an MQTT topic filter; %u is the user name, "
                                                  "%c the client id"},
        actions={"type": "array", "items": {"type": "string", "enum": ["publish", "subscribe"]}},
        effect={"type": "string", "enum": ["allow", "deny"]}),
    "CloudEvent": {**_obj(["id", "source", "specversion", "type"], id=_STR, source=_STR,
                          specversion={"type": "string", "enum": ["1.0"]}, type=_STR,
                          datacontenttype=_STR, dataschema=_STR, subject=_STR, time=_STR,
                          data={"description": "the data: JSON, or text when datacontenttype "
                                               "is not JSON"},
                          data_base64=_STR),
                   "additionalProperties": True,
                   "description": "CloudEvents 1.0 in the JSON event format; extension "
                                  "attributes as further members"},
    "EventsAccepted": _obj(["subject", "topic", "ids"], subject=_STR, topic={
        "type": "string", "description": "the topic the subject is stored in (its first level)"},
        ids={**_list(_STR), "description": "the stored message ids, one per event, in order"}),
    "ApiToken": _obj(["id", "user", "created_ms"], id=_STR, user=_STR, created_ms=_INT,
                     last_used_ms={"type": "integer", "nullable": True,
                                   "description": "last use, to about a minute (null: never)"}),
    "ApiTokenCreated": {"allOf": [_ref("ApiToken"), _obj(["token"], token={
        "type": "string", "description": "the token (slt_...), shown only here: send it as "
                                         "Authorization: Bearer TOKEN"})]},
}


def document(routes: Any) -> dict[str, Any]:
    """The OpenAPI 3.0 document describing exactly ``routes``."""
    paths: dict[str, dict[str, Any]] = {}
    for route in routes:
        paths.setdefault(route.template, {})[route.method.lower()] = _operation(route)
    return {
        "openapi": "3.0.3",
        "info": {"title": TITLE, "version": VERSION,
                 "description": "Manage topics, consumer groups, users and permissions; look up "
                                "messages; publish CloudEvents; read health and metrics. "
                                "Authenticate with HTTP Basic or a user's API token (Bearer), "
                                "or sign a browser in with POST /session and send the session "
                                "cookie (writes also carry X-CSRF-Token)."},
        "paths": paths,
        "components": {"schemas": SCHEMAS,
                       "securitySchemes": {
                           "basic": {"type": "http", "scheme": "basic"},
                           "bearer": {"type": "http", "scheme": "bearer",
                                      "description": "a user's API token (POST /users/{user}/tokens)"},
                           "session": {"type": "apiKey", "in": "cookie", "name": "sluice_session"}}},
        "security": [{"basic": []}, {"bearer": []}, {"session": []}],
    }


def _operation(route: Any) -> dict[str, Any]:
    parameters = [{"name": name, "in": "path", "required": True, "schema": _STR}
                  for name in re.findall(r"{(\w+)}", route.template)]
    parameters += [{"name": q.name, "in": "query", "required": q.required,
                    "description": q.description, "schema": {"type": q.type}} for q in route.query]
    operation: dict[str, Any] = {
        "operationId": route.operation_id, "summary": route.summary, "tags": [route.tag],
        "description": f"Access: {route.access.describe}",
        "responses": {str(route.status): _success(route), **_errors(route)},
    }
    if parameters:
        operation["parameters"] = parameters
    if route.body in RAW_BODIES:
        operation["requestBody"] = {"required": False, "content": RAW_BODIES[route.body]}
    elif route.body:
        operation["requestBody"] = {"required": True, "content": {
            "application/json": {"schema": _ref(route.body)}}}
    if route.access is Access.PUBLIC or (route.access is Access.SESSION and route.body):
        operation["security"] = []
    elif route.access is Access.SESSION:
        operation["security"] = [{"session": []}]
    return operation


RAW_BODIES = {"CloudEvent": {
    "application/cloudevents+json": {"schema": _ref("CloudEvent")},
    "application/cloudevents-batch+json": {"schema": _list(_ref("CloudEvent"))},
    "*/*": {"schema": {"type": "string", "format": "binary", "description": "binary mode: the "
                       "event's data; its attributes as ce-id, ce-source, ce-specversion, "
                       "ce-type (and ce-<extension>) headers"}}}}
"""Request bodies a handler reads itself, in these media types, rather than as JSON."""

MEDIA_TYPES = {"text": "text/plain", "html": "text/html", "asset": "text/plain",
                "ndjson": "application/x-ndjson"}
"""Responses that are not JSON documents, by the route table's ``response`` name."""


def _success(route: Any) -> dict[str, Any]:
    success = _success_body(route)
    if route.headers:
        success["headers"] = {h.name: {"description": h.description, "schema": _STR}
                              for h in route.headers}
    return success


def _success_body(route: Any) -> dict[str, Any]:
    if route.status == 204 or route.response is None:
        return {"description": "done"}
    if route.response in MEDIA_TYPES:
        return {"description": "ok", "content": {MEDIA_TYPES[route.response]: {"schema": _STR}}}
    if route.response == "object":
        schema: dict[str, Any] = {"type": "object"}
    elif route.response.startswith("["):
        schema = _list(_ref(route.response.strip("[]")))
    else:
        schema = _ref(route.response)
    return {"description": "ok", "content": {"application/json": {"schema": schema}}}


def _errors(route: Any) -> dict[str, Any]:
    statuses = {500, 503}
    if route.access is not Access.PUBLIC:
        statuses |= {401}
    if route.access not in (Access.PUBLIC, Access.USER) or route.method not in SAFE_METHODS:
        statuses |= {403}
    if "{" in route.path or route.body:
        statuses |= {400, 404, 409} if route.body else {404}
    if route.body:
        statuses |= {413, 415}
    if route.body in RAW_BODIES:
        statuses -= {404, 409}
    if route.query:
        statuses.add(400)
    known = {status for status, _ in STATUS.values()} | {415}
    error = {"content": {"application/json": {"schema": _ref("Error")}}}
    return {str(s): {"description": _reason(s), **error} for s in sorted(statuses & known)}


def _reason(status: int) -> str:
    return {400: "invalid request", 401: "missing or wrong credentials",
            403: "not allowed for this user, or a write from another origin",
            404: "no such resource", 409: "already exists", 413: "request body too large",
            415: "body not sent in a media type the call takes", 500: "internal error",
            503: "unavailable"}.get(status, "error")
