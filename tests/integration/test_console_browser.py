"""The web console in headless Chromium against a real `sluice serve`: an administrator signs
in, sees a real mosquitto_sub and a pika consumer among the clients, disconnects mosquitto_sub
(which sees the DISCONNECT), creates a user, purges a queue, looks a message up by id, watches
the overview's charts and signs out; a user without admin rights sees only its own sections.
Every page's screenshot is kept in test-artifacts/console/."""
from __future__ import annotations

import asyncio
import json
import re
import subprocess
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from sluice.client import ClientConfig, Message, Producer
from tests.browser import headless_chromium
from tests.conftest import CONFIG, Server
from tests.integration.push_receiver import Receiver
from tests.integration.test_admin_api import Http

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "console"
WAIT_S = 60
PAGE_CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
            "connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
CONSOLE_CONFIG = CONFIG + "[core]\nmessage_trace = true\n[push]\nallowed_sinks = \"127.0.0.0/8\"\n"
VIEWER, VIEWER_PASSWORD = "console-viewer", "viewer-pw-1"
BACKLOG, WORK = "console-backlog", "console-work"
MARKUP_TOPIC = "site/<img src=x onerror=window.injected=1>"


@pytest.fixture
def browser(tmp_path):
    yield from headless_chromium(tmp_path / "chromium-profile", window="1400,1000")


@pytest.fixture
def broker(sluice_server, tmp_path) -> Server:
    server = sluice_server(tmp_path / "data", config=CONSOLE_CONFIG)
    server.wait_ready()
    return server


@pytest.fixture
def shots() -> Iterator[list[Path]]:
    """Where each page's screenshot goes; the files written are listed at the end."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    yield written
    print("console screenshots:", *map(str, written), sep="\n  ")


def screenshot(driver, written: list[Path], name: str) -> None:
    path = ARTIFACTS / f"{name}.png"
    driver.save_screenshot(str(path))
    written.append(path)


class Page:
    """The console in the browser, with the waits its tests need."""

    def __init__(self, driver, admin_url: str) -> None:
        from selenium.common.exceptions import StaleElementReferenceException
        from selenium.webdriver.support.ui import WebDriverWait

        self.driver, self.url = driver, admin_url
        # lists are drawn again as they refresh: an element found a moment ago may be gone
        self.wait = WebDriverWait(driver, WAIT_S, ignored_exceptions=(StaleElementReferenceException,))

    def find(self, css: str):
        from selenium.webdriver.common.by import By
        return self.driver.find_elements(By.CSS_SELECTOR, css)

    def one(self, css: str):
        """The element ``css`` selects, once it is there and shown."""
        self.wait.until(lambda d: any(e.is_displayed() for e in self.find(css)), f"no {css}")
        return next(e for e in self.find(css) if e.is_displayed())

    def sign_in(self, user: str, password: str) -> None:
        self.driver.get(f"{self.url}/console")
        self.one("#login-user").send_keys(user)
        self.one("#login-password").send_keys(password)
        self.one("#login-submit").click()
        self.one("#logout")

    def go(self, route: str) -> None:
        self.driver.get(f"{self.url}/console#/{route}")

    def row(self, table: str, key: str):
        return self.one(f'#{table} tr[data-key="{key}"]')

    def cell_text(self, table: str, key: str, column: str) -> str:
        return self.row(table, key).find_element("css selector", f"td.col-{column}").text

    def confirm(self) -> None:
        self.one("#confirm-yes").click()
        self.wait.until(lambda d: not self.find("#confirm"), "the dialog stayed open")

    def fetch_status(self, path: str) -> int:
        """The status the page's own fetch of ``path`` gets (its cookie, if any)."""
        return self.driver.execute_async_script(
            "const done = arguments[arguments.length - 1];"
            "fetch(arguments[0], {credentials: 'same-origin'}).then(r => done(r.status), e => done(String(e)));",
            path)

    def csp_violations(self) -> list[str]:
        return [e["message"] for e in self.driver.get_log("browser") if "Content Security" in e["message"]]


SET_INPUT = """
arguments[0].value = arguments[1];
arguments[0].dispatchEvent(new Event("input", {bubbles: true}));
"""
"""Set an input's value as typing would (a datetime-local field's keys depend on the locale)."""


def start_mosquitto_sub(server: Server, client_id: str) -> subprocess.Popen:
    host, port = server.mqtt.rsplit(":", 1)
    return subprocess.Popen(
        ["stdbuf", "-oL", "mosquitto_sub", "-h", host, "-p", port, "-u", "sluice", "-P", "sluice",
         "-i", client_id, "-V", "mqttv5", "-q", "1", "-t", "console/#", "-d"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def retain(server: Server, topic: str, payload: str) -> None:
    """Publish a retained QoS 1 message with mosquitto_pub."""
    host, port = server.mqtt.rsplit(":", 1)
    subprocess.run(["mosquitto_pub", "-h", host, "-p", port, "-u", "sluice", "-P", "sluice",
                    "-q", "1", "-r", "-t", topic, "-m", payload], check=True, timeout=WAIT_S)


class PikaConsumer(threading.Thread):
    """A pika BlockingConnection consuming ``WORK``; the thread owns the connection."""

    def __init__(self, server: Server) -> None:
        super().__init__(daemon=True)
        self.server, self.stop = server, threading.Event()
        self.consuming, self.error = threading.Event(), None

    def run(self) -> None:
        import pika
        try:
            connection = pika.BlockingConnection(amqp_parameters(self.server, "console-consumer"))
            channel = connection.channel()
            channel.queue_declare(WORK, durable=True)
            channel.basic_consume(WORK, lambda ch, method, props, body: ch.basic_ack(method.delivery_tag))
            self.consuming.set()
            while not self.stop.is_set():
                connection.process_data_events(time_limit=0.5)
            connection.close()
        except Exception as error:  # reported by the test that waits on ``consuming``
            self.error = error
            self.consuming.set()


def amqp_parameters(server: Server, name: str):
    import pika
    host, port = server.amqp.rsplit(":", 1)
    return pika.ConnectionParameters(host, int(port), credentials=pika.PlainCredentials("sluice", "sluice"),
                                     client_properties={"connection_name": name})


def fill_backlog(server: Server, count: int, more_queues: int) -> None:
    """``count`` messages in ``BACKLOG``, and ``more_queues`` empty queues to page through."""
    import pika
    connection = pika.BlockingConnection(amqp_parameters(server, "console-filler"))
    channel = connection.channel()
    channel.confirm_delivery()
    channel.queue_declare(BACKLOG, durable=True)
    for n in range(more_queues):
        channel.queue_declare(f"bulk-{n:03}", durable=True)
    for n in range(count):
        channel.basic_publish("", BACKLOG, f"job {n}".encode(), pika.BasicProperties(delivery_mode=2))
    connection.close()


def publish(server: Server, topic: str, body: bytes) -> str:
    async def send() -> str:
        async with Producer(ClientConfig(server.native, "sluice", "sluice", request_timeout=10)) as producer:
            return (await producer.send(Message(topic, body, keys=("order-7",)))).message_id
    return asyncio.run(send())


def test_an_administrator_manages_the_broker_from_the_console(broker, browser, shots):
    admin = Http(broker.admin)
    subscriber = start_mosquitto_sub(broker, "console-sub")
    consumer = PikaConsumer(broker)
    consumer.start()
    try:
        assert consumer.consuming.wait(WAIT_S) and consumer.error is None, consumer.error
        fill_backlog(broker, 5, more_queues=60)
        assert admin("POST", "/topics", {"name": "orders", "queue_count": 2})[0] == 201
        msg_id = publish(broker, "orders", json.dumps({"order": 7, "items": ["tea"]}).encode())
        retain(broker, "site/hall/door", "open")
        retain(broker, MARKUP_TOPIC, "<script>window.injected = 1</script>")
        assert admin("POST", "/groups", {"name": "console-group"})[0] == 201
        page = Page(browser, broker.admin)
        page.wait.until(lambda d: {(c["protocol"], c["user"]) for c in admin("GET", "/clients")[1]}
                        == {("mqtt", "sluice"), ("amqp", "sluice")},
                        "mosquitto_sub and pika are not both connected")
        page.sign_in("sluice", "sluice")
        assert "sluice (admin)" in page.one("#whoami").text

        # Clients: both real clients listed; disconnect mosquitto_sub, which sees it
        page.go("clients")
        sub_row = page.row("clients", "mqtt/console-sub")
        assert "sluice" in sub_row.text and "MQTT 5.0" in sub_row.text
        assert page.cell_text("clients", "mqtt/console-sub", "inflight") == "0"
        page.wait.until(lambda d: page.find("#clients tr[data-key^='amqp/']"), "no AMQP client")
        amqp_rows = page.find("#clients tr[data-key^='amqp/']")
        assert any("AMQP 0-9-1" in row.text for row in amqp_rows)
        amqp_key = amqp_rows[0].get_attribute("data-key")
        assert page.cell_text("clients", amqp_key, "inflight") == "0", "the consumer acks at once"
        assert re.fullmatch(r"[0-9.,]+", page.cell_text("clients", "mqtt/console-sub", "deliver_rate"))
        screenshot(browser, shots, "clients")
        sub_row.find_element("css selector", "td.col-client_id a").click()
        assert "console/#" in page.one("#client-detail .subscriptions").text
        assert "delivered (out/s)" in page.one("#client-detail").text
        screenshot(browser, shots, "client-detail")
        browser.back()
        sub_row = page.row("clients", "mqtt/console-sub")
        sub_row.find_element("css selector", "button.kick").click()
        assert "console-sub" in page.one("#confirm").text
        screenshot(browser, shots, "clients-confirm-disconnect")
        page.confirm()
        output, _ = subscriber.communicate(timeout=WAIT_S)
        assert "Received DISCONNECT (152)" in output, output  # 0x98 Administrative action
        page.wait.until(lambda d: not page.find('#clients tr[data-key="mqtt/console-sub"]'),
                        "the disconnected client is still listed")

        # Users & access: create a user
        page.go("users/users")
        page.one("#new-user-name").send_keys(VIEWER)
        page.one("#new-user-password").send_keys(VIEWER_PASSWORD)
        page.one("#user-create-submit").click()
        assert page.cell_text("users", VIEWER, "admin") == "no"
        assert any(u["name"] == VIEWER and not u["admin"] for u in admin("GET", "/users")[1])
        page.row("users", VIEWER).find_element("css selector", "button.permissions").click()
        page.one("#grant-pattern").send_keys("orders")
        page.one("#grant button[type=submit]").click()
        page.one('#permissions tr[data-key="topic/orders"]')
        assert [(p["kind"], p["pattern"], p["actions"]) for p in
                admin("GET", f"/users/{VIEWER}/permissions")[1]] == [("topic", "orders", ["subscribe"])]
        screenshot(browser, shots, "users")
        page.go("users/acl")
        page.one("#acl-pattern").send_keys("site/%u/#")
        page.one("#acl-add button[type=submit]").click()
        page.row("acl", "*/allow/site/%u/#")
        page.go("users/vhosts")
        page.one("#new-vhost").send_keys("console-vhost")
        page.one("#vhost-create button[type=submit]").click()
        page.row("vhosts", "console-vhost")
        assert "console-vhost" in {v["name"] for v in admin("GET", "/vhosts")[1]}
        screenshot(browser, shots, "users-vhosts")

        # Topics & queues, AMQP: 62 queues a page of 50 at a time, filtered; purge the backlog
        page.go("topics/amqp")
        pager = "#queues + .pager"
        page.wait.until(lambda d: page.one(f"{pager} .range").text == "1–50 of 62", "no first page")
        assert len(page.find("#queues tbody tr")) == 50
        page.one(f"{pager} button.next").click()
        page.wait.until(lambda d: page.one(f"{pager} .range").text == "51–62 of 62", "no second page")
        page.one("#queues-filter").send_keys("CONSOLE-")  # case does not matter
        page.wait.until(lambda d: page.one(f"{pager} .range").text == "1–2 of 2", "the filter")
        assert page.find("#queues tbody tr")[0].get_attribute("data-key") == f"//{BACKLOG}"
        page.one("#queues th[data-sort=name] button").click()  # by name, now descending
        page.wait.until(lambda d: page.find("#queues tbody tr")[0].get_attribute("data-key") == f"//{WORK}",
                        "sorting by name in reverse")
        key = f"//{BACKLOG}"
        page.wait.until(lambda d: page.cell_text("queues", key, "messages_ready") == "5",
                        "the backlog queue does not show 5 ready messages")
        page.row("queues", key).find_element("css selector", "button.purge").click()
        assert BACKLOG in page.one("#confirm").text
        page.confirm()
        page.wait.until(lambda d: page.cell_text("queues", key, "messages_ready") == "0",
                        "the purged queue still shows ready messages")
        assert admin("GET", f"/queues/%2F/{BACKLOG}")[1]["messages_ready"] == 0
        assert page.cell_text("queues", f"//{WORK}", "consumers") == "1"
        screenshot(browser, shots, "topics-amqp")
        page.go("topics/native")
        page.row("topics", "orders").find_element("css selector", "a").click()
        page.one('#topic-queues tr[data-key="1"]')
        assert sum(int(page.cell_text("topic-queues", str(q), "messages")) for q in (0, 1)) == 1
        screenshot(browser, shots, "topic-detail")
        page.go("topics/retained")
        assert page.cell_text("retained", "site/hall/door", "qos") == "1"
        page.one('#retained tr[data-key="site/hall/door"] a').click()  # into the branch site/
        page.wait.until(lambda d: page.one(".breadcrumb").text.endswith("site"), "no branch")
        assert page.cell_text("retained", "site/hall/door", "size") == "4 B"
        assert MARKUP_TOPIC in page.row("retained", MARKUP_TOPIC).text  # shown as text
        assert not page.find("#retained img") and browser.execute_script("return window.injected") is None
        screenshot(browser, shots, "topics-retained")

        # Messages: look the published message up by id
        page.go("messages")
        page.one("#msg-id").send_keys(msg_id)
        page.one("#msg-go").click()
        body = page.one("#message-body")
        assert body.get_attribute("data-mode") == "json"
        assert '"items": [' in body.text and '"tea"' in body.text
        assert "order-7" in page.one("#message-headers").text
        page.wait.until(lambda d: any("stored" in r.text for r in page.find("#trace tbody tr")),
                        "the message's trace shows no stored event")
        screenshot(browser, shots, "messages")

        # Groups: move a group's offsets on orders to a time before the message: lag 1
        page.go("groups/console-group")
        page.one("#reset-offset input[list]").send_keys("orders")
        browser.execute_script(SET_INPUT, page.one("#reset-offset input[type=datetime-local]"),
                               "2020-01-01T00:00:00")
        page.one("#reset-offset button[type=submit]").click()
        assert "console-group" in page.one("#confirm").text
        page.confirm()
        page.wait.until(lambda d: len(page.find("#group-lag tr[data-key^='orders/']")) == 2,
                        "no lag per queue of orders")
        assert sum(int(page.cell_text("group-lag", f"orders/{q}", "lag")) for q in (0, 1)) == 1
        screenshot(browser, shots, "groups")

        # Overview: health and the charts of the last hour, drawn by uPlot
        page.go("overview")
        assert page.one("#health .status").text == "ok"
        page.one("#chart-rates canvas")
        page.one("#chart-connections canvas")
        screenshot(browser, shots, "overview")

        # Sign out: the form is back and the API refuses the page's calls
        page.one("#logout").click()
        page.one("#login-user")
        assert page.fetch_status("/topics") == 401
        assert page.fetch_status("/session") == 401
        screenshot(browser, shots, "signed-out")
        assert page.csp_violations() == []
    finally:
        consumer.stop.set()
        consumer.join(timeout=WAIT_S)
        if subscriber.poll() is None:
            subscriber.kill()
            subscriber.wait()


def test_a_user_without_admin_rights_sees_only_its_sections(broker, browser, shots):
    admin = Http(broker.admin)
    assert admin("POST", "/users", {"name": VIEWER, "password": VIEWER_PASSWORD})[0] == 201
    assert admin("POST", "/topics", {"name": "viewer-topic", "queue_count": 1})[0] == 201
    assert admin("POST", "/topics", {"name": "hidden-topic", "queue_count": 1})[0] == 201
    assert admin("POST", f"/users/{VIEWER}/permissions",
                 {"kind": "topic", "pattern": "viewer-*", "actions": ["subscribe"]})[0] == 201

    request = urllib.request.urlopen(f"{broker.admin}/console", timeout=30)
    assert request.headers["Content-Security-Policy"] == PAGE_CSP
    assert request.headers["X-Frame-Options"] == "DENY"

    page = Page(browser, broker.admin)
    page.sign_in(VIEWER, VIEWER_PASSWORD)
    assert page.one("#whoami").text == VIEWER
    nav = {a.get_attribute("data-page") for a in page.find("header nav a")}
    assert nav == {"overview", "topics", "groups", "messages", "push"}

    for route, name in (("overview", "viewer-overview"), ("topics", "viewer-topics"),
                        ("groups", "viewer-groups"), ("messages", "viewer-messages"),
                        ("clients", "viewer-clients-link")):
        page.go(route)
        page.one("main.page h2")
        if route == "topics":
            page.row("topics", "viewer-topic")
            assert not page.find('#topics tr[data-key="hidden-topic"]')
            assert {a.get_attribute("data-tab") for a in page.find("nav.tabs a")} == {"native"}
        if route == "overview":
            page.one("#chart-rates canvas")
        if route == "clients":  # an admin page's address shows the first page instead
            assert page.one("main.page").get_attribute("id") == "page-overview"
        assert not [p.text for p in page.find(".problem")], f"{route} shows an error"
        screenshot(browser, shots, name)
    assert page.csp_violations() == []
    assert page.fetch_status("/clients") == 403  # the API, not only the page, says no

    # The user is deleted while its page is open: the next refresh gets a 401, the form is back
    page.go("overview")
    page.one("#chart-rates canvas")
    assert admin("DELETE", f"/users/{VIEWER}")[0] == 204
    assert "session ended" in page.one("#login-notice").text
    assert page.fetch_status("/session") == 401


def test_a_page_left_alone_signs_out_after_the_idle_timeout(sluice_server, tmp_path, browser, shots):
    broker = sluice_server(tmp_path / "data", config=CONFIG + "[admin]\nsession_idle_timeout_s = 3\n")
    broker.wait_ready()
    page = Page(browser, broker.admin)
    page.sign_in("sluice", "sluice")
    assert "Signed out after 3 seconds without activity" in page.one("#login-notice").text
    assert page.fetch_status("/session") == 401
    assert page.fetch_status("/topics") == 401
    screenshot(browser, shots, "idle-signed-out")


def test_push_subscriptions_are_watched_paused_and_deleted_from_the_console(broker, browser, shots):
    admin = Http(broker.admin)
    receiver = Receiver()
    try:
        status, created, _ = admin("POST", "/push-subscriptions",
                                {"name": "console-push", "topic": "alerts", "sink": receiver.url})
        assert status == 201, created
        publish(broker, "alerts", b'{"level": "high"}')
        receiver.wait(1)
        page = Page(browser, broker.admin)
        page.sign_in("sluice", "sluice")
        page.go("push")
        page.wait.until(lambda d: page.cell_text("push-subscriptions", "console-push", "delivered") == "1",
                        "the list does not show the delivered event")
        assert page.cell_text("push-subscriptions", "console-push", "sink") == receiver.url
        assert page.cell_text("push-subscriptions", "console-push", "state") == "running"
        screenshot(browser, shots, "push")
        page.row("push-subscriptions", "console-push").find_element("css selector", "button.push-pause").click()
        page.wait.until(lambda d: admin("GET", "/push-subscriptions/console-push")[1]["paused"],
                        "pausing from the list did not pause the subscription")
        page.row("push-subscriptions", "console-push").find_element("css selector", "a").click()
        page.wait.until(lambda d: "paused" in page.one("#push-stats").text, "the detail is not paused")
        assert receiver.url in page.one("#push-settings").text
        screenshot(browser, shots, "push-detail")
        page.one("#push-detail button.push-resume").click()
        page.wait.until(lambda d: not admin("GET", "/push-subscriptions/console-push")[1]["paused"],
                        "resuming from the detail did not resume the subscription")
        page.one("#push-detail button.push-delete").click()
        assert "console-push" in page.one("#confirm").text
        page.confirm()
        page.wait.until(lambda d: admin("GET", "/push-subscriptions/console-push")[0] == 404,
                        "the subscription was not deleted")
        assert page.csp_violations() == []
    finally:
        receiver.stop()
