"""What the web console needs of the admin API, over real HTTP against a real broker: browser
sessions (cookie flags, CSRF, sign-out, idle expiry, a deleted user's session), server-side
paging on list routes, and the overview, its history under real MQTT traffic, and the MQTT
retained messages."""
from __future__ import annotations

import json
import time
import uuid
from http.client import HTTPConnection
from urllib.parse import urlsplit

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from tests import waiting
from tests.integration.test_admin_api import BrokerThread, Http

WAIT_S = 60


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    thread = BrokerThread(str(tmp_path_factory.mktemp("console-api") / "data"))
    admin = Http(thread.running.admin_url)
    assert admin("POST", "/users", {"name": "viewer", "password": "pw"})[0] == 201
    for name in ("v-topic", "hidden-topic"):
        assert admin("POST", "/topics", {"name": name, "queue_count": 1})[0] == 201
    grant = {"kind": "topic", "pattern": "v-topic", "actions": ["subscribe"]}
    assert admin("POST", "/users/viewer/permissions", grant)[0] == 201
    yield thread
    thread.stop()


@pytest.fixture(scope="module")
def admin(broker):
    return Http(broker.running.admin_url)


class Browser:
    """Requests as a browser makes them: the session cookie on each, whatever the caller adds."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.host, self.port = parts.hostname, parts.port
        self.cookie: str | None = None
        self.csrf = ""

    def __call__(self, method: str, path: str, body=None, **headers: str):
        """(status, decoded body, response headers)."""
        sent = {k.replace("_", "-"): v for k, v in headers.items()}
        if self.cookie is not None:
            sent.setdefault("Cookie", self.cookie)
        if body is not None:
            sent["Content-Type"] = "application/json"
        connection = HTTPConnection(self.host, self.port, timeout=30)
        try:
            connection.request(method, path, None if body is None else json.dumps(body), sent)
            response = connection.getresponse()
            text = response.read()
            decoded = json.loads(text) if text and "json" in response.getheader(
                "Content-Type", "") else text
            return response.status, decoded, response.headers
        finally:
            connection.close()

    def sign_in(self, user: str, password: str) -> dict:
        status, body, headers = self("POST", "/session", {"user": user, "password": password})
        assert status == 200, body
        self.cookie = headers["Set-Cookie"].split(";")[0]
        self.csrf = body["csrf_token"]
        return body


def signed_in(broker, user="sluice", password="sluice") -> Browser:
    browser = Browser(broker.running.admin_url)
    browser.sign_in(user, password)
    return browser


# --- sessions ---

def test_signing_in_sets_a_hardened_cookie_and_answers_who_and_the_csrf_token(broker):
    browser = Browser(broker.running.admin_url)
    status, body, headers = browser("POST", "/session", {"user": "sluice", "password": "sluice"})
    assert status == 200
    assert body["user"] == "sluice" and body["admin"] is True and body["idle_timeout_s"] == 1800
    cookie = headers["Set-Cookie"]
    name, _, rest = cookie.partition("=")
    token = rest.split(";")[0]
    assert name == "sluice_session" and len(token) >= 43 and token != body["csrf_token"]
    flags = {part.strip().lower() for part in cookie.split(";")[1:]}
    assert {"httponly", "samesite=strict", "path=/"} <= flags
    assert "secure" not in flags  # plain HTTP here; over HTTPS the cookie is Secure
    browser.cookie = f"sluice_session={token}"
    status, again, headers = browser("GET", "/session")
    assert (status, again) == (200, body) and "Set-Cookie" not in headers


def test_wrong_credentials_are_a_401_without_a_basic_challenge_and_without_a_cookie(broker):
    status, body, headers = Browser(broker.running.admin_url)(
        "POST", "/session", {"user": "nobody-" + uuid.uuid4().hex[:6], "password": "x"})
    assert status == 401 and body["error"] == "unauthenticated"
    assert "WWW-Authenticate" not in headers and "Set-Cookie" not in headers


def test_no_or_an_unknown_cookie_is_a_401(broker):
    browser = Browser(broker.running.admin_url)
    assert browser("GET", "/session")[0] == 401
    browser.cookie = "sluice_session=" + "A" * 43
    for path in ("/session", "/topics", "/overview"):
        status, body, headers = browser("GET", path)
        assert status == 401 and "sign in" in body["message"], path
        assert "WWW-Authenticate" not in headers


def test_a_write_with_the_cookie_needs_the_csrf_token(broker, admin):
    browser = signed_in(broker)
    name = "csrf-" + uuid.uuid4().hex[:8]
    for token in (None, "wrong", browser.csrf[:-1]):
        extra = {} if token is None else {"X_CSRF_Token": token}
        status, body, _ = browser("POST", "/topics", {"name": name}, **extra)
        assert (status, body["error"]) == (403, "csrf"), token
        assert admin("GET", f"/topics/{name}")[0] == 404
    status, body, _ = browser("POST", "/topics", {"name": name}, X_CSRF_Token=browser.csrf)
    assert status == 201 and body["name"] == name


def test_a_cross_origin_write_is_refused_even_with_cookie_and_token(broker, admin):
    browser = signed_in(broker)
    name = "xorigin-" + uuid.uuid4().hex[:8]
    status, body, _ = browser("POST", "/topics", {"name": name}, X_CSRF_Token=browser.csrf,
                              Origin="http://evil.example")
    assert (status, body["error"]) == (403, "cross_origin")
    assert admin("GET", f"/topics/{name}")[0] == 404


def test_signing_out_ends_the_session_on_the_server_and_clears_the_cookie(broker):
    browser = signed_in(broker)
    assert browser("DELETE", "/session")[1]["error"] == "csrf"
    status, _, headers = browser("DELETE", "/session", X_CSRF_Token=browser.csrf)
    assert status == 204
    assert headers["Set-Cookie"].startswith('sluice_session=""') and "Max-Age=0" in headers["Set-Cookie"]
    assert browser("GET", "/topics")[0] == 401  # the old cookie, replayed, is dead
    assert browser("GET", "/session")[0] == 401


def test_a_non_admin_session_sees_only_what_the_user_may_and_changes_apply_at_once(broker, admin):
    browser = signed_in(broker, "viewer", "pw")
    assert browser("GET", "/session")[1]["admin"] is False
    assert {t["name"] for t in browser("GET", "/topics")[1]} == {"v-topic"}
    assert browser("GET", "/users")[0] == 403
    assert browser("GET", "/mqtt/retained")[0] == 403
    assert browser("POST", "/topics", {"name": "nope"}, X_CSRF_Token=browser.csrf)[0] == 403
    overview = browser("GET", "/overview")[1]
    assert "store" not in overview and "health" not in overview and "cluster" not in overview
    assert all(set(alarm) == {"name", "on"} for alarm in overview["alarms"])
    grant = {"kind": "topic", "pattern": "hidden-topic", "actions": ["subscribe"]}
    assert admin("POST", "/users/viewer/permissions", grant)[0] == 201
    try:
        assert {t["name"] for t in browser("GET", "/topics")[1]} == {"v-topic", "hidden-topic"}
    finally:
        assert admin("DELETE", "/users/viewer/permissions?kind=topic&pattern=hidden-topic")[0] == 204
    assert {t["name"] for t in browser("GET", "/topics")[1]} == {"v-topic"}


def test_deleting_a_user_ends_its_sessions(broker, admin):
    name = "doomed-" + uuid.uuid4().hex[:6]
    assert admin("POST", "/users", {"name": name, "password": "pw"})[0] == 201
    browser = signed_in(broker, name, "pw")
    assert browser("GET", "/topics")[0] == 200
    assert admin("DELETE", f"/users/{name}")[0] == 204
    assert browser("GET", "/topics")[0] == 401
    assert browser("GET", "/session")[0] == 401
    assert admin("POST", "/users", {"name": name, "password": "pw"})[0] == 201  # the same name
    assert browser("GET", "/topics")[0] == 401  # does not bring the old session back


def test_a_session_idle_longer_than_the_setting_has_ended(tmp_path):
    thread = BrokerThread(str(tmp_path / "data"), **{"admin.session_idle_timeout_s": 1})
    try:
        browser = signed_in(thread)
        assert browser("GET", "/session")[1]["idle_timeout_s"] == 1
        time.sleep(1.5)  # idle past the timeout, whatever the machine's speed: no race to lose
        status, body, _ = browser("GET", "/topics")
        assert status == 401 and "idle" in body["message"]
        assert Http(thread.running.admin_url)("GET", "/topics")[0] == 200  # Basic is unaffected
    finally:
        thread.stop()


# --- paging ---

def test_list_routes_page_sort_and_filter_on_the_server(broker, admin):
    names = [f"pg-{n:02d}" for n in range(12)]
    for name in names:
        assert admin("POST", "/topics", {"name": name, "queue_count": 1})[0] == 201
    status, rows, headers = admin("GET", "/topics?q=PG-&sort=-name&offset=2&limit=5")
    assert status == 200 and headers["X-Total-Count"] == "12"
    assert [r["name"] for r in rows] == sorted(names, reverse=True)[2:7]
    _, rows, headers = admin("GET", "/topics?q=pg-1")
    assert [r["name"] for r in rows] == ["pg-10", "pg-11"] and headers["X-Total-Count"] == "2"
    _, rows, headers = admin("GET", "/users?sort=-name&limit=1")
    assert rows == [{"name": "viewer", "admin": False}] and int(headers["X-Total-Count"]) >= 3
    assert admin("GET", "/users?q=SLUICE")[1] == [{"name": "sluice", "admin": True}]
    _, everything, headers = admin("GET", "/topics")  # no limit: the whole list, as before
    assert len(everything) == int(headers["X-Total-Count"]) >= 14


def test_a_non_admin_total_counts_only_what_it_may_see(broker):
    browser = signed_in(broker, "viewer", "pw")
    status, rows, headers = browser("GET", "/topics?limit=1")
    assert status == 200 and headers["X-Total-Count"] == "1" and rows[0]["name"] == "v-topic"


@pytest.mark.parametrize("path, says", [
    ("/groups?sort=colour", "sort by one of: consume_mode, fifo, name"),
    ("/clients?limit=5000", "limit=5000 is out of range: use 1-1000"),
    ("/vhosts?offset=-3", "offset='-3' is not a whole number 0 or more"),
    ("/queues?limit=ten", "limit='ten' is not a whole number 1-1000"),
    ("/acl?q=" + "x" * 300, "the filter takes at most 200"),
])
def test_a_bad_paging_value_is_a_400_that_says_what_to_send(admin, path, says):
    status, body, _ = admin("GET", path)
    assert status == 400 and body["error"] == "invalid_query" and says in body["message"], body


def test_openapi_documents_the_paging_query_and_the_total_header(admin):
    doc = admin("GET", "/openapi.json")[1]
    operation = doc["paths"]["/clients"]["get"]
    assert {"limit", "offset", "sort", "q"} <= {p["name"] for p in operation["parameters"]}
    assert "X-Total-Count" in operation["responses"]["200"]["headers"]
    assert doc["components"]["securitySchemes"]["session"]["name"] == "sluice_session"


def test_the_cli_lists_as_before(broker, capsys):
    from sluice.cli import main
    assert main(["topic", "list", "--admin", broker.running.admin_url]) == 0
    assert "pg-11" in capsys.readouterr().out


# --- overview, history, retained messages ---

def mqtt_client(broker, client_id: str) -> mqtt.Client:
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id,
                         protocol=mqtt.MQTTv311)
    client.username_pw_set("sluice", "sluice")
    client.connect("127.0.0.1", broker.running.mqtt_listeners.ports["tcp"], keepalive=60)
    client.loop_start()
    return client


def wait_for(predicate, what: str):
    """Poll ``predicate`` until it answers something true; fail after WAIT_S."""
    return waiting.wait_for(predicate, what, WAIT_S)


def test_overview_and_its_history_show_real_mqtt_traffic(broker, admin):
    client = mqtt_client(broker, "console-overview")
    try:
        wait_for(lambda: admin("GET", "/overview")[1]["connections"]["mqtt"] >= 1,
                 "the MQTT connection shows in the overview")
        row, = admin("GET", "/clients?q=console-overview&connected=true")[1]
        assert (row["protocol"], row["user"], row["details"]["mqtt_version"]) == (
            "mqtt", "sluice", "3.1.1")
        assert row["address"].startswith("127.0.0.1") and row["details"]["inflight"] == 0
        for n in range(20):
            client.publish("telemetry/console", b"m-%d" % n, qos=1).wait_for_publish(WAIT_S)

        def busy_sample():
            history = admin("GET", "/overview/history")[1]
            rates = history["series"]["published_per_s"]
            return history if any(rates) else None

        history = wait_for(busy_sample, "a sample with a nonzero publish rate")
        assert history["step_s"] >= 1
        assert set(history["series"]) == {"published_per_s", "delivered_per_s", "acked_per_s",
                                          "store_bytes", "connections_mqtt",
                                          "connections_amqp", "connections_native"}
        assert all(len(values) == len(history["t"]) for values in history["series"].values())
        assert history["t"] == sorted(history["t"]) and history["t"][-1] <= time.time() + 1
        assert max(history["series"]["connections_mqtt"]) >= 1
        assert history["series"]["store_bytes"][-1] > 0
    finally:
        client.loop_stop()
        client.disconnect()
    overview = admin("GET", "/overview")[1]
    assert overview["status"] == "ok" and overview["role"] == "standalone"
    assert overview["messages"]["published"] >= 20
    assert {a["name"]: a["on"] for a in overview["alarms"]} == {"disk": False, "memory": False}
    assert all(a["detail"] for a in overview["alarms"])
    assert overview["store"]["bytes"] > 0 and overview["store"]["disk_free_bytes"] > 0
    assert overview["health"]["status"] == "ok"


def test_retained_messages_are_listed_by_topic_with_prefix_and_paging(broker, admin):
    client = mqtt_client(broker, "console-retained")
    try:
        for topic, body in (("fleet/a/status", b"up"), ("fleet/b/status", b"down!"),
                            ("other/x", b"x")):
            client.publish(topic, body, qos=1, retain=True).wait_for_publish(WAIT_S)
    finally:
        client.loop_stop()
        client.disconnect()

    def fleet():
        rows = admin("GET", "/mqtt/retained?prefix=fleet/")[1]
        return rows if len(rows) == 2 else None

    rows = wait_for(fleet, "both fleet/ retained messages listed")
    assert [(r["topic"], r["size"], r["qos"]) for r in rows] == [("fleet/a/status", 2, 1),
                                                                 ("fleet/b/status", 5, 1)]
    assert all(abs(r["stored_ms"] / 1000 - time.time()) < 3600 for r in rows)
    status, page, headers = admin("GET", "/mqtt/retained?prefix=fleet/&sort=-size&limit=1")
    assert status == 200 and headers["X-Total-Count"] == "2"
    assert [r["topic"] for r in page] == ["fleet/b/status"]
    assert [r["topic"] for r in admin("GET", "/mqtt/retained?q=OTHER")[1]] == ["other/x"]
