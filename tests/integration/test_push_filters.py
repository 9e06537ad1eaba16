"""Push subscriptions' filters and transform through the real delivery engine: a mixed stream of
CloudEvents, published by a paho MQTT 5 client (binary mode, user properties) and over HTTP
ingress (``POST /events/{subject}``, ``ce-`` headers), reaches real aiohttp receivers, one per
filter dialect, each getting exactly the events its filter matches while its stats count the
rest as filtered; a JMESPath transform reshapes the JSON data, and an event whose data is not
JSON goes to the dead-letter topic with the reason."""
from __future__ import annotations

import base64
import json
import urllib.request

import pytest

from tests.integration.push_receiver import Receiver
from tests.integration.test_admin_api import BrokerThread, Http
from tests.integration.test_push_delivery import (WAIT_S, consume, event_of, fresh, mqtt_publish,
                                                  stats, subscribe, verify)
from tests.waiting import wait_for

# (id, type, source, extensions, published over)
STREAM = [
    ("e1", "com.example.order.created", "/shop/eu", {"region": "eu", "priority": "3"}, "mqtt"),
    ("e2", "com.example.order.created", "/shop/us", {"region": "us"}, "http"),
    ("e3", "com.example.order.cancelled", "/shop/eu", {}, "mqtt"),
    ("e4", "com.example.payment.done", "/pay/eu", {"region": "eu"}, "http"),
    ("e5", "com.other.ping", "/monitor", {}, "mqtt"),
    ("e6", "com.example.order.created", "/shop/asia", {"region": "asia", "priority": "7"}, "http"),
]
FILTERS = {
    "exact": ([{"exact": {"type": "com.example.order.created"}}], {"e1", "e2", "e6"}),
    "prefix": ([{"prefix": {"source": "/shop/"}}], {"e1", "e2", "e3", "e6"}),
    "suffix": ([{"suffix": {"type": ".done"}}], {"e4"}),
    "all": ([{"all": [{"prefix": {"type": "com.example.order."}}, {"exact": {"region": "eu"}}]}],
            {"e1"}),
    "any": ([{"any": [{"exact": {"source": "/monitor"}}, {"suffix": {"type": "cancelled"}}]}],
            {"e3", "e5"}),
    "not": ([{"not": {"prefix": {"type": "com.example."}}}], {"e5"}),
    "sql": ([{"sql": "type LIKE 'com.example.order.%' AND (region = 'us' OR priority > 5)"}],
            {"e2", "e6"}),
}


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    thread = BrokerThread(str(tmp_path_factory.mktemp("push-filters") / "data"),
                          **{"push.allowed_sinks": "127.0.0.0/8"})
    yield thread
    thread.stop()


@pytest.fixture(scope="module")
def http(broker):
    return Http(broker.running.admin_url)


def ingress(http: Http, subject: str, headers: dict[str, str], body: bytes) -> None:
    """POST one binary-mode CloudEvent to ``/events/{subject}``."""
    token = base64.b64encode(b"sluice:sluice").decode()
    request = urllib.request.Request(f"{http.url}/events/{subject}", data=body, method="POST",
                                     headers={**headers, "Authorization": f"Basic {token}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 202


def publish(broker: BrokerThread, http: Http, topic: str, event_id: str, type_: str, source: str,
            extensions: dict[str, str], via: str, data: bytes,
            content_type: str = "application/json") -> None:
    attributes = {"specversion": "1.0", "id": event_id, "type": type_, "source": source,
                  **extensions}
    if via == "mqtt":
        mqtt_publish(broker, f"{topic}/{event_id}", data, list(attributes.items()),
                     content_type=content_type)
    else:
        ingress(http, f"{topic}/{event_id}",
                {"Content-Type": content_type, **{f"ce-{k}": v for k, v in attributes.items()}},
                data)


@pytest.fixture(scope="module")
def pushed(broker, http):
    """One subscription (and receiver) per filter dialect over one topic, after the stream."""
    topic = fresh("mixed")
    assert http("POST", "/topics", {"name": topic, "queue_count": 2})[0] == 201
    receivers, created = {}, {}
    for dialect, (filters, _) in FILTERS.items():
        receivers[dialect] = Receiver()
        created[dialect] = subscribe(http, topic, receivers[dialect].url, filters=filters)
    for event_id, type_, source, extensions, via in STREAM:
        publish(broker, http, topic, event_id, type_, source, extensions, via,
                json.dumps({"n": event_id}).encode())
    yield receivers, created
    for receiver in receivers.values():
        receiver.stop()


@pytest.mark.parametrize("dialect", sorted(FILTERS))
def test_each_filter_dialect_delivers_exactly_the_matching_events(pushed, http, dialect):
    receivers, created = pushed
    receiver, subscription = receivers[dialect], created[dialect]
    _, wanted = FILTERS[dialect]
    name = subscription["name"]
    done = wait_for(lambda: (lambda s: s["delivered"] + s["filtered"] == len(STREAM) and s)(
        stats(http, name)), "every event of the stream delivered or filtered", WAIT_S,
        lambda: stats(http, name))
    assert done["delivered"] == len(wanted) and done["filtered"] == len(STREAM) - len(wanted)
    assert done["dead_lettered"] == 0 and done["failed"] == 0
    events = [event_of(seen) for seen in receiver.seen]
    assert sorted(e.get_id() for e in events) == sorted(wanted)
    for seen, event in zip(receiver.seen, events):
        verify(subscription["secret"], seen)
        assert event.get_data() == {"n": event.get_id()}


def test_a_transform_reshapes_the_json_data_and_dead_letters_data_that_is_not_json(
        broker, http):
    receiver = Receiver()
    try:
        topic = fresh("shaped")
        assert http("POST", "/topics", {"name": topic, "queue_count": 1})[0] == 201
        created = subscribe(http, topic, receiver.url,
                            transform="{who: customer.name, items: length(items), id: ref}")
        order = {"customer": {"name": "Ada", "tier": "gold"}, "items": [{"p": 1}, {"p": 2}],
                 "ref": "o-1"}
        publish(broker, http, topic, "t1", "com.example.order", "/shop", {}, "http",
                json.dumps(order).encode())
        publish(broker, http, topic, "t2", "com.example.order", "/shop", {}, "mqtt",
                json.dumps(order | {"ref": "o-2"}).encode())
        publish(broker, http, topic, "t3", "com.example.note", "/shop", {}, "http",
                b"plain words", content_type="text/plain")
        seen = receiver.wait(2)
        bodies = sorted((json.loads(s.body) for s in seen), key=lambda b: b["id"])
        assert bodies == [{"who": "Ada", "items": 2, "id": "o-1"},
                          {"who": "Ada", "items": 2, "id": "o-2"}]
        for one in seen:
            verify(created["secret"], one)
            assert one.headers["Content-Type"] == "application/json"
            assert one.headers["ce-type"] == "com.example.order"
        dead = consume(broker, created["dead_letter_topic"])[0]
        assert dead.body == b"plain words"
        assert "not JSON" in dead.properties["sluice.push.last_error"]
        wait_for(lambda: stats(http, created["name"])["dead_lettered"] == 1, "the dead letter "
                 "counted", WAIT_S)
        assert len(receiver.seen) == 2  # the plain one never reached the receiver
    finally:
        receiver.stop()
