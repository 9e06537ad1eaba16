"""``GET /topics/{topic}/tail``: recent messages first, then new ones as they are stored, as
newline-delimited JSON over one open HTTP response (what the dashboard reads)."""
from __future__ import annotations

import base64
from http.client import HTTPConnection
import json
from urllib.parse import urlsplit

import pytest

from core.model import SYSTEM, OutgoingMessage
from tests.integration.test_admin_api import BrokerThread, Http

AUTH = {"Authorization": "Basic " + base64.b64encode(b"sluice:sluice").decode()}


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    thread = BrokerThread(str(tmp_path_factory.mktemp("tail") / "data"))
    yield thread
    thread.stop()


@pytest.fixture(scope="module")
def http(broker):
    return Http(broker.running.admin_url)


class Tail:
    """An open tail response, read line by line."""

    def __init__(self, admin_url: str, path: str) -> None:
        parts = urlsplit(admin_url)
        self.connection = HTTPConnection(parts.hostname, parts.port, timeout=20)
        self.connection.request("GET", path, headers=AUTH)
        self.response = self.connection.getresponse()

    def lines(self, count: int) -> list[dict]:
        """The next ``count`` message lines (heartbeats skipped)."""
        got = []
        while len(got) < count:
            line = self.response.readline()
            assert line, f"the stream ended after {len(got)} of {count} lines"
            value = json.loads(line)
            if "heartbeat" not in value:
                got.append(value)
        return got

    def close(self) -> None:
        self.connection.close()


def send(broker, topic: str, *messages: OutgoingMessage) -> None:
    broker.call(broker.running.broker.send(SYSTEM, list(messages)))


def test_history_comes_first_then_new_messages_as_they_are_stored(broker, http):
    assert http("POST", "/topics", {"name": "tail.live", "queue_count": 2})[0] == 201
    send(broker, "tail.live", *[OutgoingMessage("tail.live", f"old {i}".encode(), queue_id=i % 2)
                                for i in range(5)])
    tail = Tail(broker.running.admin_url, "/topics/tail.live/tail")
    try:
        assert tail.response.status == 200
        assert tail.response.getheader("Content-Type") == "application/x-ndjson"
        history = tail.lines(5)
        assert sorted(line["body"] for line in history) == [f"old {i}" for i in range(5)]
        assert sorted((line["queue"], line["offset"]) for line in history) == \
            [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)]
        send(broker, "tail.live", OutgoingMessage(
            "tail.live", b"new", keys=("k1",), tag="t", queue_id=1,
            properties={"sluice.subject": "tail.live/d7"}))
        [live] = tail.lines(1)
        assert (live["body"], live["keys"], live["tag"], live["subject"]) == ("new", ["k1"], "t", "tail.live/d7")
        assert (live["queue"], live["offset"]) == (1, 2)
        assert live["store_ts"] >= live["born_ts"] > 0
        send(broker, "tail.live", OutgoingMessage("tail.live", b"\xff\xfe", queue_id=0))
        [binary] = tail.lines(1)
        assert "body" not in binary and base64.b64decode(binary["body_base64"]) == b"\xff\xfe"
    finally:
        tail.close()


def test_minutes_zero_sends_only_new_messages(broker, http):
    assert http("POST", "/topics", {"name": "tail.fresh", "queue_count": 1})[0] == 201
    send(broker, "tail.fresh", OutgoingMessage("tail.fresh", b"before"))
    tail = Tail(broker.running.admin_url, "/topics/tail.fresh/tail?minutes=0")
    try:
        assert tail.response.status == 200
        send(broker, "tail.fresh", OutgoingMessage("tail.fresh", b"after"))
        assert [line["body"] for line in tail.lines(1)] == ["after"]
    finally:
        tail.close()


def test_bad_requests_get_json_errors(broker, http):
    status, body, _ = http("GET", "/topics/no.such.topic/tail")
    assert status == 404 and "no.such.topic" in body["message"]
    status, body, _ = Http(http.url, user=None)("GET", "/topics/tail.live/tail")
    assert status == 401
    status, body, _ = http("GET", "/topics/tail.live/tail?minutes=-1")
    assert status == 400 and "minutes" in body["message"]


def test_stopping_the_server_ends_open_tails(tmp_path):
    broker = BrokerThread(str(tmp_path / "data"))
    Http(broker.running.admin_url)("POST", "/topics", {"name": "tail.stop", "queue_count": 1})
    tail = Tail(broker.running.admin_url, "/topics/tail.stop/tail")
    try:
        assert tail.response.status == 200
        broker.stop()  # raises TimeoutError if the server waited for the open response
        while (line := tail.response.readline()):
            assert "heartbeat" in json.loads(line)
    finally:
        tail.close()


def test_the_dashboard_page_and_its_files_are_served_without_credentials(http):
    anonymous = Http(http.url, user=None)
    status, page, headers = anonymous("GET", "/dashboard")
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    assert '<script src="/dashboard/dashboard.js">' in page
    status, script, headers = anonymous("GET", "/dashboard/dashboard.js")
    assert status == 200 and headers["Content-Type"].startswith("text/javascript")
    assert "/tail?minutes=" in script
    status, body, _ = anonymous("GET", "/dashboard/secrets.txt")
    assert status == 404 and "dashboard.css" in body["message"]
