"""The admin API's route table: the one source of both the aiohttp routes and the OpenAPI document.

Each ``Route`` names its method, path, handler, access rule, query parameters, request body
schema and success response; ``server.py`` registers exactly these routes and ``openapi.py``
documents exactly these routes, so the two cannot drift.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
import re
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from core.model import Principal

from . import (acl, clients, console_files, dashboard_files, history, ingress, metrics,
               mqtt_retained, overview, push, sessions, tail, tier, tokens, vhosts)
from . import handlers as h
from . import paging
from .access import Access

Handler = Callable[[web.Request, Principal], Awaitable[Any]]


@dataclass(frozen=True)
class Query:
    """A query parameter."""

    name: str
    description: str
    required: bool = False
    type: str = "string"


@dataclass(frozen=True)
class Header:
    """A response header."""

    name: str
    description: str


@dataclass(frozen=True)
class Route:
    """One operation: ``response`` names a schema in ``openapi.SCHEMAS`` (``[X]`` is a list)."""

    method: str
    path: str
    handler: Handler
    summary: str
    tag: str
    access: Access
    status: int = 200
    response: str | None = None
    body: str | None = None
    query: tuple[Query, ...] = ()
    headers: tuple[Header, ...] = ()
    """Headers of the success response."""
    search: tuple[str, ...] = ()
    """The row fields ``?q=`` searches; a route naming some is a paged list (``paging.py``)."""

    @property
    def operation_id(self) -> str:
        return self.handler.__name__

    @property
    def template(self) -> str:
        """The path as OpenAPI and the request counter name it: ``{topic:.+}`` is ``{topic}``."""
        return re.sub(r"{(\w+):[^}]+}", r"{\1}", self.path)


async def openapi(request: web.Request, principal: Principal) -> dict[str, Any]:
    """The OpenAPI 3 document of ROUTES."""
    from .openapi import document

    return document(ROUTES)


R = Route
A = Access
VH = Query("vhost", "only this virtual host's")
IN_TOPIC = Query("topic", "only the message of this topic with the id (producers choose ids, so "
                 "several topics may hold one)")
LINK_NEXT = Header("Link", 'while more messages follow: <URL>; rel="next", URL being this '
                   "lookup with after=CURSOR")
PAGE = (Query("limit", f"at most this many rows: 1-{paging.MAX_LIMIT} (default: all)",
               type="integer"),
        Query("offset", "skip this many rows first (default 0)", type="integer"),
        Query("sort", "order by this field of the rows; -FIELD for descending"),
        Query("q", "only rows whose identifying text holds this (case-insensitive)"))
TOTAL = Header(paging.TOTAL_HEADER, "the number of rows after filtering with q, before limit "
               "and offset")


def paged(*search: str, query: tuple[Query, ...] = ()) -> dict[str, Any]:
    """A paged list route's ``query`` (its own, then the paging ones), ``headers`` and
    ``search`` (the fields ``q`` searches)."""
    return {"query": (*query, *PAGE), "headers": (TOTAL,), "search": search}


ROUTES: tuple[Route, ...] = (
    R("GET", "/health", h.health, "Store and metadata status (503 when failing)", "service",
      A.PUBLIC, response="Health"),
    R("GET", "/cluster", h.cluster, "The replica group: leader, epoch, in-sync set, each node's role "
      "and lag (404 for a single broker)", "service", A.PUBLIC, response="object"),
    R("GET", "/metrics", metrics.metrics, "Prometheus metrics (text exposition format)", "service",
      A.PUBLIC, response="text"),
    R("GET", "/dashboard", dashboard_files.page,
      "Live telemetry dashboard (HTML; ?topic=the results topic, default telemetry.results)",
      "console", A.PUBLIC, response="html"),
    R("GET", "/dashboard/{asset}", dashboard_files.asset, "The dashboard's script and style sheet",
      "console", A.PUBLIC, response="asset"),
    R("GET", "/console", console_files.console_page,
      "The web console (HTML): sign in, then clients, topics, queues, groups, messages, users",
      "console", A.PUBLIC, response="html"),
    R("GET", "/console/{file}", console_files.console_asset,
      "The console's modules and style sheet", "console", A.PUBLIC, response="asset"),
    R("GET", "/console/vendor/{file}", console_files.console_vendor_asset,
      "The libraries the console loads (preact, htm, uPlot)", "console", A.PUBLIC,
      response="asset"),
    R("GET", "/openapi.json", openapi, "This document", "service", A.PUBLIC, response="object"),
    R("POST", "/session", sessions.sign_in,
      "Sign a browser in: check user and password (throttled like every login), set the "
      "session cookie; writes with the cookie send the answer's csrf_token as X-CSRF-Token",
      "session", A.SESSION, body="SessionLogin", response="Session"),
    R("GET", "/session", sessions.show, "The browser session of the cookie (401 without one)",
      "session", A.SESSION, response="Session"),
    R("DELETE", "/session", sessions.sign_out, "Sign out: end the session, clear the cookie",
      "session", A.SESSION, status=204),

    R("GET", "/tier", tier.tier_status,
      "Tiered storage: where the tier is, what it holds per topic, what waits to be tiered, "
      "the lag, the last success and the last error (404 without tier.url)", "service",
      A.ADMIN, response="TierStatus"),
    R("POST", "/tier/run", tier.tier_run,
      "Tier every pending sealed segment, apply tier retention, then run local retention now "
      "(which may delete the segments just tiered); the status afterwards, with what local "
      "retention deleted (503 while the object store fails, 409 once a newer leader tiers)", "service", A.ADMIN,
      response="TierStatus"),

    R("GET", "/overview", overview.overview,
      "The broker at a glance: health, role, connections per protocol, message totals, "
      "alarms (disk, memory); admins also get store size, disk space and the checks",
      "service", A.USER, response="Overview"),
    R("GET", "/overview/history", history.overview_history,
      f"The last hour, sampled every {history.STEP_S} s: message rates, store size, "
      "connections per protocol", "service", A.USER, response="OverviewHistory"),

    R("GET", "/topics", h.list_topics, "List topics", "topics", A.USER, response="[Topic]",
      **paged("name", query=(Query("internal", "true: include internal topics (%SYS%..., the "
                                   "broker's own state; admins only)", type="boolean"),))),
    R("POST", "/topics", h.create_topic, "Create a topic", "topics", A.ADMIN, status=201,
      body="TopicCreate", response="Topic"),
    R("GET", "/topics/{topic}", h.describe_topic, "Describe a topic with per-queue offset ranges",
      "topics", A.TOPIC, response="TopicDetail"),
    R("PATCH", "/topics/{topic}", h.update_topic,
      "Change a topic's retention, tier retention and body schema (the fields sent; null "
      "clears one)", "topics", A.ADMIN, body="TopicUpdate", response="Topic"),
    R("DELETE", "/topics/{topic}", h.delete_topic, "Delete a topic", "topics", A.ADMIN, status=204),
    R("GET", "/topics/{topic}/messages", h.topic_messages,
      "Look up messages by business key (newest first, a page at a time: while more carry the "
      "key, a Link header with rel=\"next\" names the next page), or stored in a time range",
      "messages", A.SUBSCRIBE, response="[Message]", headers=(LINK_NEXT,),
      query=(Query("key", "the business key the producer set"),
             Query("after", "with key: the page after the one whose Link header named it"),
             Query("from", "with no key: the first store time, ms since the epoch", type="integer"),
             Query("to", "with from: the last store time (default now)", type="integer"),
             Query("limit", "at most this many messages: 1-1000, default 32", type="integer"))),
    R("GET", "/topics/{topic}/tail", tail.tail_topic,
      "Stream a topic's recent messages, then new ones as they arrive (newline-delimited JSON)",
      "messages", A.SUBSCRIBE, response="ndjson",
      query=(Query("minutes", "send messages stored in the last MINUTES first (default 60)",
                   type="integer"),)),
    R("GET", "/messages/{msg_id}", h.message_by_id,
      "Look up a message by id among the topics you may read (the newest when several share "
      "the id; the others in same_id)", "messages", A.USER, response="MessageById",
      query=(IN_TOPIC,)),
    R("GET", "/messages/{msg_id}/trace", h.message_trace,
      "A message's path: stored, delivered to which group and client, retried, acked, "
      "dead-lettered, with times (needs core.message_trace)", "messages", A.USER,
      response="MessageTrace", query=(IN_TOPIC,)),

    R("POST", "/events/{topic:.+}", ingress.post_event,
      "Publish CloudEvents to a subject (the path after /events/, levels separated by /): "
      "binary mode (ce- headers, the body as data), structured or batched mode (JSON); 202 "
      "once stored durably, with the message ids", "events", A.PUBLISH, status=202,
      body="CloudEvent", response="EventsAccepted",
      query=(Query("access_token", "an API token, for senders that cannot set an Authorization "
                   "header (RFC 6750, section 2.3); only this route takes one in its URL"),)),

    R("GET", "/groups", h.list_groups, "List consumer groups", "groups", A.USER,
      response="[Group]", **paged("name")),
    R("POST", "/groups", h.create_group, "Create a consumer group", "groups", A.ADMIN,
      status=201, body="GroupCreate", response="Group"),
    R("GET", "/groups/{group}", h.describe_group,
      "Describe a group: members, subscriptions and lag per queue", "groups", A.GROUP,
      response="GroupDetail"),
    R("DELETE", "/groups/{group}", h.delete_group, "Delete a consumer group", "groups", A.ADMIN,
      status=204),
    R("POST", "/groups/{group}/reset-offset", h.reset_offset,
      "Move a group's committed offsets on a topic to a time", "groups", A.ADMIN,
      body="ResetOffset", response="ResetResult"),

    R("GET", "/users", h.list_users, "List users", "users", A.ADMIN, response="[User]",
      **paged("name")),
    R("POST", "/users", h.create_user, "Create a user", "users", A.ADMIN, status=201,
      body="UserCreate", response="User"),
    R("DELETE", "/users/{user}", h.delete_user, "Delete a user", "users", A.ADMIN, status=204),
    R("PUT", "/users/{user}/password", h.set_password, "Set a user's password", "users", A.ADMIN,
      status=204, body="Password"),
    R("GET", "/users/{user}/tokens", tokens.list_tokens,
      "List a user's API tokens: ids, when made and last used (never the tokens)", "users",
      A.SELF, response="[ApiToken]"),
    R("POST", "/users/{user}/tokens", tokens.create_token,
      "Make an API token for a user (send it as Authorization: Bearer TOKEN); the answer is the "
      "only place the token is shown", "users", A.SELF, status=201, response="ApiTokenCreated"),
    R("DELETE", "/users/{user}/tokens/{token_id}", tokens.delete_token,
      "Delete one of a user's API tokens: it stops working at once", "users", A.SELF,
      status=204),
    R("GET", "/users/{user}/permissions", h.list_permissions, "List a user's permissions",
      "permissions", A.ADMIN, response="[Permission]"),
    R("POST", "/users/{user}/permissions", h.grant, "Grant a permission", "permissions", A.ADMIN,
      status=201, body="Grant", response="Permission"),
    R("DELETE", "/users/{user}/permissions", h.revoke, "Revoke a permission", "permissions",
      A.ADMIN, status=204,
      query=(Query("kind", "topic or group", required=True),
             Query("pattern", "the granted pattern, exactly as granted", required=True))),

    R("GET", "/acl", acl.list_rules, "List access-control rules on MQTT topics", "acl", A.ADMIN,
      response="[AclRule]", **paged("user", "pattern", query=(
          Query("user", "only the rules that apply to this user (its own and everyone's)"),))),
    R("POST", "/acl", acl.add_rule, "Add an access-control rule (allow or deny)", "acl", A.ADMIN,
      status=201, body="AclRuleCreate", response="AclRule"),
    R("DELETE", "/acl", acl.remove_rule, "Remove an access-control rule", "acl", A.ADMIN,
      status=204,
      query=(Query("pattern", "the rule's pattern, exactly as added", required=True),
             Query("effect", "allow or deny", required=True),
             Query("user", "the rule's user (default *, everyone)"))),

    R("GET", "/clients", clients.list_clients,
      "List connected clients and kept sessions of every protocol", "clients", A.ADMIN,
      response="[Client]", **paged("client_id", "user", "address", "protocol", query=(
          Query("protocol", "only this protocol's clients (mqtt, amqp, native)"),
          Query("user", "only this user's clients"),
          Query("connected", "true: only connected clients, not kept sessions",
                type="boolean")))),
    R("GET", "/mqtt/retained", mqtt_retained.list_retained,
      "List MQTT retained messages by topic: size, QoS, when stored (not their bodies)",
      "clients", A.ADMIN, response="[RetainedMessage]",
      **paged("topic", query=(Query("prefix", "only topics that start with this"),))),
    R("GET", "/clients/{protocol}/{client_id}", clients.show_client,
      "Show one client: address, user, subscriptions, protocol details", "clients", A.ADMIN,
      response="Client"),
    R("DELETE", "/clients/{protocol}/{client_id}", clients.kick_client,
      "Disconnect a client (its session stays as the protocol keeps it)", "clients", A.ADMIN,
      status=204),

    R("GET", "/vhosts", vhosts.list_vhosts,
      "List AMQP virtual hosts (a user sees those it has a permission on)", "vhosts", A.USER,
      response="[Vhost]", **paged("name")),
    R("POST", "/vhosts", vhosts.create_vhost, "Create a virtual host", "vhosts", A.ADMIN,
      status=201, body="VhostCreate", response="Vhost"),
    R("DELETE", "/vhosts/{vhost}", vhosts.delete_vhost,
      "Delete a virtual host with everything in it (its connections are closed)", "vhosts",
      A.ADMIN, status=204),
    R("GET", "/vhost-permissions", vhosts.list_vhost_permissions,
      "List users' permissions on virtual hosts", "vhosts", A.ADMIN,
      response="[VhostPermission]", **paged("user", "vhost", query=(
          Query("vhost", "only this virtual host's"), Query("user", "only this user's")))),
    R("PUT", "/vhosts/{vhost}/permissions/{user}", vhosts.set_vhost_permission,
      "Set a user's configure / write / read expressions on a virtual host", "vhosts", A.ADMIN,
      body="VhostPermissionSet", response="VhostPermission"),
    R("DELETE", "/vhosts/{vhost}/permissions/{user}", vhosts.clear_vhost_permission,
      "Clear a user's permission on a virtual host", "vhosts", A.ADMIN, status=204),
    R("GET", "/exchanges", vhosts.list_exchanges, "List AMQP exchanges", "amqp", A.ADMIN,
      response="[Exchange]", **paged("vhost", "name", "type", query=(VH,))),
    R("GET", "/queues", vhosts.list_queues,
      "List AMQP queues: messages ready and unacknowledged, consumers, totals and rates",
      "amqp", A.ADMIN, response="[AmqpQueue]", **paged("vhost", "name", query=(VH,))),
    R("GET", "/queues/{vhost}/{queue}", vhosts.show_queue, "Show one AMQP queue", "amqp",
      A.ADMIN, response="AmqpQueue"),
    R("DELETE", "/queues/{vhost}/{queue}", vhosts.delete_queue,
      "Delete an AMQP queue (its consumers are cancelled)", "amqp", A.ADMIN,
      response="MessageCount",
      query=(Query("if_unused", "true: only if it has no consumers", type="boolean"),
             Query("if_empty", "true: only if no message is ready", type="boolean"))),
    R("POST", "/queues/{vhost}/{queue}/purge", vhosts.purge_queue,
      "Purge an AMQP queue: settle every ready message (the log keeps them)", "amqp", A.ADMIN,
      response="MessageCount"),
    R("GET", "/bindings", vhosts.list_bindings, "List AMQP bindings", "amqp", A.ADMIN,
      response="[AmqpBinding]",
      **paged("vhost", "source", "destination", "routing_key", query=(VH,))),
    R("GET", "/amqp/connections", vhosts.list_amqp_connections, "List AMQP connections",
      "amqp", A.ADMIN, response="[AmqpConnection]",
      **paged("id", "user", "peer", "vhost", "connection_name")),
    R("GET", "/amqp/channels", vhosts.list_channels, "List AMQP channels", "amqp", A.ADMIN,
      response="[AmqpChannel]", **paged("connection", "user", "vhost", "peer")),

    R("GET", "/push-subscriptions", push.list_push_subscriptions,
      "List push subscriptions with their delivery stats (a user sees its own, an admin all)",
      "push", A.USER, response="[PushSubscription]", **paged("name", "owner", "topic", "sink")),
    R("POST", "/push-subscriptions", push.create_push_subscription,
      "Create a push subscription owned by the caller (needs subscribe on its topic, publish on "
      "its reply topic); the answer holds the signing secret, shown only here", "push", A.USER,
      status=201, body="PushSubscriptionCreate", response="PushSubscriptionCreated"),
    R("GET", "/push-subscriptions/{name}", push.show_push_subscription,
      "Show a push subscription with its delivery stats (owner or admin; 404 to others)",
      "push", A.USER, response="PushSubscription"),
    R("POST", "/push-subscriptions/{name}/pause", push.pause_push_subscription,
      "Pause a push subscription: stop taking messages, keep its position", "push", A.USER,
      response="PushSubscription"),
    R("POST", "/push-subscriptions/{name}/resume", push.resume_push_subscription,
      "Resume a paused push subscription from its position", "push", A.USER,
      response="PushSubscription"),
    R("DELETE", "/push-subscriptions/{name}", push.delete_push_subscription,
      "Delete a push subscription and its position", "push", A.USER, status=204),
)
