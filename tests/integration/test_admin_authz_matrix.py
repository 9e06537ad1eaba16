"""The admin API's authorization matrix: every route × {admin, owner, publish-only, other user,
no rights, anonymous}, over real HTTP. The expected status of each cell is written out here,
not derived from the access rules, and the table must name every route the API serves."""
from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from http.client import HTTPConnection
from urllib.parse import urlsplit

import pytest

from core.model import SYSTEM, OutgoingMessage
from protocols.admin.routes import ROUTES
from tests.integration.test_admin_api import BrokerThread, Http
from tests.integration.test_admin_hardening import basic

ROLES = ("admin", "owner", "publisher", "other", "none", "anonymous")
PASSWORD = "pw"
CREDENTIALS = {"admin": basic("sluice", "sluice"), "anonymous": {},
               **{role: basic(role, PASSWORD) for role in ("owner", "publisher", "other", "none")}}
GRANTS = {  # role -> (kind, pattern, actions)
    "owner": [("topic", "m-topic", ["publish", "subscribe"]), ("group", "m-group", ["subscribe"])],
    "publisher": [("topic", "m-topic", ["publish"])],
    "other": [("topic", "o-topic", ["publish", "subscribe"]), ("group", "o-group", ["subscribe"])],
    "none": [],
}


def only_admin(code: int) -> dict[str, int]:
    return {"admin": code, "owner": 403, "publisher": 403, "other": 403, "none": 403,
            "anonymous": 401}


def OWNED_PUSH(code: int) -> dict[str, int]:  # noqa: N802 - reads as a constant in the table
    """A push subscription the owner made: its owner and admins, and a 404 for others."""
    return {"admin": code, "owner": code, "publisher": 404, "other": 404, "none": 404,
            "anonymous": 401}


PUSH_SINK = "http://127.0.0.1:9/hook"
"""Nothing listens there: deliveries fail and retry, which no cell depends on."""
EVERYONE_200 = dict.fromkeys(ROLES, 200)
USERS_200 = {**dict.fromkeys(ROLES, 200), "anonymous": 401}


@dataclass(frozen=True)
class Cell:
    """One route: how to call it (``{n}`` is a fresh number for what an admin may destroy)."""

    method: str
    path: str
    route: str
    expect: dict[str, int]
    body: dict | None = None
    fresh: str | None = None
    headers: dict[str, str] | None = None
    """Headers of the request besides the credentials (a CloudEvent's ce- headers)."""
    """What the admin's call consumes (topic, group, user, rule, vhost, queue): ``x-{kind}-{n}``."""


TABLE = [
    Cell("GET", "/health", "/health", EVERYONE_200),
    Cell("GET", "/metrics", "/metrics", EVERYONE_200),
    Cell("GET", "/cluster", "/cluster", dict.fromkeys(ROLES, 404)),  # a single broker: no group to show
    Cell("GET", "/dashboard", "/dashboard", EVERYONE_200),
    Cell("GET", "/dashboard/dashboard.js", "/dashboard/{asset}", EVERYONE_200),
    Cell("GET", "/console", "/console", EVERYONE_200),
    Cell("GET", "/console/app.js", "/console/{file}", EVERYONE_200),
    Cell("GET", "/console/vendor/preact.mjs", "/console/vendor/{file}", EVERYONE_200),
    Cell("GET", "/openapi.json", "/openapi.json", EVERYONE_200),
    # signing in takes the credentials in the body ({user}, {password}: the role's own; none for
    # anonymous); showing and ending a session take its cookie, so Basic alone is a 401
    Cell("POST", "/session", "/session", {**EVERYONE_200, "anonymous": 400},
         body={"user": "{user}", "password": "{password}"}),
    Cell("GET", "/session", "/session", dict.fromkeys(ROLES, 401)),
    Cell("DELETE", "/session", "/session", dict.fromkeys(ROLES, 401)),
    Cell("GET", "/tier", "/tier", only_admin(200)),
    Cell("POST", "/tier/run", "/tier/run", only_admin(200)),
    Cell("GET", "/overview", "/overview", USERS_200),  # admins get more: test_admin_console_api.py
    Cell("GET", "/overview/history", "/overview/history", USERS_200),
    Cell("GET", "/mqtt/retained", "/mqtt/retained", only_admin(200)),
    Cell("GET", "/topics", "/topics", USERS_200),
    Cell("POST", "/topics", "/topics", only_admin(201), body={"name": "new-topic-{n}"}),
    Cell("GET", "/topics/m-topic", "/topics/{topic}",
         {"admin": 200, "owner": 200, "publisher": 200, "other": 403, "none": 403, "anonymous": 401}),
    Cell("PATCH", "/topics/{target}", "/topics/{topic}", only_admin(200), fresh="topic",
         body={"tier_retention_ms": 86_400_000}),
    Cell("DELETE", "/topics/{target}", "/topics/{topic}", only_admin(204), fresh="topic"),
    Cell("GET", "/topics/m-topic/messages?key=k", "/topics/{topic}/messages",
         {"admin": 200, "owner": 200, "publisher": 403, "other": 403, "none": 403, "anonymous": 401}),
    Cell("GET", "/topics/m-topic/tail", "/topics/{topic}/tail",
         {"admin": 200, "owner": 200, "publisher": 403, "other": 403, "none": 403, "anonymous": 401}),
    Cell("GET", "/messages/{msg_id}", "/messages/{msg_id}",
         {"admin": 200, "owner": 200, "publisher": 404, "other": 404, "none": 404, "anonymous": 401}),
    Cell("GET", "/messages/{msg_id}/trace", "/messages/{msg_id}/trace",
         {"admin": 200, "owner": 200, "publisher": 404, "other": 404, "none": 404, "anonymous": 401}),
    # a binary-mode CloudEvent: publishing needs the publish right on the subject's topic
    Cell("POST", "/events/m-topic/a/b", "/events/{topic:.+}",
         {"admin": 202, "owner": 202, "publisher": 202, "other": 403, "none": 403,
          "anonymous": 401}, body={"v": 1},
         headers={"ce-id": "1", "ce-source": "/matrix", "ce-specversion": "1.0", "ce-type": "t"}),
    Cell("GET", "/groups", "/groups", USERS_200),
    Cell("POST", "/groups", "/groups", only_admin(201), body={"name": "new-group-{n}"}),
    Cell("GET", "/groups/m-group", "/groups/{group}",
         {"admin": 200, "owner": 200, "publisher": 403, "other": 403, "none": 403, "anonymous": 401}),
    Cell("DELETE", "/groups/{target}", "/groups/{group}", only_admin(204), fresh="group"),
    Cell("POST", "/groups/m-group/reset-offset", "/groups/{group}/reset-offset", only_admin(200),
         body={"topic": "m-topic", "to": "earliest"}),
    Cell("GET", "/users", "/users", only_admin(200)),
    Cell("POST", "/users", "/users", only_admin(201), body={"name": "new-user-{n}", "password": "x"}),
    Cell("DELETE", "/users/{target}", "/users/{user}", only_admin(204), fresh="user"),
    Cell("PUT", "/users/{target}/password", "/users/{user}/password", only_admin(204),
         body={"password": "changed"}, fresh="user"),
    # a user's API tokens: an admin's or the user's own (owner's, here)
    Cell("GET", "/users/owner/tokens", "/users/{user}/tokens", {**only_admin(200), "owner": 200}),
    Cell("POST", "/users/owner/tokens", "/users/{user}/tokens", {**only_admin(201), "owner": 201}),
    Cell("DELETE", "/users/owner/tokens/{target}", "/users/{user}/tokens/{token_id}",
         {**only_admin(204), "owner": 204}, fresh="token"),
    Cell("GET", "/users/owner/permissions", "/users/{user}/permissions", only_admin(200)),
    Cell("POST", "/users/{target}/permissions", "/users/{user}/permissions", only_admin(201),
         body={"kind": "topic", "pattern": "m-topic", "actions": ["subscribe"]}, fresh="user"),
    Cell("DELETE", "/users/{target}/permissions?kind=topic&pattern=m-topic",
         "/users/{user}/permissions", only_admin(204), fresh="user"),
    Cell("GET", "/acl", "/acl", only_admin(200)),
    Cell("POST", "/acl", "/acl", only_admin(201),
         body={"pattern": "new-rule-{n}/#", "actions": ["publish"], "effect": "deny"}),
    Cell("DELETE", "/acl?pattern={target}&effect=allow", "/acl", only_admin(204), fresh="rule"),
    Cell("GET", "/clients", "/clients", only_admin(200)),
    Cell("GET", "/clients/native/nobody", "/clients/{protocol}/{client_id}", only_admin(404)),
    Cell("DELETE", "/clients/native/nobody", "/clients/{protocol}/{client_id}", only_admin(404)),
    Cell("GET", "/vhosts", "/vhosts", USERS_200),
    Cell("POST", "/vhosts", "/vhosts", only_admin(201), body={"name": "new-vhost-{n}"}),
    Cell("DELETE", "/vhosts/{target}", "/vhosts/{vhost}", only_admin(204), fresh="vhost"),
    Cell("GET", "/vhost-permissions", "/vhost-permissions", only_admin(200)),
    Cell("PUT", "/vhosts/m-vhost/permissions/{target}", "/vhosts/{vhost}/permissions/{user}",
         only_admin(200), body={"configure": "", "write": "", "read": ".*"}, fresh="user"),
    Cell("DELETE", "/vhosts/m-vhost/permissions/{target}", "/vhosts/{vhost}/permissions/{user}",
         only_admin(204), fresh="user"),
    Cell("GET", "/exchanges", "/exchanges", only_admin(200)),
    Cell("GET", "/queues", "/queues", only_admin(200)),
    Cell("GET", "/queues/m-vhost/m-queue", "/queues/{vhost}/{queue}", only_admin(200)),
    Cell("DELETE", "/queues/m-vhost/{target}", "/queues/{vhost}/{queue}", only_admin(200),
         fresh="queue"),
    Cell("POST", "/queues/m-vhost/{target}/purge", "/queues/{vhost}/{queue}/purge",
         only_admin(200), fresh="queue"),
    Cell("GET", "/bindings", "/bindings", only_admin(200)),
    Cell("GET", "/amqp/connections", "/amqp/connections", only_admin(200)),
    Cell("GET", "/amqp/channels", "/amqp/channels", only_admin(200)),
    # push subscriptions: any user may create one on a topic it may subscribe to; only its
    # owner and admins see or change it, to everyone else it does not exist (404)
    Cell("GET", "/push-subscriptions", "/push-subscriptions", USERS_200),
    Cell("POST", "/push-subscriptions", "/push-subscriptions",
         {"admin": 201, "owner": 201, "publisher": 403, "other": 403, "none": 403,
          "anonymous": 401},
         body={"name": "new-push-{n}", "topic": "m-topic", "sink": PUSH_SINK}),
    Cell("GET", "/push-subscriptions/m-push", "/push-subscriptions/{name}", OWNED_PUSH(200)),
    Cell("POST", "/push-subscriptions/m-push/pause", "/push-subscriptions/{name}/pause",
         OWNED_PUSH(200)),
    Cell("POST", "/push-subscriptions/m-push/resume", "/push-subscriptions/{name}/resume",
         OWNED_PUSH(200)),
    Cell("DELETE", "/push-subscriptions/{target}", "/push-subscriptions/{name}", OWNED_PUSH(204),
         fresh="push"),
]
"""Every cell of a non-admin write names a resource that exists, so a 403 is the rule, not a
missing thing; the victims of refused writes are checked to be untouched afterwards. (The
client cells name no connected client: tests/integration/test_clients.py refuses a non-admin's
kick of a connected one.)"""


@dataclass
class World:
    broker: BrokerThread
    admin: Http
    msg_id: str
    counter: itertools.count
    victim_token: str
    """The id of an API token of owner's that no refused call may delete."""


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    broker = BrokerThread(str(tmp_path_factory.mktemp("matrix") / "data"),
                          **{"core.message_trace": True, "push.allowed_sinks": "127.0.0.0/8",
                             "tier.url": (tmp_path_factory.mktemp("tier")).as_uri()})
    admin = Http(broker.running.admin_url)
    for name in ("m-topic", "o-topic"):
        assert admin("POST", "/topics", {"name": name, "queue_count": 1})[0] == 201
    for name in ("m-group", "o-group"):
        assert admin("POST", "/groups", {"name": name})[0] == 201
    rule = {"pattern": "m-rule/#", "actions": ["publish"], "effect": "allow"}
    assert admin("POST", "/acl", rule)[0] == 201
    for role, grants in GRANTS.items():
        assert admin("POST", "/users", {"name": role, "password": PASSWORD})[0] == 201
        for kind, pattern, actions in grants:
            grant = {"kind": kind, "pattern": pattern, "actions": actions}
            assert admin("POST", f"/users/{role}/permissions", grant)[0] == 201
    sent = broker.call(broker.running.broker.send(SYSTEM, [OutgoingMessage("m-topic", b"secret",
                                                                           keys=("k",))]))
    assert admin("POST", "/vhosts", {"name": "m-vhost"})[0] == 201
    rights = {"configure": "^m-", "write": "^m-", "read": "^m-"}
    assert admin("PUT", "/vhosts/m-vhost/permissions/owner", rights)[0] == 200
    declare_queue(broker, "m-queue", MESSAGES_IN_M_QUEUE)
    status, token, _ = admin("POST", "/users/owner/tokens")
    assert status == 201, token
    create_push(admin.url, "m-push")
    yield World(broker, admin, sent[0].msg_id, itertools.count(), token["id"])
    broker.stop()


def test_the_table_names_every_route_the_api_serves():
    assert {(c.method, c.route) for c in TABLE} == {(r.method, r.path) for r in ROUTES}
    assert all(set(c.expect) == set(ROLES) for c in TABLE)


def create_push(url: str, name: str) -> None:
    """A push subscription of m-topic owned by the owner role."""
    body = {"name": name, "topic": "m-topic", "sink": PUSH_SINK}
    assert Http(url, "owner", PASSWORD)("POST", "/push-subscriptions", body)[0] == 201


def fresh_target(world: World, kind: str) -> str:
    """A resource only this cell uses: the admin may delete or change it."""
    name = f"x-{kind}-{next(world.counter)}"
    if kind == "push":
        create_push(world.admin.url, name)
        return name
    if kind == "queue":
        declare_queue(world.broker, name, 1)
        return name
    if kind == "token":
        status, made, _ = world.admin("POST", "/users/owner/tokens")
        assert status == 201, made
        return made["id"]
    if kind == "rule":
        rule = {"pattern": name + "/#", "actions": ["subscribe"], "effect": "allow"}
        assert world.admin("POST", "/acl", rule)[0] == 201
        return rule["pattern"].replace("#", "%23")
    body = {"topic": {"name": name, "queue_count": 1}, "group": {"name": name},
            "user": {"name": name, "password": "x"}, "vhost": {"name": name}}[kind]
    assert world.admin("POST", f"/{kind}s", body)[0] == 201
    if kind == "user":
        grant = {"kind": "topic", "pattern": "m-topic", "actions": ["subscribe"]}
        assert world.admin("POST", f"/users/{name}/permissions", grant)[0] == 201
        rights = {"configure": "", "write": "", "read": "^m-"}
        assert world.admin("PUT", f"/vhosts/m-vhost/permissions/{name}", rights)[0] == 200
    return name


VICTIMS = {"topic": "m-topic", "group": "m-group", "user": "owner", "rule": "m-rule/%23",
           "vhost": "m-vhost", "queue": "m-queue", "token": "{victim_token}", "push": "m-push"}
MESSAGES_IN_M_QUEUE = 3


def declare_queue(broker: BrokerThread, name: str, messages: int) -> None:
    """A durable queue of m-vhost holding ``messages`` messages, published through AMQP."""
    import pika
    port = broker.running.amqp_listener.port
    connection = pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", port, "m-vhost", pika.PlainCredentials("sluice", "sluice"),
        connection_attempts=1, socket_timeout=10))
    try:
        channel = connection.channel()
        channel.queue_declare(name, durable=True)
        channel.confirm_delivery()
        for n in range(messages):
            channel.basic_publish("", name, b"m-%d" % n)
    finally:
        connection.close()


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("cell", TABLE, ids=lambda c: f"{c.method} {c.route}")
def test_matrix(world, cell, role):
    call(world, cell, role, CREDENTIALS[role], cell.expect[role])


def call(world: World, cell: Cell, role: str, credentials: dict[str, str], expected: int) -> bytes:
    """Make ``cell``'s request as ``role`` with ``credentials`` (headers); an error's body."""
    n = next(world.counter)
    target = (fresh_target(world, cell.fresh) if expected < 400 else VICTIMS[cell.fresh]) \
        if cell.fresh else ""
    target = target.replace("{victim_token}", world.victim_token)
    path = cell.path.format(target=target, msg_id=world.msg_id)
    user, password = (None, None) if role == "anonymous" else (
        ("sluice", "sluice") if role == "admin" else (role, PASSWORD))
    body = None if cell.body is None else json.loads(
        json.dumps(cell.body).replace("{n}", str(n)).replace('"{user}"', json.dumps(user))
        .replace('"{password}"', json.dumps(password)))
    headers = {**(cell.headers or {}), **credentials}
    if body is not None:
        headers["Content-Type"] = "application/json"
    parts = urlsplit(world.broker.running.admin_url)
    connection = HTTPConnection(parts.hostname, parts.port, timeout=20)
    try:
        connection.request(cell.method, path, body=None if body is None else json.dumps(body),
                           headers=headers)
        response = connection.getresponse()  # the status line only: a tail would stream on
        start = response.read(4000) if response.status >= 400 else b""
        assert response.status == expected, (role, cell.method, path, start)
    finally:
        connection.close()
    if cell.fresh and expected >= 400:
        assert_untouched(world)
    return start


def sign_in(world: World, role: str) -> dict[str, str]:
    """A fresh browser session of ``role``: the headers of its writes (cookie and CSRF token)."""
    user, password = ("sluice", "sluice") if role == "admin" else (role, PASSWORD)
    status, body, headers = Http(world.admin.url, None)("POST", "/session",
                                                        {"user": user, "password": password})
    assert status == 200, body
    cookie = headers["Set-Cookie"].split(";")[0]
    return {"Cookie": cookie, "X-CSRF-Token": body["csrf_token"]}


NOT_BY_SESSION = {"/session"}
"""Cells the session columns leave out: /session's own are in test_admin_sessions.py."""


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("cell", [c for c in TABLE if c.route not in NOT_BY_SESSION],
                         ids=lambda c: f"{c.method} {c.route}")
def test_matrix_with_a_browser_session(world, cell, role):
    """A session cookie with its CSRF token gets what the role's Basic credentials get."""
    credentials = {} if role == "anonymous" else sign_in(world, role)
    call(world, cell, role, credentials, cell.expect[role])


@pytest.fixture(scope="module")
def bearers(world) -> dict[str, dict[str, str]]:
    """Each role's API token as its Authorization header (none for anonymous), made with the
    role's password."""
    headers: dict[str, dict[str, str]] = {"anonymous": {}}
    for role in ROLES[:-1]:
        user, password = ("sluice", "sluice") if role == "admin" else (role, PASSWORD)
        status, made, _ = Http(world.admin.url, user, password)("POST", f"/users/{user}/tokens")
        assert status == 201, made
        headers[role] = {"Authorization": f"Bearer {made['token']}"}
    return headers


TOKEN_ROUTES = {"/users/{user}/tokens", "/users/{user}/tokens/{token_id}"}
"""Managing tokens takes the password: a token gets 403 there, whoever's it is."""


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("cell", [c for c in TABLE if c.route not in NOT_BY_SESSION],
                         ids=lambda c: f"{c.method} {c.route}")
def test_matrix_with_an_api_token(world, bearers, cell, role):
    """A role's API token gets what the role's Basic credentials get, but no token management."""
    expected = cell.expect[role]
    if cell.route in TOKEN_ROUTES and expected < 400:
        expected = 403
    call(world, cell, role, bearers[role], expected)


@pytest.mark.parametrize("csrf", ["missing", "wrong"])
@pytest.mark.parametrize("role", ["admin", "owner", "none"])
@pytest.mark.parametrize("cell", [c for c in TABLE if c.method != "GET"
                                  and c.route not in NOT_BY_SESSION],
                         ids=lambda c: f"{c.method} {c.route}")
def test_a_write_with_the_session_cookie_but_not_its_csrf_token_is_refused(world, cell, role,
                                                                          csrf):
    credentials = sign_in(world, role)
    if csrf == "missing":
        del credentials["X-CSRF-Token"]
    else:
        credentials["X-CSRF-Token"] = credentials["X-CSRF-Token"][::-1]
    refused = call(world, cell, role, credentials, 403)
    assert json.loads(refused)["error"] == "csrf"
    assert_untouched(world)


def assert_untouched(world: World) -> None:
    """The resources other roles' writes aimed at are still as the fixture made them."""
    assert world.admin("GET", "/topics/m-topic")[0] == 200
    assert world.admin("GET", "/groups/m-group")[0] == 200
    permissions = world.admin("GET", "/users/owner/permissions")[1]
    assert {(p["kind"], p["pattern"]) for p in permissions} == {("topic", "m-topic"),
                                                                 ("group", "m-group")}
    assert Http(world.admin.url, "owner", PASSWORD)("GET", "/topics")[0] == 200  # password kept
    assert {r["pattern"] for r in world.admin("GET", "/acl")[1]} >= {"m-rule/#"}
    assert "m-vhost" in {v["name"] for v in world.admin("GET", "/vhosts")[1]}
    assert world.admin("GET", "/push-subscriptions/m-push")[0] == 200
    assert [(p["user"], p["configure"], p["write"], p["read"]) for p in world.admin(
        "GET", "/vhost-permissions?user=owner")[1]] == [("owner", "^m-", "^m-", "^m-")]
    queue = world.admin("GET", "/queues/m-vhost/m-queue")[1]
    assert queue["messages_ready"] == MESSAGES_IN_M_QUEUE, queue
    assert world.victim_token in {t["id"] for t in world.admin("GET", "/users/owner/tokens")[1]}


LISTED = {  # role -> (topics, groups) its lists show, of those the fixture made
    "admin": ({"m-topic", "o-topic"}, {"m-group", "o-group"}),
    "owner": ({"m-topic"}, {"m-group"}),
    "publisher": ({"m-topic"}, set()),
    "other": ({"o-topic"}, {"o-group"}),
    "none": (set(), set()),
}


@pytest.mark.parametrize("role", LISTED)
def test_lists_show_each_role_only_what_it_has_a_right_on(world, role):
    user = Http(world.admin.url, *(("sluice", "sluice") if role == "admin" else (role, PASSWORD)))
    fixture_made = {"m-topic", "o-topic", "m-group", "o-group"}
    topics = {t["name"] for t in user("GET", "/topics")[1]} & fixture_made
    groups = {g["name"] for g in user("GET", "/groups")[1]} & fixture_made
    assert (topics, groups) == LISTED[role]


@pytest.mark.parametrize("role", LISTED)
def test_a_user_sees_the_vhosts_it_may_open(world, role):
    user = Http(world.admin.url, *(("sluice", "sluice") if role == "admin" else (role, PASSWORD)))
    assert ("m-vhost" in {v["name"] for v in user("GET", "/vhosts")[1]}) is (
        role in ("admin", "owner"))


CLI_CELLS = [  # the `sluice` commands over the routes above: (argv, admin's exit status)
    (["vhost", "list"], 0),
    (["vhost", "add", "cli-vhost-{n}"], 0),
    (["vhost", "permit", "owner", "m-vhost", "--configure", "^m-", "--write", "^m-", "--read",
      "^m-"], 0),
    (["vhost", "permissions", "--vhost", "m-vhost"], 0),
    (["queue", "list"], 0),
    (["queue", "purge", "{queue}", "--vhost", "m-vhost"], 0),
    (["queue", "delete", "{queue}", "--vhost", "m-vhost"], 0),
    (["exchange", "list", "--vhost", "m-vhost"], 0),
    (["binding", "list"], 0),
    (["channel", "list"], 0),
]


@pytest.mark.parametrize("role", ["admin", "owner", "none"])
@pytest.mark.parametrize("argv", CLI_CELLS, ids=lambda c: " ".join(c[0][:2]))
def test_the_cli_does_what_the_api_allows(world, capsys, role, argv):
    from sluice.cli import main
    command, admin_status = argv
    user, password = ("sluice", "sluice") if role == "admin" else (role, PASSWORD)
    queue = fresh_target(world, "queue") if role == "admin" else "m-queue"
    args = [a.format(n=next(world.counter), queue=queue) for a in command]
    status = main([*args, "--admin", world.broker.running.admin_url, "--user", user,
                   "--password", password])
    err = capsys.readouterr().err
    if role == "admin" or command[:2] == ["vhost", "list"]:
        assert status == admin_status, err
    else:
        assert status == 1 and "403" in err, err
    assert_untouched(world)
