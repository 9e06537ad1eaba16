"""The session table behind ``/session``: tokens, idle expiry on the table's clock, the bound on
live sessions, ending a user's sessions; and hypothesis over cookie values, which are untrusted."""
from __future__ import annotations

from aiohttp.test_utils import make_mocked_request
from hypothesis import given
from hypothesis import strategies as st

from protocols.admin.errors import HttpProblem
from protocols.admin.sessions import MAX_TOKEN_CHARS, SessionTable, check_csrf, is_token


class Clock:
    """The table's clock, moved by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_token_finds_its_session_and_nothing_else_does():
    table = SessionTable(60)
    token, session = table.open("alice")
    other, _ = table.open("bob")
    assert token != other and session.csrf_token not in (token, other)
    assert table.find(token) is session
    assert table.find(session.csrf_token) is None  # the CSRF token is no cookie
    assert table.find(token[:-1]) is None


def test_a_session_ends_after_the_idle_timeout_and_each_use_restarts_it():
    clock = Clock()
    table = SessionTable(30, clock=clock)
    token, _ = table.open("alice")
    clock.now += 29
    assert table.find(token) is not None
    clock.now += 29  # 58 s after sign-in, 29 after the last use
    assert table.find(token) is not None
    clock.now += 30
    assert table.find(token) is None
    assert len(table) == 0


def test_the_table_holds_at_most_its_bound_and_ends_the_least_recently_used():
    clock = Clock()
    table = SessionTable(60, max_sessions=3, clock=clock)
    first, _ = table.open("a")
    second, _ = table.open("b")
    third, _ = table.open("c")
    assert table.find(first) is not None  # used: now the second is the least recently used
    for n in range(50):
        table.open(f"spam-{n}")
        assert len(table) == 3
    assert table.find(first) is None and table.find(second) is None and table.find(third) is None


def test_closing_and_ending_a_user_end_its_sessions_only():
    table = SessionTable(60)
    a1, _ = table.open("alice")
    a2, _ = table.open("alice")
    b, _ = table.open("bob")
    table.end_user("alice")
    assert table.find(a1) is None and table.find(a2) is None and table.find(b) is not None
    table.close(b)
    assert table.find(b) is None


def test_the_csrf_header_must_be_the_sessions_token():
    _, session = SessionTable(60).open("alice")
    for headers in ({}, {"X-CSRF-Token": "wrong"}, {"X-CSRF-Token": session.csrf_token + "x"}):
        try:
            check_csrf(make_mocked_request("POST", "/topics", headers=headers), session)
        except HttpProblem as problem:
            assert (problem.status, problem.code) == (403, "csrf")
        else:
            raise AssertionError(f"{headers} was accepted")
    check_csrf(make_mocked_request("POST", "/topics",
                                   headers={"X-CSRF-Token": session.csrf_token}), session)


@given(st.text(max_size=300))
def test_any_cookie_value_finds_no_session_and_never_raises(value):
    table = SessionTable(60)
    token, _ = table.open("alice")
    if value != token:
        assert table.find(value) is None
    table.close(value)
    assert table.find(token) is not None or value == token
    assert is_token(value) is (0 < len(value) <= MAX_TOKEN_CHARS and all(
        c.isascii() and (c.isalnum() or c in "-_") for c in value))
