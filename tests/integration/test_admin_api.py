"""The admin HTTP API against the real composition root: store, metadata, broker, both servers.

The broker runs on its own event loop in a thread (as `sluice serve` runs it in its process);
tests speak real HTTP to it with urllib, and reach the broker facade only to produce messages
and commit offsets, which the admin API does not do.
"""
from __future__ import annotations

import asyncio
import base64
import functools
import json
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import replace
from typing import Any

import pytest

from core.model import SYSTEM, OutgoingMessage
from sluice.server import app
from protocols.admin.routes import ROUTES
from sluice.server.config import load_config


class BrokerThread:
    """`app.start` on an event loop of its own thread; ``call`` runs a coroutine there."""

    def __init__(self, data_dir: str, **settings: Any) -> None:
        """``settings``: more dotted configuration paths and their values."""
        config = load_config(overrides={"data_dir": data_dir, "native.port": 0, "admin.port": 0,
                                        "mqtt.port": 0, "mqtt.ws_port": 0, "amqp.port": 0,
                                        **settings})
        self.config = replace(config, store=replace(config.store, segment_size=1 << 20))
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.running: app.RunningBroker = self.call(app.start(self.config))

    def call(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(30)

    def run(self, fn: Any, *args: Any) -> Any:
        """Call a plain facade method on the broker's loop, where it must run."""
        async def call() -> Any:
            return fn(*args)
        return self.call(call())

    def stop(self) -> None:
        self.call(self.running.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    thread = BrokerThread(str(tmp_path_factory.mktemp("admin") / "data"))
    yield thread
    thread.stop()


class Http:
    """A tiny JSON client: ``(status, decoded body, headers)`` for every request, errors included."""

    def __init__(self, url: str, user: str | None = "sluice", password: str = "sluice") -> None:
        self.url, self.user, self.password = url, user, password

    def __call__(self, method: str, path: str, body: Any = None, raw: bytes | None = None):
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        request = urllib.request.Request(self.url + path, data=data, method=method)
        request.add_header("Content-Type", "application/json")
        if self.user is not None:
            token = base64.b64encode(f"{self.user}:{self.password}".encode()).decode()
            request.add_header("Authorization", f"Basic {token}")
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                status, text, headers = response.status, response.read(), response.headers
        except urllib.error.HTTPError as error:
            status, text, headers = error.code, error.read(), error.headers
        if headers.get("Content-Type", "").startswith("application/json"):
            return status, json.loads(text), headers
        return status, text.decode(), headers


@pytest.fixture(scope="module")
def http(broker):
    return Http(broker.running.admin_url)


def send(broker, topic: str, body: bytes, keys=()) -> str:
    results = broker.call(broker.running.broker.send(SYSTEM, [OutgoingMessage(topic, body, keys=keys)]))
    return results[0].msg_id


# --- service endpoints ---

def test_health_reports_store_and_metadata_without_credentials(http, broker):
    status, body, _ = Http(http.url, user=None)("GET", "/health")
    assert status == 200
    assert body["status"] == "ok"
    assert body["store"]["status"] == "ok" and body["metadata"]["status"] == "ok"
    assert body["store"]["durable_offset"] <= body["store"]["visible_offset"]


def test_openapi_documents_exactly_the_served_routes(http, broker):
    status, document, _ = Http(http.url, user=None)("GET", "/openapi.json")
    assert status == 200 and document["openapi"].startswith("3.")
    documented = {(method.upper(), path) for path, ops in document["paths"].items() for method in ops}
    app_routes = broker.running.admin._runner.app.router.routes()
    served = {(r.method, r.resource.canonical) for r in app_routes if r.method != "HEAD"}
    assert documented == served
    assert documented == {(r.method, r.template) for r in ROUTES}
    for path, ops in document["paths"].items():
        for method, op in ops.items():
            assert op["summary"] and op["responses"], (method, path)
            for name in [p["name"] for p in op.get("parameters", []) if p["in"] == "path"]:
                assert "{" + name + "}" in path
    refs = {v.rsplit("/", 1)[-1] for v in _walk(document) if v.startswith("#/components/schemas/")}
    assert refs <= set(document["components"]["schemas"])


def _walk(node: Any):
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref":
                yield value
            else:
                yield from _walk(value)
    elif isinstance(node, list):
        for value in node:
            yield from _walk(value)


def test_unknown_paths_and_methods_answer_json(http):
    status, body, _ = http("GET", "/nope")
    assert status == 404 and "openapi.json" in body["message"]
    status, body, _ = http("PATCH", "/topics")
    assert status == 405 and "GET" in body["message"] and "POST" in body["message"]


# --- authentication and authorization ---

def test_missing_or_wrong_credentials_get_401_with_a_hint_and_no_basic_challenge(http):
    status, body, headers = Http(http.url, user=None)("GET", "/topics")
    assert status == 401 and body["error"] == "unauthenticated"
    assert "WWW-Authenticate" not in headers  # browsers would prompt, then replay cross-site
    assert "credentials" in body["message"]
    status, body, headers = Http(http.url, password="wrong")("GET", "/topics")
    assert status == 401 and "wrong" in body["message"] and "WWW-Authenticate" not in headers


def test_a_user_without_permission_gets_403_and_a_grant_opens_reads(http):
    assert http("POST", "/users", {"name": "reader", "password": "pw"})[0] == 201
    assert http("POST", "/topics", {"name": "visible", "queue_count": 1})[0] == 201
    assert http("POST", "/topics", {"name": "hidden", "queue_count": 1})[0] == 201
    reader = Http(http.url, "reader", "pw")

    status, body, _ = reader("GET", "/users")
    assert status == 403 and body["error"] == "forbidden" and "admin" in body["message"]
    status, body, _ = reader("POST", "/topics", {"name": "mine"})
    assert status == 403
    status, body, _ = reader("GET", "/topics/visible")
    assert status == 403 and "sluice user grant reader topic visible" in body["message"]
    assert reader("GET", "/topics")[1] == []

    status, granted, _ = http("POST", "/users/reader/permissions",
                              {"kind": "topic", "pattern": "vis*", "actions": ["subscribe"]})
    assert status == 201 and granted["actions"] == ["subscribe"]
    assert reader("GET", "/topics/visible")[0] == 200
    assert reader("GET", "/topics/hidden")[0] == 403
    assert [t["name"] for t in reader("GET", "/topics")[1]] == ["visible"]


# --- topics ---

def test_topic_lifecycle(http):
    status, created, _ = http("POST", "/topics", {"name": "orders", "queue_count": 2,
                                                   "message_type": "fifo"})
    assert status == 201 and created == {"name": "orders", "queue_count": 2, "message_type": "fifo",
                                         "retention_ms": None, "compacted": False,
                                         "tier_retention_ms": None, "body_schema": None}
    status, body, _ = http("POST", "/topics", {"name": "orders"})
    assert status == 409 and body["error"] == "already_exists"
    assert "orders" in [t["name"] for t in http("GET", "/topics")[1]]
    status, described, _ = http("GET", "/topics/orders")
    assert status == 200 and [q["queue_id"] for q in described["queues"]] == [0, 1]
    assert {"min_offset", "max_offset", "messages"} <= set(described["queues"][0])
    assert http("DELETE", "/topics/orders")[0] == 204
    status, body, _ = http("GET", "/topics/orders")
    assert status == 404 and body["error"] == "topic_not_found" and "sluice topic create" in body["message"]


def test_internal_topics_are_listed_only_when_asked_for(http):
    internal = [t["name"] for t in http("GET", "/topics?internal=true")[1]
                if t["name"].startswith("%SYS%")]
    assert internal, "the MQTT front end keeps its sessions in an internal topic"
    assert not set(internal) & {t["name"] for t in http("GET", "/topics")[1]}


@pytest.mark.parametrize("body, fragment", [
    ({"name": "bad name!"}, "invalid"),
    ({"queue_count": 2}, "'name' is required"),
    ({"name": "t", "queue_count": "two"}, "'queue_count' must be int"),
    ({"name": "t", "message_type": "weird"}, "not one of"),
    ({"name": "t", "queue_count": 0}, "out of range"),
])
def test_invalid_topic_requests_get_400_naming_the_field(http, body, fragment):
    status, answer, _ = http("POST", "/topics", body)
    assert status == 400 and fragment in answer["message"]


def test_a_body_that_is_not_json_gets_400(http):
    status, answer, _ = http("POST", "/topics", raw=b"{not json")
    assert status == 400 and answer["error"] == "bad_json"


# --- messages ---

def test_messages_by_id_and_by_key(http, broker):
    http("POST", "/topics", {"name": "lookups", "queue_count": 2})
    text_id = send(broker, "lookups", "héllo".encode(), keys=["order-1"])
    binary_id = send(broker, "lookups", b"\xff\x00\xfe", keys=["order-1"])

    status, message, _ = http("GET", f"/messages/{text_id}")
    assert status == 200 and message["body_text"] == "héllo" and message["topic"] == "lookups"
    assert base64.b64decode(message["body_base64"]) == "héllo".encode()
    assert message["keys"] == ["order-1"]
    status, message, _ = http("GET", f"/messages/{binary_id}")
    assert message["body_text"] is None and base64.b64decode(message["body_base64"]) == b"\xff\x00\xfe"

    status, found, _ = http("GET", "/topics/lookups/messages?key=order-1")
    assert status == 200 and {m["msg_id"] for m in found} == {text_id, binary_id}
    assert http("GET", "/topics/lookups/messages?key=nobody")[1] == []
    status, body, _ = http("GET", "/topics/lookups/messages")
    assert status == 400 and "?key=" in body["message"] and "?from=" in body["message"]
    assert http("GET", "/messages/00000000000000000000000000000000")[0] == 404


def test_a_lookup_by_key_is_capped_and_pages_through_the_rest(http, broker):
    http("POST", "/topics", {"name": "paged", "queue_count": 3})
    sent = [send(broker, "paged", b"%d" % i, keys=["hot"]) for i in range(25)]
    for limit in (0, 1001):
        status, body, _ = http("GET", f"/topics/paged/messages?key=hot&limit={limit}")
        assert status == 400 and "1-1000" in body["message"]

    pages, path = [], "/topics/paged/messages?key=hot&limit=10"
    while path:
        status, found, headers = http("GET", path)
        assert status == 200
        pages.append([m["msg_id"] for m in found])
        link = headers.get("Link")
        path = None
        if link:
            target, rel = link.split(";")
            assert rel.strip() == 'rel="next"' and target.startswith("</topics/paged/messages?")
            path = target.strip("<> ")
    assert [len(page) for page in pages] == [10, 10, 5]
    assert [i for page in pages for i in page] == list(reversed(sent))
    status, found, headers = http("GET", "/topics/paged/messages?key=hot&limit=25")
    assert len(found) == 25 and "Link" not in headers

    for cursor in ("nonsense", "12.999999", "%C2%B2.1"):  # the last: a superscript two
        status, body, _ = http("GET", f"/topics/paged/messages?key=hot&after={cursor}")
        assert status == 400 and "cursor" in body["message"]

    cli = [sys.executable, "-m", "sluice.cli", "message", "get", "--topic", "paged", "--key", "hot",
           "--limit", "20", "--json", "--admin", http.url]
    run = functools.partial(subprocess.run, capture_output=True, text=True, timeout=60, check=True)
    first = run(cli)
    rest = run([*cli, "--after", first.stderr.split("--after ")[1].split()[0]])
    both = json.loads(first.stdout) + json.loads(rest.stdout)
    assert [m["msg_id"] for m in both] == list(reversed(sent)) and "--after" not in rest.stderr


def test_messages_by_time_range_oldest_first_across_queues(http, broker):
    http("POST", "/topics", {"name": "ranged", "queue_count": 3})
    first = [send(broker, "ranged", f"early-{i}".encode()) for i in range(4)]
    status, stored, _ = http("GET", f"/messages/{first[-1]}")
    middle = stored["store_ts"] + 1
    while int(time.time() * 1000) <= middle:  # the next sends are stored after ``middle``
        http("GET", "/health")
    later = [send(broker, "ranged", f"late-{i}".encode()) for i in range(4)]

    status, found, _ = http("GET", f"/topics/ranged/messages?from={middle}")
    assert status == 200 and sorted(m["msg_id"] for m in found) == sorted(later)
    status, found, _ = http("GET", f"/topics/ranged/messages?from=0&to={middle}")
    assert sorted(m["msg_id"] for m in found) == sorted(first)
    status, found, _ = http("GET", "/topics/ranged/messages?from=0&limit=5")
    ids = [m["msg_id"] for m in found]  # oldest first; one millisecond's order is by queue
    assert sorted(ids[:4]) == sorted(first) and ids[4] in later
    assert [m["store_ts"] for m in found] == sorted(m["store_ts"] for m in found)
    status, body, _ = http("GET", f"/topics/ranged/messages?from={middle}&to=0")
    assert status == 400 and "before it starts" in body["message"]


# --- groups ---

def test_group_describe_lag_reset_and_delete(http, broker):
    http("POST", "/topics", {"name": "lagging", "queue_count": 1})
    for i in range(5):
        send(broker, "lagging", b"m%d" % i)
    status, created, _ = http("POST", "/groups", {"name": "workers", "retry": {"max_attempts": 3}})
    assert status == 201 and created["retry"]["max_attempts"] == 3
    assert http("POST", "/groups", {"name": "workers"})[0] == 409
    broker.run(broker.running.broker.commit_offset, SYSTEM, "workers", "lagging", 0, 2)

    status, group, _ = http("GET", "/groups/workers")
    assert status == 200 and group["name"] == "workers"
    assert {"members", "subscriptions", "lag", "total_lag"} <= set(group)
    (queue,) = [q for q in group["lag"] if q["topic"] == "lagging"]
    assert (queue["committed"], queue["max_offset"], queue["lag"]) == (2, 5, 3)
    assert "workers" in [g["name"] for g in http("GET", "/groups")[1]]

    status, reset, _ = http("POST", "/groups/workers/reset-offset", {"topic": "lagging", "to": "earliest"})
    assert status == 200 and reset["offsets"] == {"0": 0}
    status, reset, _ = http("POST", "/groups/workers/reset-offset",
                            {"topic": "lagging", "timestamp_ms": 4_000_000_000_000})
    assert status == 200 and reset["offsets"] == {"0": 5}
    status, body, _ = http("POST", "/groups/workers/reset-offset", {"topic": "lagging"})
    assert status == 400 and "exactly one of" in body["message"]

    assert http("DELETE", "/groups/workers")[0] == 204
    assert http("GET", "/groups/workers")[0] == 404


# --- users and permissions ---

def test_user_and_permission_management(http):
    assert http("POST", "/users", {"name": "alice", "password": "one", "admin": False})[0] == 201
    assert http("POST", "/users", {"name": "alice", "password": "one"})[0] == 409
    assert {"name": "alice", "admin": False} in http("GET", "/users")[1]

    grant = {"kind": "group", "pattern": "billing-*", "actions": ["subscribe", "publish"]}
    assert http("POST", "/users/alice/permissions", grant)[0] == 201
    status, perms, _ = http("GET", "/users/alice/permissions")
    assert status == 200 and perms == [{"user": "alice", "kind": "group", "pattern": "billing-*",
                                        "actions": ["publish", "subscribe"]}]
    assert http("POST", "/users/alice/permissions", {**grant, "actions": []})[0] == 400
    assert http("DELETE", "/users/alice/permissions?kind=group&pattern=billing-*")[0] == 204
    assert http("DELETE", "/users/alice/permissions?kind=group&pattern=billing-*")[0] == 404
    assert http("GET", "/users/alice/permissions")[1] == []

    assert http("PUT", "/users/alice/password", {"password": "two"})[0] == 204
    assert Http(http.url, "alice", "one")("GET", "/topics")[0] == 401
    assert Http(http.url, "alice", "two")("GET", "/topics")[0] == 200

    assert http("DELETE", "/users/alice")[0] == 204
    status, body, _ = http("DELETE", "/users/alice")
    assert status == 404 and "sluice user list" in body["message"]
    assert http("GET", "/users/alice/permissions")[0] == 404


# --- metrics ---

def test_metrics_expose_store_topics_groups_and_counters(http, broker):
    http("POST", "/topics", {"name": "metered", "queue_count": 2})
    for i in range(3):
        send(broker, "metered", b"x" * 10)
    http("POST", "/groups", {"name": "meter-group"})
    broker.run(broker.running.broker.commit_offset, SYSTEM, "meter-group", "metered", 0, 1)
    status, text, headers = Http(http.url, user=None)("GET", "/metrics")
    assert status == 200 and headers["Content-Type"].startswith("text/plain")
    for line in ('sluice_messages_in_total{topic="metered"} 3.0',
                 'sluice_bytes_in_total{topic="metered"} 30.0',
                 'sluice_topic_stored_messages_total{topic="metered"} 3.0',
                 'sluice_group_lag{group="meter-group",queue="0",topic="metered"}',
                 'sluice_queue_depth{queue="1",topic="metered"}',
                 "sluice_store_durable_offset_bytes ", "sluice_store_visible_offset_bytes ",
                 "sluice_connected_clients ", "sluice_topics ",
                 'sluice_admin_requests_total{method="POST",route="/topics",status="201"}'):
        assert line in text, line
