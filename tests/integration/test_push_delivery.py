"""Push subscriptions end to end: a real broker POSTs what MQTT and AMQP clients publish to real
aiohttp receivers on 127.0.0.1, which parse it with the official CloudEvents SDK and verify the
Standard Webhooks signature; retries, Retry-After, dead-lettering, replies, pause, delete,
ordering and the refusal of sinks the allow-list does not cover."""
from __future__ import annotations

import asyncio
import itertools
import json

import paho.mqtt.client as mqtt
import pika
import pytest
from aiohttp import web
from cloudevents.core.bindings.http import HTTPMessage, from_http
from cloudevents.core.formats.json import JSONFormat
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from standardwebhooks import Webhook

from core.model import SYSTEM, OutgoingMessage
from tests.integration.push_receiver import Receiver, Seen
from tests.integration.test_admin_api import BrokerThread, Http
from tests.waiting import wait_for

WAIT_S = 60
NAMES = itertools.count()


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    thread = BrokerThread(str(tmp_path_factory.mktemp("push") / "data"),
                          **{"push.allowed_sinks": "127.0.0.0/8", "core.message_trace": True})
    yield thread
    thread.stop()


@pytest.fixture(scope="module")
def http(broker):
    return Http(broker.running.admin_url)


@pytest.fixture
def receivers():
    started: list[Receiver] = []

    def start(answer=None, host: str = "127.0.0.1") -> Receiver:
        receiver = Receiver(answer, host) if answer else Receiver(host=host)
        started.append(receiver)
        return receiver
    yield start
    for receiver in started:
        receiver.stop()


def fresh(prefix: str) -> str:
    return f"{prefix}{next(NAMES)}"


def subscribe(http: Http, topic: str, sink: str, **fields) -> dict:
    name = fields.pop("name", None) or fresh("push")
    status, body, _ = http("POST", "/push-subscriptions",
                           {"name": name, "topic": topic, "sink": sink, **fields})
    assert status == 201, body
    return body


def topic(http: Http, queue_count: int = 2) -> str:
    name = fresh("evt")
    assert http("POST", "/topics", {"name": name, "queue_count": queue_count})[0] == 201
    return name


def stats(http: Http, name: str) -> dict:
    status, body, _ = http("GET", f"/push-subscriptions/{name}")
    assert status == 200, body
    return body["stats"]


def event_of(seen: Seen):
    headers = {k.lower(): v for k, v in seen.headers.items()}
    return from_http(HTTPMessage(headers, seen.body), JSONFormat())


def verify(secret: str, seen: Seen) -> None:
    Webhook(secret).verify(seen.body, seen.headers)  # raises unless signed with the secret


def mqtt_publish(broker: BrokerThread, subject: str, payload: bytes, user_properties=(),
                 content_type: str = "application/json") -> None:
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=fresh("pub"),
                         protocol=mqtt.MQTTv5)
    client.username_pw_set("sluice", "sluice")
    client.connect("127.0.0.1", broker.running.mqtt_listeners.ports["tcp"], keepalive=60)
    client.loop_start()
    try:
        properties = Properties(PacketTypes.PUBLISH)
        if user_properties:
            properties.UserProperty = list(user_properties)
            properties.ContentType = content_type
        client.publish(subject, payload, qos=1, properties=properties).wait_for_publish(WAIT_S)
    finally:
        client.disconnect()
        client.loop_stop()


def amqp_publish(broker: BrokerThread, routing_key: str, payload: bytes, headers=None) -> None:
    connection = pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", broker.running.amqp_listener.port, "/",
        pika.PlainCredentials("sluice", "sluice"), connection_attempts=1, socket_timeout=10))
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.basic_publish("amq.topic", routing_key, payload, pika.BasicProperties(
            headers=headers, content_type="application/json" if headers else None))
    finally:
        connection.close()


def native_send(broker: BrokerThread, topic: str, body: bytes, **fields) -> str:
    sent = broker.call(broker.running.broker.send(SYSTEM, [OutgoingMessage(topic, body, **fields)]))
    return sent[0].msg_id


def consume(broker: BrokerThread, topic: str, count: int = 1) -> list:
    """``count`` messages of ``topic``, popped by a group of the test's own."""
    group, found = fresh("reader"), []
    while len(found) < count:
        found += broker.call(broker.running.broker.receive(SYSTEM, group, topic, "c",
                                                           max_messages=32, wait_ms=20_000))
        assert found, f"nothing arrived in {topic}"
    return found


# --- formats and protocols ---

@pytest.mark.parametrize("mode", ["binary", "structured", "raw"])
def test_a_plain_mqtt_publish_is_pushed_as_a_synthesized_event(broker, http, receivers, mode):
    receiver = receivers()
    name = topic(http)
    created = subscribe(http, name, receiver.url, format=mode)
    mqtt_publish(broker, f"{name}/d1/temp", b'{"t": 21.5}')
    seen = receiver.wait(1)[0]
    verify(created["secret"], seen)
    if mode == "raw":
        assert seen.body == b'{"t": 21.5}'
        assert not any(h.lower().startswith("ce-") for h in seen.headers)
        return
    event = event_of(seen)
    assert event.get_type() == "sluice.message"
    assert event.get_source() == f"/sluice/topics/{name}"
    assert event.get_subject() == f"{name}/d1/temp"
    assert seen.headers["webhook-id"] == event.get_id()
    assert event.get_time() is not None
    data = event.get_data()
    assert (json.loads(data) if isinstance(data, bytes | str) else data) == {"t": 21.5}


@pytest.mark.parametrize("mode", ["binary", "structured", "raw"])
def test_an_mqtt5_cloudevent_keeps_its_attributes(broker, http, receivers, mode):
    receiver = receivers()
    name = topic(http)
    created = subscribe(http, name, receiver.url, format=mode)
    mqtt_publish(broker, f"{name}/d2", b'{"t": 3}', [
        ("specversion", "1.0"), ("id", "reading-7"), ("source", "/devices/d2"),
        ("type", "com.example.reading"), ("region", "eu")])
    seen = receiver.wait(1)[0]
    verify(created["secret"], seen)
    assert seen.headers["webhook-id"] == "reading-7"
    if mode == "raw":
        assert seen.body == b'{"t": 3}'
        return
    event = event_of(seen)
    assert (event.get_id(), event.get_source(), event.get_type()) == (
        "reading-7", "/devices/d2", "com.example.reading")
    assert event.get_extension("region") == "eu"
    assert event.get_data() == {"t": 3}


@pytest.mark.parametrize("mode", ["binary", "structured", "raw"])
def test_an_amqp_cloudevent_is_pushed(broker, http, receivers, mode):
    receiver = receivers()
    name = topic(http)
    created = subscribe(http, name, receiver.url, format=mode)
    amqp_publish(broker, f"{name}.orders.new", b'{"order": 9}', {
        "ce-specversion": "1.0", "ce-id": "order-9", "ce-source": "/shop",
        "ce-type": "com.example.order"})
    seen = receiver.wait(1)[0]
    verify(created["secret"], seen)
    if mode == "raw":
        assert seen.body == b'{"order": 9}'
        assert seen.headers["Content-Type"] == "application/json"
        return
    event = event_of(seen)
    assert (event.get_id(), event.get_source(), event.get_type()) == (
        "order-9", "/shop", "com.example.order")
    assert event.get_data() == {"order": 9}


def test_a_plain_amqp_publish_gets_its_subject(broker, http, receivers):
    receiver = receivers()
    name = topic(http)
    subscribe(http, name, receiver.url)
    amqp_publish(broker, f"{name}.a.b", b"hello")
    event = event_of(receiver.wait(1)[0])
    assert event.get_type() == "sluice.message"
    assert event.get_subject() == f"{name}/a/b"


def test_a_subject_filter_leaves_other_subjects_out(broker, http, receivers):
    receiver = receivers()
    name = topic(http)
    created = subscribe(http, name, receiver.url, subject_filter=f"{name}/+/alarm")
    mqtt_publish(broker, f"{name}/d1/temp", b"no")
    mqtt_publish(broker, f"{name}/d1/alarm", b"yes")
    assert event_of(receiver.wait(1)[0]).get_subject() == f"{name}/d1/alarm"
    wait_for(lambda: stats(http, created["name"])["filtered"] == 1, "the other one settled", WAIT_S)
    assert len(receiver.seen) == 1


# --- failures and retries ---

def test_a_failing_receiver_gets_the_message_again_until_it_takes_it(broker, http, receivers):
    receiver = receivers(lambda _, n: web.Response(status=500 if n == 0 else 200))
    name = topic(http)
    created = subscribe(http, name, receiver.url, backoff_min_ms=100, backoff_max_ms=200)
    msg_id = native_send(broker, name, b"again")
    first, second = receiver.wait(2)
    assert first.headers["webhook-id"] == second.headers["webhook-id"]
    wait_for(lambda: stats(http, created["name"])["delivered"] == 1, "the delivery counted", WAIT_S)
    counted = stats(http, created["name"])
    assert counted["failed"] == 1 and counted["dead_lettered"] == 0
    assert counted["last_status"] == 200
    assert len(receiver.seen) == 2

    def pushes():
        status, trace, _ = http("GET", f"/messages/{msg_id}/trace?topic={name}")
        assert status == 200, trace
        return [(e["event"], e["attempt"]) for e in trace["events"]
                if e["event"] in ("pushed", "push_failed")]
    assert wait_for(lambda: pushes() == [("push_failed", 1), ("pushed", 2)] and pushes(),
                    "the pushes in the message's trace", WAIT_S, pushes)


def test_a_receiver_that_does_not_answer_in_time_is_retried(broker, http, receivers):
    async def slow_first(_, n):
        if n == 0:
            await asyncio.sleep(5)
        return web.Response(status=204)
    receiver = receivers(slow_first)
    name = topic(http)
    created = subscribe(http, name, receiver.url, timeout_ms=300, backoff_min_ms=100,
                        backoff_max_ms=200)
    native_send(broker, name, b"late")
    receiver.wait(2)
    wait_for(lambda: stats(http, created["name"])["delivered"] == 1, "the retry delivered", WAIT_S)
    counted = stats(http, created["name"])
    assert counted["failed"] >= 1 and "no answer within 300 ms" in counted["last_error"]


def test_retry_after_is_honoured(broker, http, receivers):
    receiver = receivers(lambda _, n: web.Response(status=429, headers={"Retry-After": "2"})
                         if n == 0 else web.Response(status=200))
    name = topic(http)
    created = subscribe(http, name, receiver.url, backoff_min_ms=50, backoff_max_ms=100)
    native_send(broker, name, b"throttled")
    first, second = receiver.wait(2)
    assert second.at - first.at >= 2.0
    wait_for(lambda: stats(http, created["name"])["delivered"] == 1, "the delivery", WAIT_S)


def test_a_client_error_dead_letters_at_once(broker, http, receivers):
    receiver = receivers(lambda _, __: web.Response(status=400, text="bad"))
    name = topic(http)
    created = subscribe(http, name, receiver.url, backoff_min_ms=50, backoff_max_ms=100)
    msg_id = native_send(broker, name, b"refused", keys=("k1",))
    dead = consume(broker, created["dead_letter_topic"])[0]
    assert created["dead_letter_topic"] == created["name"] + ".dlq"
    assert dead.body == b"refused" and dead.keys == ("k1",)
    assert dead.properties["sluice.dlq.origin_msg_id"] == msg_id
    assert dead.properties["sluice.dlq.attempts"] == "1"
    assert len(receiver.seen) == 1
    counted = stats(http, created["name"])
    assert counted["dead_lettered"] == 1 and counted["last_status"] == 400


def test_the_last_attempt_dead_letters(broker, http, receivers):
    receiver = receivers(lambda _, __: web.Response(status=503))
    name = topic(http)
    dlq = fresh("dead")
    created = subscribe(http, name, receiver.url, max_attempts=3, backoff_min_ms=50,
                        backoff_max_ms=100, dead_letter_topic=dlq)
    native_send(broker, name, b"never")
    dead = consume(broker, dlq)[0]
    assert dead.body == b"never" and dead.properties["sluice.dlq.attempts"] == "3"
    assert len(receiver.seen) == 3
    assert stats(http, created["name"])["failed"] == 3


# --- replies ---

def test_a_reply_event_is_stored_in_the_reply_topic(broker, http, receivers):
    receiver = receivers(lambda _, __: web.Response(status=200, body=b'{"ok": true}', headers={
        "ce-specversion": "1.0", "ce-id": "reply-1", "ce-source": "/receiver",
        "ce-type": "com.example.done", "Content-Type": "application/json"}))
    name, replies = topic(http), topic(http, 1)
    created = subscribe(http, name, receiver.url, reply_topic=replies)
    native_send(broker, name, b"do it")
    reply = consume(broker, replies)[0]
    assert reply.body == b'{"ok":true}'
    assert reply.properties["CE_id"] == "reply-1"
    assert reply.properties["CE_type"] == "com.example.done"
    assert reply.properties["CE_contenttype"] == "application/json"
    wait_for(lambda: stats(http, created["name"])["replies"] == 1, "the reply counted", WAIT_S)


def test_a_structured_reply_is_stored_too(broker, http, receivers):
    envelope = {"specversion": "1.0", "id": "r2", "source": "/rx", "type": "t.reply",
                "data": {"n": 2}}
    receiver = receivers(lambda _, __: web.Response(
        status=200, body=json.dumps(envelope).encode(),
        headers={"Content-Type": "application/cloudevents+json"}))
    name, replies = topic(http), topic(http, 1)
    subscribe(http, name, receiver.url, reply_topic=replies)
    native_send(broker, name, b"x")
    reply = consume(broker, replies)[0]
    assert reply.properties["CE_id"] == "r2" and json.loads(reply.body) == {"n": 2}


# --- pause, resume, delete ---

def test_a_paused_subscription_delivers_nothing_until_resumed(broker, http, receivers):
    receiver = receivers()
    name = topic(http)
    created = subscribe(http, name, receiver.url)
    status, body, _ = http("POST", f"/push-subscriptions/{created['name']}/pause")
    assert status == 200 and body["paused"] and body["stats"]["state"] == "paused"
    native_send(broker, name, b"held")
    wait_for(lambda: stats(http, created["name"])["lag"] == 1 or None, "the lag to show it", WAIT_S)
    assert receiver.seen == []
    status, body, _ = http("POST", f"/push-subscriptions/{created['name']}/resume")
    assert status == 200 and not body["paused"]
    assert receiver.wait(1)[0].body == b"held"


def test_a_deleted_subscription_stops_and_forgets_its_position(broker, http, receivers):
    receiver = receivers()
    name = topic(http)
    created = subscribe(http, name, receiver.url)
    native_send(broker, name, b"one")
    receiver.wait(1)
    assert http("DELETE", f"/push-subscriptions/{created['name']}")[0] == 204
    assert http("GET", f"/push-subscriptions/{created['name']}")[0] == 404
    group = "%25PUSH%25" + created["name"]
    wait_for(lambda: http("GET", f"/groups/{group}")[0] == 404, "its group gone", WAIT_S)
    native_send(broker, name, b"two")
    witness = receivers()
    subscribe(http, name, witness.url)  # a new subscription starts from the earliest message
    assert [s.body for s in witness.wait(2)] == [b"one", b"two"] or len(witness.seen) == 2
    assert len(receiver.seen) == 1


# --- ordering ---

def test_ordered_delivery_keeps_each_message_group_in_order(broker, http, receivers):
    in_flight: dict[str, int] = {}
    overlaps: list[str] = []

    async def answer(seen: Seen, n: int):
        key = seen.body.split(b"-")[0].decode()
        in_flight[key] = in_flight.get(key, 0) + 1
        if in_flight[key] > 1:
            overlaps.append(key)
        await asyncio.sleep(0.02)
        in_flight[key] -= 1
        return web.Response(status=500 if seen.body == b"a-1" and n < 3 else 200)
    receiver = receivers(answer)
    name = fresh("fifo")
    assert http("POST", "/topics", {"name": name, "queue_count": 2,
                                    "message_type": "fifo"})[0] == 201
    created = subscribe(http, name, receiver.url, ordered=True, concurrency=8,
                        backoff_min_ms=50, backoff_max_ms=100)
    for n in range(5):
        for key in ("a", "b"):
            native_send(broker, name, f"{key}-{n}".encode(), message_group=key)
    wait_for(lambda: stats(http, created["name"])["delivered"] == 10, "all ten delivered", WAIT_S)
    for key in ("a", "b"):
        bodies = [s.body.decode() for s in receiver.seen if s.body.startswith(key.encode())]
        taken = list(dict.fromkeys(bodies))  # retries repeat a body; its order must hold
        assert taken == [f"{key}-{n}" for n in range(5)], bodies
    assert overlaps == []


# --- who may do what ---

def test_other_users_neither_see_nor_change_a_subscription(broker, http, receivers):
    receiver = receivers()
    name = topic(http)
    for user in ("ann", "bob"):
        assert http("POST", "/users", {"name": user, "password": "pw"})[0] == 201
    grant = {"kind": "topic", "pattern": name, "actions": ["subscribe"]}
    assert http("POST", "/users/ann/permissions", grant)[0] == 201
    ann, bob = Http(http.url, "ann", "pw"), Http(http.url, "bob", "pw")
    created = subscribe(ann, name, receiver.url)
    assert created["owner"] == "ann"
    for method, path in (("GET", ""), ("POST", "/pause"), ("DELETE", "")):
        assert bob(method, f"/push-subscriptions/{created['name']}{path}")[0] == 404
    assert [s["name"] for s in bob("GET", "/push-subscriptions")[1]] == []
    assert [s["name"] for s in ann("GET", "/push-subscriptions")[1]] == [created["name"]]
    status, body, _ = bob("POST", "/push-subscriptions", {"name": fresh("p"), "topic": name,
                                                          "sink": receiver.url})
    assert status == 403 and "subscribe" in body["message"]
    status, body, _ = ann("POST", "/push-subscriptions", {
        "name": fresh("p"), "topic": name, "sink": receiver.url, "reply_topic": "elsewhere"})
    assert status == 403 and "reply topic" in body["message"]


def test_bad_settings_are_refused_with_the_reason(http):
    cases = [({"topic": "t", "sink": "ftp://x/"}, "http"),
             ({"topic": "t", "sink": "http://127.0.0.1/", "format": "xml"}, "format"),
             ({"topic": "t", "sink": "http://127.0.0.1/", "concurrency": 0}, "concurrency"),
             ({"sink": "http://127.0.0.1/"}, "exactly one source"),
             ({"topic": "t", "sink": "http://127.0.0.1/", "secret": "nope"}, "whsec_"),
             ({"topic": "t", "sink": "http://127.0.0.1/", "backoff_min_ms": 10,
               "backoff_max_ms": 5}, "backoff_max_ms")]
    for fields, needle in cases:
        status, body, _ = http("POST", "/push-subscriptions", {"name": fresh("bad"), **fields})
        assert status == 400 and needle in body["message"], (fields, body)


# --- sink safety ---

def test_a_loopback_sink_is_refused_without_the_allow_list(tmp_path, receivers):
    plain = BrokerThread(str(tmp_path / "data"))
    try:
        status, body, _ = Http(plain.running.admin_url)("POST", "/push-subscriptions", {
            "name": "p", "topic": "t", "sink": receivers().url})
        assert status == 400 and "push.allowed_sinks" in body["message"]
        status, body, _ = Http(plain.running.admin_url)("POST", "/push-subscriptions", {
            "name": "p", "topic": "t", "sink": "http://169.254.169.254/latest/meta-data"})
        assert status == 400 and "push.allowed_sinks" in body["message"]
    finally:
        plain.stop()


def test_a_host_name_resolving_to_a_refused_address_is_refused_at_connect(tmp_path, receivers):
    narrow = BrokerThread(str(tmp_path / "data"), **{"push.allowed_sinks": "10.0.0.0/8"})
    try:
        admin = Http(narrow.running.admin_url)
        receiver = receivers()
        assert admin("POST", "/topics", {"name": "t", "queue_count": 1})[0] == 201
        created = subscribe(admin, "t", f"http://localhost:{receiver.port}/hook")
        native_send(narrow, "t", b"secret")
        dead = consume(narrow, created["dead_letter_topic"])[0]
        assert dead.body == b"secret"
        counted = stats(admin, created["name"])
        assert "push.allowed_sinks" in counted["last_error"] and counted["last_status"] is None
        assert receiver.seen == []
    finally:
        narrow.stop()


def test_a_redirect_is_not_followed(tmp_path, receivers):
    narrow = BrokerThread(str(tmp_path / "data"), **{"push.allowed_sinks": "127.0.0.1/32"})
    try:
        admin = Http(narrow.running.admin_url)
        hidden = receivers(host="127.0.0.2")
        redirecting = receivers(lambda _, __: web.Response(
            status=307, headers={"Location": hidden.url}))
        assert admin("POST", "/topics", {"name": "t", "queue_count": 1})[0] == 201
        created = subscribe(admin, "t", redirecting.url)
        native_send(narrow, "t", b"follow me")
        consume(narrow, created["dead_letter_topic"])
        counted = stats(admin, created["name"])
        assert counted["last_status"] == 307 and "not followed" in counted["last_error"]
        assert hidden.seen == [] and len(redirecting.seen) == 1
    finally:
        narrow.stop()


def test_a_revoked_right_stops_delivery_until_granted_again(broker, http, receivers):
    receiver = receivers()
    name = topic(http)
    assert http("POST", "/users", {"name": "cid", "password": "pw"})[0] == 201
    grant = {"kind": "topic", "pattern": name, "actions": ["subscribe"]}
    assert http("POST", "/users/cid/permissions", grant)[0] == 201
    created = subscribe(Http(http.url, "cid", "pw"), name, receiver.url)
    native_send(broker, name, b"before")
    receiver.wait(1)
    assert http("DELETE", f"/users/cid/permissions?kind=topic&pattern={name}")[0] == 204
    wait_for(lambda: stats(http, created["name"])["state"] == "refused", "the refusal", WAIT_S)
    assert "may no longer subscribe" in stats(http, created["name"])["last_error"]
    native_send(broker, name, b"while revoked")
    wait_for(lambda: stats(http, created["name"])["lag"] == 1 or None, "the lag to show it", WAIT_S)
    assert len(receiver.seen) == 1
    assert http("POST", "/users/cid/permissions", grant)[0] == 201
    assert receiver.wait(2)[1].body == b"while revoked"


def test_each_subscription_has_its_prometheus_series(broker, http, receivers):
    receiver = receivers()
    name = topic(http)
    created = subscribe(http, name, receiver.url)
    native_send(broker, name, b"counted")
    receiver.wait(1)
    label = f'subscription="{created["name"]}"'

    def series() -> str:
        return "\n".join(line for line in http("GET", "/metrics")[1].splitlines() if label in line)
    text = wait_for(lambda: f"sluice_push_delivered_total{{{label}}} 1.0" in series() and series(),
                    "the delivery in /metrics", WAIT_S, series)
    assert f"sluice_push_dead_lettered_total{{{label}}} 0.0" in text
    assert f'sluice_push_latency_ms{{quantile="0.99",{label}}}' in text
