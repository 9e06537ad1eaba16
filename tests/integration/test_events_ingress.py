"""POST /events/{topic}: CloudEvents over HTTP into the log, against a real broker over real
sockets. Events are sent with aiohttp, curl and the official SDK's HTTP binding in binary,
structured and batched mode, then received by an MQTT subscriber of evt2/# (paho) and a pika
consumer of a queue bound to amq.topic with evt2.#; bad requests get a clear 4xx, and users'
API tokens authenticate as Bearer until deleted (or their user is)."""
from __future__ import annotations

import asyncio
import base64
import json
import queue
import subprocess
import threading
from typing import Any

import aiohttp
import paho.mqtt.client as mqtt
import pika
import pytest
from cloudevents.core.bindings import http as ce_http
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent as SdkEvent
from multidict import CIMultiDict
from paho.mqtt.enums import CallbackAPIVersion

from core.cloudevents import from_native
from tests.integration.test_admin_api import BrokerThread, Http

WAIT_S = 30
CAP = 256 * 1024
BINARY = {"ce-id": "e-1", "ce-source": "/sensors/7", "ce-specversion": "1.0",
          "ce-type": "com.example.reading", "Content-Type": "application/json"}


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    thread = BrokerThread(str(tmp_path_factory.mktemp("ingress") / "data"),
                          **{"admin.events_max_body_bytes": CAP})
    admin = Http(thread.running.admin_url)
    for name, grants in (("writer", [("topic", "evt2", ["publish"])]), ("reader", [])):
        assert admin("POST", "/users", {"name": name, "password": "pw"})[0] == 201
        for kind, pattern, actions in grants:
            assert admin("POST", f"/users/{name}/permissions",
                         {"kind": kind, "pattern": pattern, "actions": actions})[0] == 201
    yield thread
    thread.stop()


@pytest.fixture(scope="module")
def admin(broker):
    return Http(broker.running.admin_url)


def post(broker, path: str, headers: dict[str, str] | list[tuple[str, str]], body: bytes,
         auth: tuple[str, str] | None = ("sluice", "sluice")) -> tuple[int, Any]:
    """POST with aiohttp: (status, JSON answer)."""
    async def call() -> tuple[int, Any]:
        sent = list(headers.items() if isinstance(headers, dict) else headers)
        if auth:
            sent.append(("Authorization", "Basic " + base64.b64encode(":".join(auth).encode())
                         .decode()))
        async with aiohttp.ClientSession() as session:
            async with session.post(broker.running.admin_url + path, data=body,
                                    headers=CIMultiDict(sent),
                                    skip_auto_headers=("Content-Type",)) as response:
                return response.status, await response.json(content_type=None)
    return asyncio.run(call())


def stored(admin, msg_id: str) -> dict[str, Any]:
    status, message, _ = admin("GET", f"/messages/{msg_id}")
    assert status == 200, message
    return message


class MqttSubscriber:
    """A paho client subscribed to ``topic_filter``; received messages land in ``messages``."""

    def __init__(self, broker, topic_filter: str) -> None:
        self.messages: queue.Queue = queue.Queue()
        subscribed = threading.Event()
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="ingress-sub",
                                  protocol=mqtt.MQTTv5)
        self.client.username_pw_set("sluice", "sluice")
        self.client.on_message = lambda c, u, message: self.messages.put(message)
        self.client.on_subscribe = lambda *args: subscribed.set()
        self.client.connect("127.0.0.1", broker.running.mqtt_listeners.ports["tcp"], keepalive=60)
        self.client.loop_start()
        self.client.subscribe(topic_filter, qos=1)
        assert subscribed.wait(WAIT_S), "SUBACK"

    def next(self) -> mqtt.MQTTMessage:
        return self.messages.get(timeout=WAIT_S)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


class AmqpQueue:
    """An exclusive pika queue bound to amq.topic with ``binding``."""

    def __init__(self, broker, binding: str) -> None:
        self.connection = pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", broker.running.amqp_listener.port, "/",
            pika.PlainCredentials("sluice", "sluice"), connection_attempts=1, socket_timeout=10))
        self.channel = self.connection.channel()
        self.name = self.channel.queue_declare("", exclusive=True).method.queue
        self.channel.queue_bind(self.name, "amq.topic", binding)

    def next(self) -> tuple[Any, Any, bytes]:
        for method, properties, body in self.channel.consume(self.name, auto_ack=True,
                                                             inactivity_timeout=WAIT_S):
            assert method is not None, "no message reached the AMQP queue"
            return method, properties, body
        raise AssertionError("unreachable")

    def close(self) -> None:
        self.connection.close()


def test_a_binary_mode_event_is_stored_durably_and_reaches_mqtt_and_amqp_subscribers(broker, admin):
    subscriber, amqp_queue = MqttSubscriber(broker, "evt2/#"), AmqpQueue(broker, "evt2.#")
    try:
        status, answer = post(broker, "/events/evt2/a/b", {**BINARY, "ce-time": "2024-05-01T12:00:00Z",
                                                           "ce-tenant": "t%C3%A9"}, b'{"v": 1}')
        assert status == 202, answer
        assert (answer["subject"], answer["topic"], len(answer["ids"])) == ("evt2/a/b", "evt2", 1)
        message = stored(admin, answer["ids"][0])
        assert message["topic"] == "evt2" and message["body_text"] == '{"v": 1}'
        properties = message["properties"]
        assert properties["sluice.subject"] == "evt2/a/b"
        assert properties["CE_contenttype"] == "application/json"
        event = from_native(properties, b'{"v": 1}')
        assert event is not None and dict(event.attributes) == {
            "id": "e-1", "source": "/sensors/7", "specversion": "1.0", "type": "com.example.reading",
            "time": "2024-05-01T12:00:00Z", "tenant": "té", "datacontenttype": "application/json"}
        received = subscriber.next()
        assert (received.topic, received.payload) == ("evt2/a/b", b'{"v": 1}')
        method, _, body = amqp_queue.next()
        assert (method.routing_key, body) == ("evt2.a.b", b'{"v": 1}')
    finally:
        subscriber.close()
        amqp_queue.close()


def test_amqp_consumers_read_the_event_with_the_sdk_rabbitmq_binding(broker):
    from cloudevents.core.bindings.rabbitmq import RabbitMQMessage, from_rabbitmq
    amqp_queue = AmqpQueue(broker, "evt2.rendered.#")
    try:
        assert post(broker, "/events/evt2/rendered/x", BINARY, b'{"v": 2}')[0] == 202
        _, properties, body = amqp_queue.next()
        event = from_rabbitmq(RabbitMQMessage(headers=dict(properties.headers or {}),
                                              body=body, content_type=properties.content_type),
                              JSONFormat())
        assert (event.get_id(), event.get_type(), event.get_data()) == (
            "e-1", "com.example.reading", {"v": 2})
    finally:
        amqp_queue.close()


def test_events_made_with_the_official_sdk_are_taken_in_binary_structured_and_batch_mode(broker,
                                                                                       admin):
    event = SdkEvent({"id": "sdk-1", "source": "/sdk", "type": "com.example.sdk",
                      "subject": "thing-9", "datacontenttype": "application/json"}, {"n": 1})
    binary, structured = ce_http.to_binary(event, JSONFormat()), ce_http.to_structured(event, JSONFormat())
    for message in (binary, structured):
        status, answer = post(broker, "/events/evt2/sdk", message.headers, message.body)
        assert status == 202, answer
        properties = stored(admin, answer["ids"][0])["properties"]
        assert (properties["CE_id"], properties["CE_subject"], properties["CE_type"]) == (
            "sdk-1", "thing-9", "com.example.sdk")
        assert json.loads(stored(admin, answer["ids"][0])["body_text"]) == {"n": 1}
    batch = [json.loads(ce_http.to_structured(SdkEvent(
        {"id": f"b-{n}", "source": "/sdk", "type": "com.example.batch"}, b"\x00\x01%d" % n),
        JSONFormat()).body) for n in range(3)]
    status, answer = post(broker, "/events/evt2/batch", {
        "Content-Type": "application/cloudevents-batch+json"}, json.dumps(batch).encode())
    assert status == 202 and len(answer["ids"]) == 3, answer
    bodies = [stored(admin, msg_id) for msg_id in answer["ids"]]
    assert [m["properties"]["CE_id"] for m in bodies] == ["b-0", "b-1", "b-2"]
    assert [m["body_base64"] for m in bodies] == [b["data_base64"] for b in batch]


def test_curl_posts_a_binary_mode_event(broker, admin):
    done = subprocess.run(
        ["curl", "-sS", "-u", "sluice:sluice", "-X", "POST", "-H", "ce-id: curl-1", "-H",
         "ce-source: /curl", "-H", "ce-specversion: 1.0", "-H", "ce-type: com.example.curl",
         "-H", "Content-Type: text/plain", "--data-binary", "hello",
         "-w", "\n%{http_code}", broker.running.admin_url + "/events/evt2/curl"],
        capture_output=True, text=True, timeout=WAIT_S, check=True)
    body, _, code = done.stdout.rpartition("\n")
    assert code == "202", done.stdout
    message = stored(admin, json.loads(body)["ids"][0])
    assert message["body_text"] == "hello" and message["properties"]["CE_id"] == "curl-1"


def test_encoded_slashes_are_levels_of_the_subject_too(broker):
    status, answer = post(broker, "/events/evt2%2Fx%2Fy", BINARY, b"{}")
    assert (status, answer["subject"], answer["topic"]) == (202, "evt2/x/y", "evt2")


INVALID = {
    "no ce- headers, not structured": ("/events/evt2/x", {"Content-Type": "application/json"},
                                       b"{}", "not_a_cloudevent", "binary mode"),
    "id missing": ("/events/evt2/x", {k: v for k, v in BINARY.items() if k != "ce-id"}, b"{}",
                   "invalid_cloudevent", "id"),
    "specversion 0.3": ("/events/evt2/x", {**BINARY, "ce-specversion": "0.3"}, b"{}",
                        "invalid_cloudevent", "specversion 1.0"),
    "time not RFC 3339": ("/events/evt2/x", {**BINARY, "ce-time": "yesterday"}, b"{}",
                          "invalid_cloudevent", "RFC 3339"),
    "bad attribute name": ("/events/evt2/x", {**BINARY, "ce-Bad_Name": "x"}, b"{}",
                           "invalid_cloudevent", "attribute names"),
    "structured, bad JSON": ("/events/evt2/x", {"Content-Type": "application/cloudevents+json"},
                             b'{"id": ', "invalid_cloudevent", "not JSON"),
    "structured, type missing": ("/events/evt2/x", {"Content-Type": "application/cloudevents+json"},
                                 b'{"id": "1", "source": "s", "specversion": "1.0"}',
                                 "invalid_cloudevent", "type"),
    "structured, data and data_base64": (
        "/events/evt2/x", {"Content-Type": "application/cloudevents+json"},
        b'{"id": "1", "source": "s", "specversion": "1.0", "type": "t", "data": 1, '
        b'"data_base64": "AA=="}', "invalid_cloudevent", "not both"),
    "batch not an array": ("/events/evt2/x", {"Content-Type": "application/cloudevents-batch+json"},
                           b"{}", "invalid_cloudevent", "JSON array"),
    "batch empty": ("/events/evt2/x", {"Content-Type": "application/cloudevents-batch+json"},
                    b"[]", "invalid_cloudevent", "empty"),
    "batch with a bad event": ("/events/evt2/x",
                               {"Content-Type": "application/cloudevents-batch+json"},
                               b'[{"id": "1", "source": "s", "specversion": "1.0", "type": "t"}, 7]',
                               "invalid_cloudevent", "event 1 of the batch"),
    "wildcard subject": ("/events/evt2/%2B/x", BINARY, b"{}", "invalid_subject", "wildcard"),
    "broker subject": ("/events/$SYS/x", BINARY, b"{}", "invalid_subject", "$"),
}


@pytest.mark.parametrize("case", INVALID, ids=str)
def test_an_invalid_request_is_a_400_that_says_what_to_fix_and_stores_nothing(broker, admin, case):
    path, headers, body, code, hint = INVALID[case]
    before = admin("GET", "/topics/evt2")[1].get("messages")
    status, answer = post(broker, path, headers, body)
    assert (status, answer["error"]) == (400, code), answer
    assert hint in answer["message"], answer
    assert admin("GET", "/topics/evt2")[1].get("messages") == before


def test_a_repeated_attribute_header_is_refused(broker):
    status, answer = post(broker, "/events/evt2/x", [*BINARY.items(), ("ce-id", "e-2")], b"{}")
    assert status == 400 and "twice" in answer["message"], answer


def test_who_may_publish_and_how_much(broker):
    assert post(broker, "/events/evt2/x", BINARY, b"{}", auth=None)[0] == 401
    status, answer = post(broker, "/events/evt2/x", BINARY, b"{}", auth=("reader", "pw"))
    assert status == 403 and "publish" in answer["message"], answer
    assert post(broker, "/events/evt2/x", BINARY, b"{}", auth=("writer", "pw"))[0] == 202
    assert post(broker, "/events/other/x", BINARY, b"{}", auth=("writer", "pw"))[0] == 403
    status, answer = post(broker, "/events/evt2/x", BINARY, b"x" * (CAP + 1))
    assert status == 413 and "admin.events_max_body_bytes" in answer["message"], answer
    assert post(broker, "/events/evt2/x", BINARY, b"x" * CAP)[0] == 202
    one = {"id": "1", "source": "s", "specversion": "1.0", "type": "t"}
    status, answer = post(broker, "/events/evt2/x", {
        "Content-Type": "application/cloudevents-batch+json"}, json.dumps([one] * 1001).encode())
    assert status == 413 and "at most 1000" in answer["message"], answer


def test_ingress_is_counted_in_the_metrics(broker):
    assert post(broker, "/events/evt2/m", BINARY, b"{}")[0] == 202
    assert post(broker, "/events/evt2/m", {"Content-Type": "text/plain"}, b"x")[0] == 400
    metrics = Http(broker.running.admin_url, None)("GET", "/metrics")[1]
    assert 'sluice_ingress_requests_total{mode="binary",result="accepted"}' in metrics
    assert 'sluice_ingress_requests_total{mode="unknown",result="invalid"}' in metrics
    assert 'sluice_ingress_events_total{mode="binary"}' in metrics


# --- API tokens ---

def bearer_post(broker, token: str, path: str = "/events/evt2/token") -> tuple[int, Any]:
    async def call() -> tuple[int, Any]:
        async with aiohttp.ClientSession() as session:
            async with session.post(broker.running.admin_url + path, data=b"{}", headers={
                    **BINARY, "Authorization": f"Bearer {token}"}) as response:
                return response.status, await response.json(content_type=None)
    return asyncio.run(call())


def test_a_token_publishes_as_its_user_until_it_is_deleted(broker, admin):
    writer = Http(broker.running.admin_url, "writer", "pw")
    status, made, _ = writer("POST", "/users/writer/tokens")
    assert status == 201 and made["token"].startswith("slt_") and made["user"] == "writer"
    status, answer = bearer_post(broker, made["token"])
    assert status == 202, answer
    assert bearer_post(broker, made["token"], "/events/other/x")[0] == 403  # the user's rights
    listed = writer("GET", "/users/writer/tokens")[1]
    assert [t["id"] for t in listed] == [made["id"]] and "token" not in listed[0]
    assert listed[0]["last_used_ms"] >= made["created_ms"]
    assert made["token"] not in json.dumps(admin("GET", "/users/writer/tokens")[1])
    # a token cannot mint another: that takes the password
    status, answer = bearer_post(broker, made["token"], "/users/writer/tokens")
    assert status == 403 and "password" in answer["message"], answer
    assert writer("POST", "/users/reader/tokens")[0] == 403  # nor may a user make others' tokens
    wrong = made["token"][:-4] + "AAAA"
    assert bearer_post(broker, wrong)[0] == 401
    assert bearer_post(broker, "slt_garbage")[0] == 401
    assert writer("DELETE", f"/users/writer/tokens/{made['id']}")[0] == 204
    assert bearer_post(broker, made["token"])[0] == 401
    assert writer("DELETE", f"/users/writer/tokens/{made['id']}")[0] == 404


def test_an_event_source_that_cannot_set_headers_sends_its_token_in_the_url(broker, admin):
    token = admin("POST", "/users/writer/tokens")[1]["token"]
    status, answer = post(broker, f"/events/evt2/ping?access_token={token}", BINARY, b"{}", auth=None)
    assert status == 202, answer
    assert stored(admin, answer["ids"][0])["properties"]["CE_id"] == BINARY["ce-id"]
    assert post(broker, f"/events/evt2/ping?access_token={token[:-4]}AAAA", BINARY, b"{}",
                auth=None)[0] == 401
    assert post(broker, "/events/evt2/ping?access_token=", BINARY, b"{}", auth=None)[0] == 401
    # no other route takes a token in its URL
    async def list_topics() -> int:
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{broker.running.admin_url}/topics?access_token={token}") as response:
                return response.status
    assert asyncio.run(list_topics()) == 401


def test_deleting_a_user_ends_its_tokens(broker, admin):
    assert admin("POST", "/users", {"name": "shortlived", "password": "pw"})[0] == 201
    assert admin("POST", "/users/shortlived/permissions",
                 {"kind": "topic", "pattern": "evt2", "actions": ["publish"]})[0] == 201
    token = admin("POST", "/users/shortlived/tokens")[1]["token"]
    assert bearer_post(broker, token)[0] == 202
    assert admin("DELETE", "/users/shortlived")[0] == 204
    assert bearer_post(broker, token)[0] == 401
    assert admin("POST", "/users", {"name": "shortlived", "password": "pw"})[0] == 201
    assert admin("GET", "/users/shortlived/tokens")[1] == []  # a new user of that name has none
    assert bearer_post(broker, token)[0] == 401


def test_wrong_tokens_are_throttled_like_wrong_passwords(tmp_path):
    thread = BrokerThread(str(tmp_path / "data"), **{"core.login_failure_delay_ms": 0,
                                                     "core.login_max_failures_per_peer_user": 3})
    try:
        token = Http(thread.running.admin_url)("POST", "/users/sluice/tokens")[1]["token"]
        wrong = token[:-4] + ("AAAA" if not token.endswith("AAAA") else "BBBB")
        assert [bearer_post(thread, wrong)[0] for _ in range(3)] == [401] * 3
        status, answer = bearer_post(thread, token)  # the right one too, from this address
        assert status == 429, answer
    finally:
        thread.stop()


def test_the_cli_makes_lists_and_deletes_tokens(broker, capsys):
    from sluice.cli import main
    common = ["--admin", broker.running.admin_url, "--user", "writer", "--password", "pw"]
    assert main(["user", "token", "create", "writer", *common, "--json"]) == 0
    made = json.loads(capsys.readouterr().out)
    assert bearer_post(broker, made["token"])[0] == 202
    assert main(["user", "token", "list", "writer", *common]) == 0
    assert made["id"] in capsys.readouterr().out
    assert main(["user", "token", "delete", "writer", made["id"], *common]) == 0
    capsys.readouterr()
    assert bearer_post(broker, made["token"])[0] == 401
    with pytest.raises(SystemExit) as help_exit:
        main(["user", "token", "create", "--help"])
    assert help_exit.value.code == 0 and "Bearer" in capsys.readouterr().out
