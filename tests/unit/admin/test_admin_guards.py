"""The admin API's browser-facing guards without sockets: same-origin writes, JSON-only bodies,
the documented refusals, and a dashboard page that works under its own CSP."""
from __future__ import annotations

import dataclasses
import re

import pytest
from aiohttp.test_utils import make_mocked_request

from analytics import DASHBOARD_DIR
from core.model import RetryPolicy
from protocols.admin.dashboard_files import PAGE_CSP
from protocols.admin.errors import HttpProblem
from protocols.admin.guards import check_same_origin, require_json
from protocols.admin.handlers import RETRY_FIELDS
from protocols.admin.openapi import document
from protocols.admin.routes import ROUTES

HOST = "127.0.0.1:8080"


def request(method: str, **headers: str):
    return make_mocked_request(method, "/users", headers={"Host": HOST, **headers})


@pytest.mark.parametrize("headers", [
    {"Origin": "http://evil.example"},
    {"Origin": "http://127.0.0.1:9999"},          # same host, another port: another origin
    {"Origin": "null"},                           # sandboxed frames and file:// pages
    {"Origin": "http://[::1"},                    # garbage
    {"Sec-Fetch-Site": "cross-site"},
    {"Sec-Fetch-Site": "same-site"},
    {"Sec-Fetch-Site": "cross-site", "Origin": f"http://{HOST}"},
])
@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH"])
def test_writes_from_another_origin_are_refused(method, headers):
    with pytest.raises(HttpProblem) as refused:
        check_same_origin(request(method, **headers))
    assert refused.value.status == 403 and "own origin" in str(refused.value)


@pytest.mark.parametrize("headers", [
    {},                                           # the CLI, curl, scripts
    {"Origin": f"http://{HOST}"},
    {"Origin": f"HTTPS://{HOST.upper()}"},        # behind a TLS proxy that keeps the Host
    {"Origin": f"http://{HOST}", "Sec-Fetch-Site": "same-origin"},
])
def test_writes_from_the_api_itself_or_without_a_browser_pass(headers):
    check_same_origin(request("POST", **headers))


def test_reads_are_not_refused_for_their_origin():
    check_same_origin(request("GET", Origin="http://evil.example", **{"Sec-Fetch-Site": "cross-site"}))


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded",
                                          "multipart/form-data; boundary=x", "application/json-seq"])
def test_bodies_must_be_sent_as_application_json(content_type):
    headers = {"Content-Type": content_type} if content_type else {}
    with pytest.raises(HttpProblem) as refused:
        require_json(request("POST", **headers))
    assert refused.value.status == 415 and "application/json" in str(refused.value)


def test_json_with_a_charset_is_json():
    require_json(request("POST", **{"Content-Type": "application/json; charset=utf-8"}))


def test_the_document_lists_the_guards_refusals():
    paths = document(ROUTES)["paths"]
    for route in ROUTES:
        responses = paths[route.template][route.method.lower()]["responses"]
        if route.method != "GET":
            assert "403" in responses, (route.method, route.path)
        if route.body:
            assert {"413", "415"} <= set(responses), (route.method, route.path)


def test_the_admin_api_reads_every_retry_policy_field():
    assert set(RETRY_FIELDS) == {f.name for f in dataclasses.fields(RetryPolicy)}


def test_the_dashboard_page_needs_nothing_its_policy_forbids():
    assert "'unsafe-inline'" not in PAGE_CSP and "'unsafe-eval'" not in PAGE_CSP
    assert "connect-src 'self'" in PAGE_CSP and "frame-ancestors 'none'" in PAGE_CSP
    page = (DASHBOARD_DIR / "index.html").read_text()
    assert all("src=" in tag for tag in re.findall(r"<script[^>]*>", page)), "inline script"
    assert "<style" not in page and not re.search(r"\sstyle=", page), "inline style"
    assert not re.search(r"\son[a-z]+=", page), "inline event handler"
    script = (DASHBOARD_DIR / "dashboard.js").read_text()
    assert not re.search(r"\beval\(|new Function\(|style=", script)
