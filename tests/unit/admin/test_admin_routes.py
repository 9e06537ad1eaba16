"""The admin API without sockets: route table vs OpenAPI, access rules, error table, JSON shapes."""
from __future__ import annotations

import base64

import pytest
from aiohttp.test_utils import make_mocked_request

from core import errors
from core.model import Action, Delivery, Permission, Principal, ResourceKind
from protocols.admin import AdminDeps, build_app
from protocols.admin.access import Access, check, credentials, may_read
from protocols.admin.errors import STATUS, HttpProblem, error_response, status_for
from protocols.admin.handlers import message_json
from protocols.admin.openapi import MEDIA_TYPES, SCHEMAS, document
from protocols.admin.routes import ROUTES


def test_every_served_route_is_documented_and_every_documented_route_is_served():
    app = build_app(AdminDeps(broker=None))
    served = {(r.method, r.resource.canonical) for r in app.router.routes() if r.method != "HEAD"}
    doc = document(ROUTES)
    documented = {(m.upper(), path) for path, ops in doc["paths"].items() for m in ops}
    assert served == documented
    assert len(served) == len(ROUTES), "no route is registered twice"


def test_every_schema_a_route_names_exists():
    for route in ROUTES:
        for name in (route.body, route.response):
            if name and name not in (*MEDIA_TYPES, "object"):
                assert name.strip("[]") in SCHEMAS, (route.path, name)


def test_routes_returning_message_bodies_need_the_subscribe_right():
    bodies = {r.path for r in ROUTES if r.response in ("[Message]", "Message", "MessageById", "ndjson")}
    assert bodies == {"/topics/{topic}/messages", "/topics/{topic}/tail", "/messages/{msg_id}"}
    for route in ROUTES:
        if route.path in bodies and "{topic}" in route.path:
            assert route.access is Access.SUBSCRIBE, route.path
    # /messages/{msg_id} searches only the topics the caller may subscribe to (core checks)


OWNED = {"/push-subscriptions", "/push-subscriptions/{name}", "/push-subscriptions/{name}/pause",
         "/push-subscriptions/{name}/resume"}
"""Writes on what a user owns: any user, and core lets only the owner or an admin act
(tests/integration/test_admin_authz_matrix.py)."""


def test_writes_need_an_admin_and_only_probes_and_the_dashboard_page_are_public():
    own = {"/session": Access.SESSION, "/events/{topic:.+}": Access.PUBLISH,
           "/users/{user}/tokens": Access.SELF, "/users/{user}/tokens/{token_id}": Access.SELF}
    for route in ROUTES:
        if route.method != "GET":
            expected = own.get(route.path, Access.USER if route.path in OWNED else Access.ADMIN)
            assert route.access is expected, (route.method, route.path)
    assert {r.path for r in ROUTES if r.access is Access.SESSION} == {"/session"}
    public = {r.path for r in ROUTES if r.access is Access.PUBLIC}
    assert public == {"/health", "/cluster", "/metrics", "/openapi.json", "/dashboard", "/dashboard/{asset}",
                      "/console", "/console/{file}", "/console/vendor/{file}"}
    doc = document(ROUTES)
    assert doc["paths"]["/health"]["get"]["security"] == []
    assert "401" in doc["paths"]["/topics"]["get"]["responses"]


def test_error_table_follows_class_hierarchy():
    class ShelfNotFound(errors.NotFound):
        pass

    assert status_for(errors.TopicNotFound("t")) == (404, "topic_not_found")
    assert status_for(ShelfNotFound("x")) == (404, "not_found")
    assert status_for(errors.AccessDenied("no")) == (403, "forbidden")
    assert status_for(errors.MessageTooLarge("big")) == (413, "message_too_large")
    assert status_for(errors.SluiceError("?")) == (500, "internal")
    assert status_for(ValueError("bug")) == (500, "internal")
    assert status_for(HttpProblem(400, "bad_json", "x")) == (400, "bad_json")
    assert all(400 <= status < 600 for status, _ in STATUS.values())


def test_error_responses_are_json_and_a_401_carries_no_basic_challenge():
    response = error_response(errors.Unauthenticated("who are you"))
    assert response.status == 401 and "WWW-Authenticate" not in response.headers
    assert b'"message": "who are you"' in response.body
    assert b"broker's log" in error_response(KeyError("x")).body


def request_with(header: str | None, path: str = "/topics/orders"):
    headers = {"Authorization": header} if header else {}
    return make_mocked_request("GET", path, headers=headers, match_info={"topic": "orders"})


def test_basic_credentials_are_parsed_or_refused():
    token = base64.b64encode(b"bob:s3:cret").decode()
    assert credentials(request_with(f"Basic {token}")) == ("bob", "s3:cret")
    assert credentials(request_with(None)) is None
    for bad in ("Bearer abc", "Basic !!!", "Basic " + base64.b64encode(b"nocolon").decode()):
        with pytest.raises(errors.Unauthenticated):
            credentials(request_with(bad))


def test_reads_need_admin_or_a_matching_permission():
    reader = Principal("r", permissions=(Permission("r", ResourceKind.TOPIC, "ord*",
                                                    frozenset({Action.SUBSCRIBE})),))
    assert may_read(reader, ResourceKind.TOPIC, "orders")
    assert not may_read(reader, ResourceKind.TOPIC, "payments")
    assert not may_read(reader, ResourceKind.GROUP, "orders")
    assert may_read(Principal("root", admin=True), ResourceKind.GROUP, "anything")
    check(reader, Access.TOPIC, request_with(None), broker=None)
    with pytest.raises(errors.AccessDenied, match="sluice user grant"):
        check(Principal("nobody"), Access.TOPIC, request_with(None), broker=None)
    with pytest.raises(errors.AccessDenied, match="admin"):
        check(reader, Access.ADMIN, request_with(None), broker=None)


def delivery(body: bytes) -> Delivery:
    return Delivery("t", 1, 7, "ID", body, "tag", ("k",), {"p": "v"}, 1, 2)


def test_message_bodies_are_base64_plus_text_when_utf8():
    text = message_json(delivery("grüße".encode()))
    assert text["body_text"] == "grüße" and base64.b64decode(text["body_base64"]) == "grüße".encode()
    binary = message_json(delivery(b"\xff\xfe"))
    assert binary["body_text"] is None and binary["size"] == 2
    assert binary["keys"] == ["k"] and binary["properties"] == {"p": "v"}
