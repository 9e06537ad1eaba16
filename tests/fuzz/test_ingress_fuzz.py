"""Hypothesis against the CloudEvents HTTP ingress, which reads headers and bodies from anyone
with a publish right: the parser either returns events that core recognises in their stored form
or refuses with a 4xx that says why, for any headers, body or batch; and a real broker answers
hostile requests with a 4xx (never a 5xx) and goes on taking events."""
from __future__ import annotations

import http.client
import json
from urllib.parse import quote, urlsplit

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.cloudevents import from_native, native_properties
from protocols.admin.event_parsing import BATCH, BINARY, STRUCTURED, BadEvent, mode_of, parse
from tests.integration.test_admin_api import BrokerThread, Http

ATTRIBUTES = ["id", "source", "specversion", "type", "time", "subject", "dataschema",
              "datacontenttype", "data", "x", "Tenant", "a_b", "toolongattributename12345", ""]
VALUES = st.one_of(st.sampled_from(["1.0", "0.3", "", "2024-05-01T12:00:00Z", "%", "%ZZ",
                                    "%C3%A9", "%FF", "yesterday", "a\x00b"]),
                   st.text(max_size=12))
CONTENT_TYPES = st.sampled_from(["application/json", "text/plain", "application/cloudevents+json",
                                 "application/cloudevents-batch+json",
                                 "application/cloudevents+avro", "", "application/json; x=1"])
header_pairs = st.lists(st.tuples(
    st.one_of(st.sampled_from(ATTRIBUTES).map(lambda a: "ce-" + a), st.sampled_from(
        ["Content-Type", "CE-ID", "ce-", "x-other"])),
    st.one_of(VALUES, CONTENT_TYPES)), max_size=8)
json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False),
              st.text(max_size=8)),
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(st.sampled_from(ATTRIBUTES + ["data_base64"]), inner,
                                            max_size=6)),
    max_leaves=20)
envelopes = st.fixed_dictionaries(
    {"id": st.one_of(st.text(max_size=4), st.integers()), "source": st.text(max_size=4),
     "specversion": st.sampled_from(["1.0", "0.3", 1]), "type": st.text(max_size=4)},
    optional={"time": VALUES, "data": json_values, "data_base64": VALUES,
              "datacontenttype": CONTENT_TYPES, "ext1": st.one_of(VALUES, json_values)})
bodies = st.one_of(st.binary(max_size=64), json_values.map(lambda v: json.dumps(v).encode()),
                   envelopes.map(lambda e: json.dumps(e).encode()),
                   st.lists(st.one_of(envelopes, json_values), max_size=4).map(
                       lambda b: json.dumps(b).encode()))


def check(headers: list[tuple[str, str]], body: bytes) -> None:
    """``parse`` returns recognisable events or refuses with a 4xx BadEvent; nothing else."""
    try:
        mode = mode_of(dict(headers))
        events = parse(mode, headers, body)
    except BadEvent as refused:
        assert 400 <= refused.status < 500 and str(refused)
        return
    assert mode in (BINARY, STRUCTURED, BATCH) and events
    for event in events:
        found = from_native(native_properties(event), event.data)
        assert found is not None and dict(found.attributes) == dict(event.attributes)


@settings(max_examples=600, deadline=None)
@given(headers=header_pairs, body=bodies)
def test_any_headers_and_body_parse_to_events_or_a_clear_4xx(headers, body):
    check(headers, body)


@settings(max_examples=400, deadline=None)
@given(batch=st.lists(st.one_of(envelopes, json_values), max_size=6),
       mode=st.sampled_from(["application/cloudevents+json", "application/cloudevents-batch+json"]))
def test_any_structured_or_batched_json_parses_or_is_refused(batch, mode):
    body = json.dumps(batch if mode.endswith("batch+json") else (batch[0] if batch else {}))
    check([("Content-Type", mode)], body.encode())


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    thread = BrokerThread(str(tmp_path_factory.mktemp("ingress-fuzz") / "data"),
                          **{"admin.events_max_body_bytes": 4096})
    yield thread
    thread.stop()


def live_post(broker, path: str, headers: list[tuple[str, str]], body: bytes) -> int:
    parts = urlsplit(broker.running.admin_url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        connection.putrequest("POST", path, skip_accept_encoding=True)
        connection.putheader("Authorization", "Basic c2x1aWNlOnNsdWljZQ==")  # sluice:sluice
        for name, value in headers:  # sent as UTF-8, as curl sends what it is given
            connection.putheader(name, value.encode("utf-8", "surrogatepass"))
        connection.putheader("Content-Length", str(len(body)))
        connection.endheaders(body)
        response = connection.getresponse()
        response.read()
        return response.status
    finally:
        connection.close()


wire_text = st.text(st.characters(min_codepoint=0x20, max_codepoint=0xFF, exclude_characters="\x7f"),
                    max_size=16)
paths = st.one_of(st.just("/events/fuzz/a"), st.lists(
    st.one_of(wire_text.map(lambda t: quote(t, safe="+$") or "x"),
              st.sampled_from(["%2F", "%2B", "%23", "%00", "$SYS", "..", "%FF", "+"])),
    min_size=1, max_size=4).map(lambda levels: "/events/fuzz/" + "/".join(levels)))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=paths, headers=st.lists(st.tuples(
    st.sampled_from(["ce-id", "ce-source", "ce-specversion", "ce-type", "ce-time", "ce-x",
                     "Content-Type", "ce-BAD"]),
    st.one_of(VALUES.filter(lambda v: v.isprintable()), wire_text, CONTENT_TYPES)), max_size=7),
       body=st.one_of(bodies, st.binary(min_size=4000, max_size=5000)))
def test_a_live_broker_answers_hostile_requests_with_a_4xx_or_takes_them(broker, path, headers,
                                                                         body):
    status = live_post(broker, path, headers, body)
    assert status == 202 or 400 <= status < 500, (path, headers, body[:100], status)


def test_the_broker_goes_on_after_the_fuzzing(broker):
    assert Http(broker.running.admin_url)("GET", "/health")[0] == 200
    valid = [("ce-id", "1"), ("ce-source", "/s"), ("ce-specversion", "1.0"), ("ce-type", "t")]
    assert live_post(broker, "/events/fuzz/after", valid, b"ok") == 202
