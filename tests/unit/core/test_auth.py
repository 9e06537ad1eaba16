"""Users: password and signature authentication, pattern matching, authorization, the principal cache."""
from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Iterator

import pytest
from cryptography.fernet import Fernet
from hypothesis import given
from hypothesis import strategies as st

from core.auth import Users, pattern_matches
from core.errors import AccessDenied, Unauthenticated
from core.metadata import MetadataRepository
from core.model import SYSTEM, Action, Permission, Principal, ResourceKind, User
from tests.unit.core.test_broker import SUBJECTS

TOPIC, GROUP = ResourceKind.TOPIC, ResourceKind.GROUP
PUB, SUB, ADMIN = Action.PUBLISH, Action.SUBSCRIBE, Action.ADMIN


@pytest.fixture
def repository(tmp_path) -> Iterator[MetadataRepository]:
    repo = MetadataRepository(f"sqlite:///{tmp_path}/metadata.db", Fernet.generate_key())
    yield repo
    repo.close()


@pytest.fixture
def users(repository) -> Users:
    return Users(repository, SUBJECTS)


def _grant(users: Users, user: str, pattern: str, *actions: Action, kind: ResourceKind = TOPIC) -> None:
    users.grant(Permission(user, kind, pattern, frozenset(actions)))


def _sign(secret: bytes, data: bytes) -> str:
    return hmac.new(secret, data, hashlib.sha1).hexdigest()


# --- authentication ---
def test_authenticate_returns_the_principal_with_its_permissions(users):
    users.create_user("alice", "s3cret")
    _grant(users, "alice", "orders-*", PUB)
    principal = users.authenticate("alice", "s3cret")
    assert principal == Principal("alice", False, (
        Permission("alice", TOPIC, "orders-*", frozenset({PUB})),))


@pytest.mark.parametrize("name, password", [("alice", "wrong"), ("nobody", "s3cret"), ("alice", "")])
def test_wrong_credentials_say_what_to_do(users, name, password):
    users.create_user("alice", "s3cret")
    with pytest.raises(Unauthenticated, match=rf"check both.*`sluice user passwd {name}`") as refused:
        users.authenticate(name, password)
    # The same answer whether or not the user exists: it suggests creating nobody.
    assert "user create" not in str(refused.value)


def test_a_good_signature_authenticates_in_either_case(users):
    users.create_user("ak", "sk-secret", admin=True)
    signed = b"20240517T101500Z"
    assert users.authenticate_signature("ak", signed, _sign(b"sk-secret", signed)) == Principal("ak", True)
    assert users.authenticate_signature("ak", signed, _sign(b"sk-secret", signed).upper()).user == "ak"


@pytest.mark.parametrize("access_key, secret, signature", [
    ("ak", b"other-secret", None),       # signed with the wrong key
    ("ghost", b"sk-secret", None),       # unknown access key
    ("ak", b"sk-secret", "zz"),          # not even hex
    ("ak", b"sk-secret", "é" * 40),      # not even ASCII
])
def test_a_bad_signature_is_refused(users, access_key, secret, signature):
    users.create_user("ak", "sk-secret")
    signed = b"20240517T101500Z"
    with pytest.raises(Unauthenticated, match="signature check failed"):
        users.authenticate_signature(access_key, signed, signature or _sign(secret, signed))


def test_a_signature_over_other_data_is_refused(users):
    users.create_user("ak", "sk-secret")
    with pytest.raises(Unauthenticated):
        users.authenticate_signature("ak", b"20240517T101501Z", _sign(b"sk-secret", b"20240517T101500Z"))


# --- patterns ---
@pytest.mark.parametrize("pattern, name, expected", [
    ("orders-*", "orders-eu", True),
    ("orders-*", "orders-", True),
    ("orders-*", "xorders-eu", False),
    ("orders-*", "orders", False),
    ("*", "anything", True),
    ("*", "", True),
    ("orders", "orders", True),
    ("orders", "orders-eu", False),
    ("*-eu", "orders-eu", True),
    ("*-eu", "orders-us", False),
    ("a*b*c", "abc", True),
    ("a*b*c", "aXbYc", True),
    ("a*b*c", "acb", False),
    ("ab*ba", "aba", False),
    ("**", "x", True),
    ("o.d", "oxd", False),                # regex characters are literal
    ("o.d", "o.d", True),
    ("t[0-9]", "t1", False),              # no fnmatch classes
    ("t[0-9]", "t[0-9]", True),
    ("a?", "ab", False),
    ("a+|b", "a+|b", True),
])
def test_pattern_matching(pattern, name, expected):
    assert pattern_matches(pattern, name) is expected


@given(st.text("ab*.[", max_size=8), st.text("ab.[", max_size=8))
def test_pattern_matching_agrees_with_a_literal_regex(pattern, name):
    regex = ".*".join(re.escape(part) for part in pattern.split("*"))
    assert pattern_matches(pattern, name) is bool(re.fullmatch(regex, name, re.DOTALL))


# --- authorization ---
def test_authorize_follows_kind_action_and_pattern(users):
    users.create_user("alice", "pw")
    _grant(users, "alice", "orders-*", PUB)
    _grant(users, "alice", "billing", SUB, kind=GROUP)
    alice = users.authenticate("alice", "pw")
    users.authorize(alice, PUB, TOPIC, "orders-eu")
    users.authorize(alice, SUB, GROUP, "billing")
    for action, kind, name in [(PUB, TOPIC, "xorders-eu"), (SUB, TOPIC, "orders-eu"),
                               (PUB, GROUP, "orders-eu"), (SUB, GROUP, "billing-2")]:
        with pytest.raises(AccessDenied):
            users.authorize(alice, action, kind, name)


def test_access_denied_names_user_action_and_resource(users):
    users.create_user("alice", "pw")
    with pytest.raises(AccessDenied, match=r"user 'alice' may not publish on topic 'orders-eu'"):
        users.authorize(users.authenticate("alice", "pw"), PUB, TOPIC, "orders-eu")


def test_admin_action_implies_publish_and_subscribe_only_on_its_resources(users):
    users.create_user("alice", "pw")
    _grant(users, "alice", "orders-*", ADMIN)
    alice = users.authenticate("alice", "pw")
    for action in (PUB, SUB, ADMIN):
        users.authorize(alice, action, TOPIC, "orders-eu")
    with pytest.raises(AccessDenied):
        users.authorize(alice, PUB, TOPIC, "payments")


def test_a_star_pattern_allows_every_name(users):
    users.create_user("alice", "pw")
    _grant(users, "alice", "*", PUB, SUB)
    alice = users.authenticate("alice", "pw")
    users.authorize(alice, SUB, TOPIC, "anything.at|all")
    with pytest.raises(AccessDenied):
        users.authorize(alice, ADMIN, TOPIC, "anything")


def test_admins_and_system_may_do_anything(users):
    users.create_user("root", "pw", admin=True)
    root = users.authenticate("root", "pw")
    for principal in (root, SYSTEM):
        users.authorize(principal, ADMIN, GROUP, "any-group")
        users.authorize(principal, PUB, TOPIC, "any-topic")


def test_authorize_does_no_sql(users, repository, monkeypatch):
    users.create_user("alice", "pw")
    _grant(users, "alice", "orders-*", PUB)
    alice = users.authenticate("alice", "pw")

    def no_sql(*_args):
        raise AssertionError("authorize touched the database")

    for name in ("get_user", "permissions", "list_users", "verify_password"):
        monkeypatch.setattr(repository, name, no_sql)
    users.authorize(alice, PUB, TOPIC, "orders-eu")
    with pytest.raises(AccessDenied):
        users.authorize(alice, PUB, TOPIC, "payments")


# --- the principal cache ---
def test_revoke_applies_at_once_even_to_a_principal_already_handed_out(users):
    users.create_user("alice", "pw")
    _grant(users, "alice", "orders-*", PUB)
    alice = users.authenticate("alice", "pw")
    users.authorize(alice, PUB, TOPIC, "orders-eu")
    assert users.revoke("alice", TOPIC, "orders-*") is True
    with pytest.raises(AccessDenied):
        users.authorize(alice, PUB, TOPIC, "orders-eu")
    assert users.authenticate("alice", "pw").permissions == ()


def test_grant_applies_at_once_to_a_principal_already_handed_out(users):
    users.create_user("alice", "pw")
    alice = users.authenticate("alice", "pw")
    _grant(users, "alice", "orders-*", SUB)
    users.authorize(alice, SUB, TOPIC, "orders-eu")


def test_a_deleted_user_loses_every_right_and_a_recreated_one_starts_fresh(users):
    users.create_user("root", "pw", admin=True)
    root = users.authenticate("root", "pw")
    assert users.delete_user("root") is True
    with pytest.raises(AccessDenied):
        users.authorize(root, PUB, TOPIC, "orders")
    with pytest.raises(Unauthenticated):
        users.authenticate("root", "pw")
    users.create_user("root", "new", admin=False)
    assert users.authenticate("root", "new") == Principal("root")


def test_a_password_change_takes_effect_and_keeps_permissions(users):
    users.create_user("alice", "old")
    _grant(users, "alice", "*", PUB)
    users.authenticate("alice", "old")
    users.set_password("alice", "new")
    with pytest.raises(Unauthenticated):
        users.authenticate("alice", "old")
    alice = users.authenticate("alice", "new")
    users.authorize(alice, PUB, TOPIC, "t")
    signed = b"20240517T101500Z"
    assert users.authenticate_signature("alice", signed, _sign(b"new", signed)) == alice


# --- management ---
def test_management_passthroughs(users):
    assert users.create_user("alice", "pw") == User("alice")
    _grant(users, "alice", "a", PUB)
    assert users.permissions("alice") == [Permission("alice", TOPIC, "a", frozenset({PUB}))]
    assert users.list_users() == [User("alice")]
    assert users.revoke("alice", TOPIC, "a") is True
    assert users.permissions("alice") == []
    assert users.delete_user("alice") is True
    assert users.list_users() == []


def test_the_default_admin_is_created_only_when_there_are_no_users(users, repository):
    assert users.ensure_default_user() is True
    assert repository.list_users() == [User("sluice", admin=True)]
    assert users.authenticate("sluice", "sluice").admin
    assert users.ensure_default_user() is False
    assert users.ensure_default_user("other", "pw") is False
    assert repository.list_users() == [User("sluice", admin=True)]


def test_no_default_admin_when_someone_else_exists(users, repository):
    users.create_user("alice", "pw")
    assert users.ensure_default_user() is False
    assert repository.get_user("sluice") is None
