"""Access-control rules on subjects: matching, specificity, placeholders, storage and Users."""
from __future__ import annotations

from collections.abc import Iterator

import pytest
from cryptography.fernet import Fernet
from sqlalchemy import create_engine, select

from core.acl import EVERYONE, RuleSet, check_rule
from core.auth import Users
from core.errors import AccessDenied, InvalidArgument, UserNotFound
from core.metadata import MetadataRepository
from core.metadata.schema import MIGRATIONS, schema_version
from core.model import AclRule, Action, Permission, Principal, ResourceKind
from tests.unit.core.test_broker import SUBJECTS

PUB, SUB = Action.PUBLISH, Action.SUBSCRIBE
BOTH = frozenset({PUB, SUB})


def _rule(pattern: str, allow: bool = True, actions=BOTH, user: str = EVERYONE) -> AclRule:
    return AclRule(user, pattern, frozenset(actions), allow)


# --- deciding -------------------------------------------------------------------------------

CONFINED = RuleSet([_rule("devices/#", allow=False), _rule("devices/%c/#")], SUBJECTS)


@pytest.mark.parametrize("client, subject, expected", [
    ("d1", "devices/d1/telemetry", True),
    ("d1", "devices/d1", True),               # '#' also matches its parent level
    ("d1", "devices/d2/telemetry", False),
    ("d1", "devices", False),
    ("d1", "other/x", None),                  # no rule: the topic permission decides
    ("+", "devices/+/telemetry", False),      # a client id is a literal level, never a wildcard
    ("d1/x", "devices/d1/x/telemetry", False),  # nor two levels
    ("", "devices//telemetry", False),        # an empty client id matches nothing
])
def test_a_device_is_confined_to_its_own_client_id(client, subject, expected):
    assert CONFINED.decide(PUB, "u", client, subject) is expected


@pytest.mark.parametrize("topic_filter, expected", [
    ("devices/d1/#", True),
    ("devices/d1/+", True),
    ("devices/+/telemetry", False),           # covers other devices: the broad deny covers it
    ("devices/#", False),
    ("#", None),                              # no rule covers all of '#': topic permission
])
def test_a_subscription_is_decided_by_the_most_specific_rule_covering_the_whole_filter(
        topic_filter, expected):
    assert CONFINED.decide(SUB, "u", "d1", topic_filter, is_filter=True) is expected


def test_everything_except_a_private_branch():
    rules = RuleSet([_rule("test/#"), _rule("test/private/#", allow=False)], SUBJECTS)
    assert rules.decide(SUB, "u", "c", "test/public/a") is True
    assert rules.decide(SUB, "u", "c", "test/private/a") is False
    assert rules.decide(SUB, "u", "c", "test/#", is_filter=True) is True
    assert rules.decide(SUB, "u", "c", "test/private/#", is_filter=True) is False


def test_deny_wins_between_equally_specific_rules_and_actions_are_separate():
    rules = RuleSet([_rule("a/+", actions={PUB}), _rule("a/+", allow=False, actions={PUB}),
                     _rule("a/b", actions={SUB})], SUBJECTS)
    assert rules.decide(PUB, "u", "c", "a/x") is False
    assert rules.decide(SUB, "u", "c", "a/b") is True
    assert rules.decide(SUB, "u", "c", "a/x") is None


def test_user_placeholder_and_dollar_subjects():
    rules = RuleSet([_rule("home/%u/#"), _rule("#", allow=False)], SUBJECTS)
    assert rules.decide(PUB, "alice", "c", "home/alice/lamp") is True
    assert rules.decide(PUB, "bob", "c", "home/alice/lamp") is False
    assert rules.decide(PUB, "bob", "c", "$SYS/x") is None  # a leading wildcard skips '$'


@pytest.mark.parametrize("pattern", ["", "a/#/b", "a/b+", "x" * 1025])
def test_malformed_patterns_are_refused(pattern):
    with pytest.raises(InvalidArgument):
        check_rule(_rule(pattern), SUBJECTS)


def test_a_rule_needs_publish_or_subscribe():
    with pytest.raises(InvalidArgument):
        check_rule(_rule("a/#", actions={Action.ADMIN}), SUBJECTS)


# --- storage ----------------------------------------------------------------------------------

def test_rules_are_stored_replaced_listed_and_deleted(repo):
    repo.create_user("dev", "pw")
    repo.put_rule(_rule("devices/%c/#", user="dev", actions={PUB}))
    repo.put_rule(_rule("devices/%c/#", user="dev", actions={PUB, SUB}))  # replaces
    repo.put_rule(_rule("devices/#", allow=False))
    repo.put_rule(_rule("devices/#", user="dev"))  # allow and deny of one pattern are two rules
    assert repo.rules(("dev", EVERYONE)) == [
        _rule("devices/#", allow=False),
        _rule("devices/#", user="dev"),
        _rule("devices/%c/#", user="dev"),
    ]
    assert repo.delete_rule("dev", "devices/#", True)
    assert not repo.delete_rule("dev", "devices/#", True)
    with pytest.raises(UserNotFound):
        repo.put_rule(_rule("x/#", user="nobody"))
    repo.delete_user("dev")
    assert repo.rules() == [_rule("devices/#", allow=False)]


def test_a_version_1_database_is_upgraded_and_keeps_its_data(tmp_path):
    url = f"sqlite:///{tmp_path}/metadata.db"
    engine = create_engine(url)
    with engine.begin() as conn:
        schema_version.create(conn)
        MIGRATIONS[0](conn)
        conn.execute(schema_version.insert().values(version=1, applied_ms=0))
    engine.dispose()
    repo = MetadataRepository(url, Fernet.generate_key())
    try:
        repo.create_user("dev", "pw")
        repo.put_rule(_rule("a/#", user="dev"))
        assert repo.schema_version() == len(MIGRATIONS)
        assert repo.rules() == [_rule("a/#", user="dev")]
    finally:
        repo.close()
    with create_engine(url).connect() as conn:
        assert conn.execute(select(schema_version.c.version)).scalars().all() == list(
            range(1, len(MIGRATIONS) + 1))


def test_no_user_may_be_named_everyone(repo):
    with pytest.raises(InvalidArgument, match=r"'\*'"):
        repo.create_user("*", "pw")


# --- Users ------------------------------------------------------------------------------------

@pytest.fixture
def users(tmp_path) -> Iterator[Users]:
    repository = MetadataRepository(f"sqlite:///{tmp_path}/metadata.db", Fernet.generate_key())
    yield Users(repository, SUBJECTS)
    repository.close()


def _device(users: Users, name: str) -> Principal:
    users.create_user(name, "pw")
    users.grant(Permission(name, ResourceKind.TOPIC, "devices", BOTH))
    return users.principal(name)


def test_rules_refine_a_topic_permission_at_once_for_open_connections(users):
    d1 = _device(users, "d1")
    connection = Principal(d1.user, d1.admin, d1.permissions, d1.acl, client_id="d1")
    assert users.subject_allowed(connection, PUB, "devices/d2/cmd")  # the topic grant allows it
    users.put_rule(_rule("devices/#", allow=False))
    users.put_rule(_rule("devices/%c/#"))
    assert users.subject_allowed(connection, PUB, "devices/d1/telemetry")
    assert not users.subject_allowed(connection, PUB, "devices/d2/cmd")
    assert not users.filter_allowed(connection, "devices/+/telemetry")
    assert users.filter_allowed(connection, "devices/d1/#")
    users.delete_rule(EVERYONE, "devices/#", False)
    assert users.subject_allowed(connection, PUB, "devices/d2/cmd")


def test_an_allow_rule_grants_without_a_topic_permission_and_admins_pass_everything(users):
    users.create_user("u", "pw")
    users.create_user("root", "pw", admin=True)
    u = users.principal("u")
    assert not users.subject_allowed(u, PUB, "home/u/lamp")
    users.put_rule(_rule("home/%u/#", user="u"))
    assert users.subject_allowed(u, PUB, "home/u/lamp")
    users.put_rule(_rule("#", allow=False))
    assert users.subject_allowed(users.principal("root"), PUB, "anything/at/all")


def test_internal_topics_are_for_admins_whatever_the_patterns_say(users):
    users.create_user("u", "pw")
    users.grant(Permission("u", ResourceKind.TOPIC, "*", BOTH))
    with pytest.raises(AccessDenied):
        users.authorize(users.principal("u"), PUB, ResourceKind.TOPIC, "%SYS%mqtt.sessions")
    users.authorize(users.principal("u"), PUB, ResourceKind.TOPIC, "orders")
    users.create_user("root", "pw", admin=True)
    users.authorize(users.principal("root"), PUB, ResourceKind.TOPIC, "%SYS%mqtt.sessions")


def test_listeners_hear_of_every_change_with_whether_the_user_still_exists(users):
    heard = []
    users.add_listener(lambda name, exists: heard.append((name, exists)))
    before = users.generation
    users.create_user("u", "pw")
    users.grant(Permission("u", ResourceKind.TOPIC, "t", BOTH))
    users.put_rule(_rule("a/#"))
    users.delete_user("u")
    assert heard == [("u", True), ("u", True), (EVERYONE, True), ("u", False)]
    assert users.generation > before


def test_a_heartbeat_names_no_topic_the_user_may_not_read_whether_it_exists_or_not(tmp_path):
    """A consumer declaring a subscription is refused alike for a forbidden topic that exists
    and one that does not: the answer must not tell which topics exist."""
    import asyncio

    from core.errors import AccessDenied
    from core.model import SYSTEM, GroupConfig, Subscription, TopicConfig
    from tests.unit.core.test_broker import run

    async def scenario(broker) -> None:
        await broker.create_topic(SYSTEM, TopicConfig("secret", 1))
        await broker.create_group(SYSTEM, GroupConfig("g"))
        await asyncio.to_thread(broker.users.create_user, "u", "pw")
        await asyncio.to_thread(broker.users.grant, Permission("u", ResourceKind.GROUP, "g",
                                                               frozenset({SUB})))
        u = await asyncio.to_thread(broker.users.principal, "u")
        for name in ("secret", "no-such-topic"):
            with pytest.raises(AccessDenied):
                await broker.heartbeat(u, "g", "c1", [Subscription("g", name)])
    run(tmp_path, scenario)
