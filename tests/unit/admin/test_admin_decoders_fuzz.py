"""Hypothesis over what the admin API and the native edge decode from a peer before knowing who
it is: Basic credentials, JSON bodies, RocketMQ authorization headers and signed times. Whatever
arrives, the answer is the documented refusal, never another exception."""
from __future__ import annotations

import json

from aiohttp.test_utils import make_mocked_request
from hypothesis import given, settings
from hypothesis import strategies as st

from core.errors import Unauthenticated
from protocols.admin.access import credentials
from protocols.admin.errors import HttpProblem
from protocols.admin.handlers import json_object
from protocols.native.auth import clock_skew_s, parse_authorization

header_text = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=200)


@given(header_text)
def test_any_authorization_header_is_credentials_none_or_unauthenticated(value):
    request = make_mocked_request("GET", "/topics", headers={"Authorization": value})
    try:
        given_credentials = credentials(request)
    except Unauthenticated:
        return
    assert given_credentials is None or len(given_credentials) == 2


@given(header_text.map(lambda v: "Basic " + v))
def test_any_basic_payload_is_credentials_or_unauthenticated(value):
    try:
        user, password = credentials(make_mocked_request("GET", "/", headers={"Authorization": value}))
    except Unauthenticated:
        return
    assert isinstance(user, str) and isinstance(password, str)


def json_bodies():
    leaves = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
    documents = st.recursive(leaves, lambda inner: st.lists(inner, max_size=4)
                             | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=20)
    return (documents.map(lambda d: json.dumps(d).encode())
            | st.binary(max_size=200)
            | st.integers(1, 5_000).map(lambda depth: b"[" * depth)
            | st.integers(1, 5_000).map(lambda depth: b'{"a":' * depth + b"1" + b"}" * depth))


@settings(max_examples=300, deadline=None)
@given(json_bodies())
def test_any_body_is_a_json_object_or_a_400(data):
    try:
        body = json_object(data)
    except HttpProblem as problem:
        assert problem.status == 400 and problem.code == "bad_json"
        return
    assert isinstance(body, dict)


@given(header_text)
def test_any_rocketmq_authorization_header_parses_or_is_unauthenticated(value):
    try:
        credential = parse_authorization(value)
    except Unauthenticated:
        return
    assert isinstance(credential.access_key, str) and isinstance(credential.signature_hex, str)


@given(st.text(max_size=40) | st.from_regex(r"[0-9]{8}T[0-9]{6}Z", fullmatch=True),
       st.floats(0, 4_102_444_800))
def test_any_signed_time_is_a_skew_or_unauthenticated(value, now):
    try:
        skew = clock_skew_s(value, now)
    except Unauthenticated:
        return
    assert skew >= 0
