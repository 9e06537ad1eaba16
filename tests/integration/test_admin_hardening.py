"""The admin API against hostile callers, over real HTTP to the real composition root: message
bodies only for subscribers (decided before any header), tails that end when the right goes,
no cross-site writes, JSON only as JSON, no Basic challenge, bounded bodies, validated groups and
security headers on every response."""
from __future__ import annotations

import base64
import json
import time
from http.client import HTTPConnection, HTTPResponse
from urllib.parse import urlsplit

import pytest

from core.model import SYSTEM, OutgoingMessage
from tests.integration.test_admin_api import BrokerThread, Http


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    thread = BrokerThread(str(tmp_path_factory.mktemp("hardening") / "data"))
    yield thread
    thread.stop()


@pytest.fixture(scope="module")
def http(broker):
    return Http(broker.running.admin_url)


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


ADMIN = basic("sluice", "sluice")


class Raw:
    """One request with exactly the headers given (urllib adds its own), read as it arrives."""

    def __init__(self, admin_url: str, method: str, path: str, headers: dict[str, str],
                 body: bytes | None = None) -> None:
        parts = urlsplit(admin_url)
        self.connection = HTTPConnection(parts.hostname, parts.port, timeout=20)
        self.connection.request(method, path, body=body, headers=headers)
        self.response: HTTPResponse = self.connection.getresponse()

    @property
    def status(self) -> int:
        return self.response.status

    def json(self):
        return json.loads(self.response.read())

    def lines(self, count: int, within_s: float = 20) -> list[dict]:
        """The next ``count`` lines of a tail, heartbeats skipped, within ``within_s`` seconds."""
        got = []
        deadline = time.monotonic() + within_s
        while len(got) < count:
            assert time.monotonic() < deadline, f"only {len(got)} of {count} lines in {within_s} s"
            line = self.response.readline()
            assert line, f"the stream ended after {len(got)} of {count} lines"
            if "heartbeat" not in (value := json.loads(line)):
                got.append(value)
        return got

    def close(self) -> None:
        self.connection.close()


def request(broker, method: str, path: str, headers: dict[str, str], body: bytes | None = None):
    """(status, JSON body or text, headers) of one raw request."""
    raw = Raw(broker.running.admin_url, method, path, headers, body)
    try:
        text = raw.response.read()
        kind = raw.response.getheader("Content-Type", "")
        return raw.status, json.loads(text) if kind.startswith("application/json") else text, \
            raw.response.headers
    finally:
        raw.close()


def refusal(broker, path: str, headers: dict[str, str]) -> tuple[int, dict | None]:
    """(status, JSON error) of a GET that should be refused; a stream it opens is not read."""
    raw = Raw(broker.running.admin_url, "GET", path, headers)
    try:
        return raw.status, (None if raw.status == 200 else raw.json())
    finally:
        raw.close()


def send(broker, topic: str, body: bytes, keys: tuple[str, ...] = ()) -> str:
    sent = broker.call(broker.running.broker.send(SYSTEM, [OutgoingMessage(topic, body, keys=keys)]))
    return sent[0].msg_id


def user_with(http, name: str, pattern: str, *actions: str) -> Http:
    assert http("POST", "/users", {"name": name, "password": "pw"})[0] == 201
    if actions:
        assert http("POST", f"/users/{name}/permissions",
                    {"kind": "topic", "pattern": pattern, "actions": list(actions)})[0] == 201
    return Http(http.url, name, "pw")


# --- defect 9: message bodies need the subscribe right ---

def test_a_publish_only_user_reads_no_bodies_and_the_tail_is_refused_before_any_header(broker, http):
    assert http("POST", "/topics", {"name": "vault", "queue_count": 1})[0] == 201
    msg_id = send(broker, "vault", b"the combination", keys=("k",))
    publisher = user_with(http, "publisher", "vault", "publish")

    tail = Raw(broker.running.admin_url, "GET", "/topics/vault/tail", basic("publisher", "pw"))
    try:
        assert tail.status == 403  # the first status line, not a 200 stream that breaks later
        assert tail.response.getheader("Transfer-Encoding") is None
        refused = tail.json()
        assert refused["error"] == "forbidden" and "subscribe" in refused["message"]
    finally:
        tail.close()
    status, body, _ = publisher("GET", "/topics/vault/messages?key=k")
    assert status == 403 and "subscribe" in body["message"]
    status, by_id, _ = publisher("GET", f"/messages/{msg_id}")
    status_missing, missing, _ = publisher("GET", "/messages/" + "0" * 32)
    assert status == status_missing == 404
    assert "the combination" not in json.dumps(by_id) and "vault" not in by_id["message"]
    assert by_id["message"].replace(msg_id, "X") == missing["message"].replace("0" * 32, "X")

    assert http("POST", "/users/publisher/permissions",
                {"kind": "topic", "pattern": "vault", "actions": ["publish", "subscribe"]})[0] == 201
    assert publisher("GET", f"/messages/{msg_id}")[1]["body_text"] == "the combination"
    assert [m["msg_id"] for m in publisher("GET", "/topics/vault/messages?key=k")[1]] == [msg_id]
    tail = Raw(broker.running.admin_url, "GET", "/topics/vault/tail", basic("publisher", "pw"))
    try:
        assert tail.status == 200 and [line["body"] for line in tail.lines(1)] == ["the combination"]
    finally:
        tail.close()


def test_a_refusal_does_not_tell_whether_the_topic_exists(broker, http):
    user_with(http, "outsider", "hidden-*", "publish")
    assert http("POST", "/topics", {"name": "hidden-topic", "queue_count": 1})[0] == 201
    for path in ("/topics/{}/tail", "/topics/{}/messages?key=k"):
        exists, absent = (refusal(broker, path.format(topic), basic("outsider", "pw"))
                          for topic in ("hidden-topic", "hidden-absent"))
        assert exists[0] == absent[0] == 403
        assert exists[1]["message"] == absent[1]["message"].replace("hidden-absent", "hidden-topic")


@pytest.mark.parametrize("take_away", ["revoke", "delete user"])
def test_a_tail_ends_with_an_error_line_when_its_right_is_taken_away(broker, http, take_away):
    topic, user = f"watched-{take_away.replace(' ', '-')}", f"watcher-{take_away.replace(' ', '-')}"
    assert http("POST", "/topics", {"name": topic, "queue_count": 1})[0] == 201
    user_with(http, user, topic, "subscribe")
    tail = Raw(broker.running.admin_url, "GET", f"/topics/{topic}/tail?minutes=0", basic(user, "pw"))
    try:
        assert tail.status == 200
        send(broker, topic, b"before")
        assert [line["body"] for line in tail.lines(1)] == ["before"]
        if take_away == "revoke":
            assert http("DELETE", f"/users/{user}/permissions?kind=topic&pattern={topic}")[0] == 204
        else:
            assert http("DELETE", f"/users/{user}")[0] == 204
        send(broker, topic, b"after")
        [last] = tail.lines(1)
        assert last["error"] == "forbidden" and topic in last["message"] and "body" not in last
        assert tail.response.readline() == b"", "the stream goes on after the right was taken away"
    finally:
        tail.close()


# --- defect 11: no cross-site request forgery ---

def test_a_text_plain_post_is_refused_with_415_and_creates_nothing(broker, http):
    evil = json.dumps({"name": "csrf-admin", "password": "x", "admin": True}).encode()
    for content_type in ("text/plain", "application/x-www-form-urlencoded", None):
        headers = {**ADMIN, **({"Content-Type": content_type} if content_type else {})}
        status, body, _ = request(broker, "POST", "/users", headers, evil)
        assert status == 415 and "application/json" in body["message"], (content_type, body)
    assert "csrf-admin" not in [u["name"] for u in http("GET", "/users")[1]]


@pytest.mark.parametrize("headers", [{"Origin": "http://evil.example"}, {"Origin": "null"},
                                     {"Sec-Fetch-Site": "cross-site"}])
def test_a_cross_origin_write_is_refused_before_authentication(broker, http, headers):
    body = json.dumps({"name": "forged", "password": "x", "admin": True}).encode()
    json_type = {"Content-Type": "application/json"}
    for credentials in (ADMIN, {}):  # refused alike with and without credentials
        status, answer, _ = request(broker, "POST", "/users", {**json_type, **credentials, **headers}, body)
        assert status == 403 and answer["error"] == "cross_origin", answer
    status, _, _ = request(broker, "DELETE", "/users/sluice", {**ADMIN, **headers})
    assert status == 403
    assert "forged" not in [u["name"] for u in http("GET", "/users")[1]]
    assert http("GET", "/topics")[0] == 200, "the admin user is still there"

    own = {"Origin": f"http://{urlsplit(broker.running.admin_url).netloc}",
           "Sec-Fetch-Site": "same-origin"}
    status, created, _ = request(broker, "POST", "/users", {**json_type, **ADMIN, **own}, body)
    assert status == 201, "a write from the API's own origin (a page it serves) passes"
    assert http("DELETE", "/users/forged")[0] == 204


@pytest.mark.parametrize("path", ["/topics", "/users", "/topics/vault/tail", "/messages/x"])
def test_no_response_asks_for_basic_credentials(broker, path):
    for headers in ({}, basic("sluice", "wrong"), {"Authorization": "Bearer x"}):
        status, _, answer_headers = request(broker, "GET", path, headers)
        assert status == 401 and "WWW-Authenticate" not in answer_headers, (path, headers)


# --- defect 20: bounded input, validated groups, security headers ---

def test_deeply_nested_json_is_a_400_and_the_api_goes_on(broker, http):
    for deep in (b"[" * 50_000, b'{"a":' * 10_000 + b"1" + b"}" * 10_000):
        status, body, _ = request(broker, "POST", "/topics",
                                  {**ADMIN, "Content-Type": "application/json"}, deep)
        assert status == 400 and body["error"] == "bad_json" and "deeply" in body["message"]
    assert http("GET", "/health")[0] == 200


def test_a_body_over_the_limit_is_a_413(broker, http):
    big = json.dumps({"name": "big", "padding": "x" * 100_000}).encode()
    status, body, _ = request(broker, "POST", "/topics", {**ADMIN, "Content-Type": "application/json"}, big)
    assert status == 413 and "larger than" in body["message"]
    assert http("GET", "/topics/big")[0] == 404


BAD_RETRY = [
    ({"max_attempts": -5}, "max_attempts"),
    ({"max_attempts": 0}, "max_attempts"),
    ({"max_attempts": 1001}, "max_attempts"),
    ({"max_attempts": 2.5}, "max_attempts"),
    ({"max_attempts": True}, "max_attempts"),
    ({"initial_backoff_ms": 0}, "initial_backoff_ms"),
    ({"initial_backoff_ms": -1000}, "initial_backoff_ms"),
    ({"initial_backoff_ms": 5000, "max_backoff_ms": 1000}, "max_backoff_ms"),
    ({"multiplier": 0.5}, "multiplier"),
    ({"multiplier": -2}, "multiplier"),
]


def test_a_bad_retry_policy_is_a_400_and_creates_no_group_and_the_edges_pass(http):
    for retry, fragment in BAD_RETRY:
        status, body, _ = http("POST", "/groups", {"name": "bad-retry", "retry": retry})
        assert status == 400 and fragment in body["message"], (retry, body)
        assert http("GET", "/groups/bad-retry")[0] == 404
    edges = {"max_attempts": 1000, "initial_backoff_ms": 1, "max_backoff_ms": 1, "multiplier": 1}
    status, group, _ = http("POST", "/groups", {"name": "edge-retry", "retry": edges})
    assert status == 201 and group["retry"] == edges


SECURITY_HEADERS = {"X-Content-Type-Options": "nosniff", "X-Frame-Options": "DENY",
                    "Referrer-Policy": "no-referrer"}


@pytest.mark.parametrize("method, path, headers", [
    ("GET", "/health", {}), ("GET", "/metrics", {}), ("GET", "/openapi.json", {}),
    ("GET", "/topics", {}), ("GET", "/topics", ADMIN), ("GET", "/nope", ADMIN),
    ("POST", "/topics", {**ADMIN, "Origin": "http://evil.example"}),
    ("GET", "/dashboard/dashboard.js", {}), ("GET", "/dashboard", {}),
])
def test_every_response_carries_the_security_headers(broker, method, path, headers):
    _, _, answer = request(broker, method, path, headers)
    for name, value in SECURITY_HEADERS.items():
        assert answer[name] == value, (path, name)
    policy = answer["Content-Security-Policy"]
    if path == "/dashboard":
        assert "script-src 'self'" in policy and "connect-src 'self'" in policy
        assert "unsafe-inline" not in policy
    else:
        assert policy.startswith("default-src 'none'")


def test_a_streaming_tail_carries_the_security_headers(broker, http):
    assert http("POST", "/topics", {"name": "headers-tail", "queue_count": 1})[0] == 201
    tail = Raw(broker.running.admin_url, "GET", "/topics/headers-tail/tail", ADMIN)
    try:
        assert tail.status == 200
        for name, value in SECURITY_HEADERS.items():
            assert tail.response.getheader(name) == value
    finally:
        tail.close()
