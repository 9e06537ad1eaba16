"""Hypothesis against the push-subscription routes of a live broker: any JSON body a user sends
to ``POST /push-subscriptions`` (hostile names, sinks, filters, SQL, JMESPath, numbers, types)
is created (201) or refused with a 4xx that says why, never a 5xx; any name in the other routes'
paths gets a 4xx or the subscription; and the broker goes on pushing afterwards."""
from __future__ import annotations

import http.client
import json
from typing import Any
from urllib.parse import quote, urlsplit

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.integration.push_receiver import Receiver
from tests.integration.test_admin_api import BrokerThread, Http

FIELDS = ["name", "topic", "subject_filter", "vhost", "queue", "sink", "filters", "format",
          "transform", "concurrency", "rate_limit", "timeout_ms", "max_attempts",
          "backoff_min_ms", "backoff_max_ms", "dead_letter_topic", "ordered", "reply_topic",
          "secret", "owner", "paused", "created_ms", "nope"]
texts = st.one_of(st.text(max_size=24), st.sampled_from([
    "", "fuzz", "%SYS%offsets", "a/b", "+", "#", "..", "x" * 300, "\x00", "whsec_", "whsec_AAAA",
    "http://127.0.0.1:1/", "http://169.254.169.254/latest", "https://[::1]/", "ftp://x/",
    "http://user:pw@127.0.0.1/", "http://localhost:0/", "binary", "structured", "raw", "//q"]))
scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**63),
                    st.floats(allow_nan=True, allow_infinity=True), texts)
json_values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.one_of(texts, st.sampled_from(
        ["exact", "prefix", "suffix", "all", "any", "not", "sql", "type", "source"])), inner,
        max_size=4)), max_leaves=16)
sql = st.one_of(st.text(max_size=40), st.sampled_from([
    "type = 'x'", "type LIKE '%a%b%'", "LOWER(type) = 'x'", "((((((((((a = 1))))))))))",
    "a IN ('1', '2')", "EXISTS subject", "1 = 1 OR", "'unterminated", "x" * 3000]))
filters = st.lists(st.one_of(json_values, sql.map(lambda q: {"sql": q}), st.fixed_dictionaries(
    {"exact": st.dictionaries(texts, scalars, max_size=2)})), max_size=3)
transforms = st.one_of(st.text(max_size=30), st.sampled_from(
    ["{a: b}", "[*].x", "a.b.c", "foo[?bar > `1`]", "`{}`", "@" * 600, "length(@)"]))
bodies = st.one_of(json_values, st.fixed_dictionaries(
    {"name": texts, "topic": st.one_of(st.just("fuzz"), texts), "sink": texts},
    optional={"filters": filters, "transform": transforms, "format": texts,
              "concurrency": scalars, "rate_limit": scalars, "timeout_ms": scalars,
              "max_attempts": scalars, "backoff_min_ms": scalars, "backoff_max_ms": scalars,
              "secret": texts, "ordered": scalars, "reply_topic": texts, "vhost": texts,
              "queue": texts, **{name: json_values for name in ("owner", "paused", "nope")}}))


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    thread = BrokerThread(str(tmp_path_factory.mktemp("push-fuzz") / "data"),
                          **{"push.allowed_sinks": "127.0.0.0/8"})
    yield thread
    thread.stop()


def request(broker: BrokerThread, method: str, path: str, body: Any = None) -> int:
    parts = urlsplit(broker.running.admin_url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        data = b"" if body is None else json.dumps(body, allow_nan=True).encode()
        connection.request(method, path, data, {
            "Authorization": "Basic c2x1aWNlOnNsdWljZQ==",  # sluice:sluice
            "Content-Type": "application/json", "Content-Length": str(len(data))})
        response = connection.getresponse()
        response.read()
        return response.status
    finally:
        connection.close()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=bodies)
def test_any_create_body_is_created_or_refused_with_a_4xx(broker, body):
    status = request(broker, "POST", "/push-subscriptions", body)
    assert status == 201 or 400 <= status < 500, (body, status)
    if status == 201:
        assert request(broker, "DELETE", f"/push-subscriptions/{quote(body['name'], safe='')}") == 204


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.text(max_size=40), method_action=st.sampled_from(
    [("GET", ""), ("DELETE", ""), ("POST", "/pause"), ("POST", "/resume")]))
def test_any_name_in_a_path_is_a_4xx_for_a_missing_subscription(broker, name, method_action):
    method, action = method_action
    status = request(broker, method, f"/push-subscriptions/{quote(name, safe='')}{action}")
    assert 400 <= status < 500, (name, method, action, status)


def test_the_broker_goes_on_pushing_after_the_fuzzing(broker):
    admin = Http(broker.running.admin_url)
    receiver = Receiver()
    try:
        status, created, _ = admin("POST", "/push-subscriptions",
                                   {"name": "after-fuzz", "topic": "fuzzed", "sink": receiver.url})
        assert status == 201, created
        status, answer, _ = admin("POST", "/topics", {"name": "fuzzed"})
        assert status in (201, 409), answer
        broker.call(_send(broker, "fuzzed", b"still pushing"))
        assert receiver.wait(1)[0].body == b"still pushing"
    finally:
        receiver.stop()


async def _send(broker: BrokerThread, topic: str, body: bytes) -> None:
    from core.model import SYSTEM, OutgoingMessage
    await broker.running.broker.send(SYSTEM, [OutgoingMessage(topic, body)])
