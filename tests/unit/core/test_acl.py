"""Access-control rules on subjects: matching, specificity, placeholders, storage and Users."""
from __future__ import annotations

from collections.abc import Iterator

import pytest
from cryptography.fernet import Fernet
from sqlalchemy import create_engine, select

from core.acl import EVERYONE, RuleSet, check_rule
from core.auth import Users
from core.errors import AccessDenied, InvalidArgument, MessageNotFound, UserNotFound
from core.metadata import MetadataRepository
from core.metadata.schema import MIGRATIONS, schema_version
from core.model import SYSTEM as SYSTEM_PRINCIPAL
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


# --- readers other than subscriptions: pop, pull, lookups ------------------------------------

async def _reader_world(broker, *subjects: str) -> Principal:
    """Topic ``devices`` (one queue) holding a message per subject (its body), and user ``u``
    who may read it in group ``g``."""
    import asyncio

    from core.model import SYSTEM, OutgoingMessage, TopicConfig
    await broker.create_topic(SYSTEM, TopicConfig("devices", 1))
    await asyncio.to_thread(broker.users.create_user, "u", "pw")
    for kind, name in ((ResourceKind.TOPIC, "devices"), (ResourceKind.GROUP, "g")):
        await asyncio.to_thread(broker.users.grant, Permission("u", kind, name, frozenset({SUB})))
    await broker.send(SYSTEM, [OutgoingMessage("devices", s.encode(), keys=("k",),
                                               properties={"sluice.subject": s})
                               for s in subjects])
    return await asyncio.to_thread(broker.users.principal, "u")


def test_a_pop_never_hands_out_a_denied_subject_and_settles_it_for_the_group(tmp_path):
    from tests.unit.core.test_broker import run

    async def scenario(broker) -> None:
        u = await _reader_world(broker, "devices/secret/a", "devices/open/b", "devices/secret/c")
        broker.users.put_rule(_rule("devices/secret/#", allow=False, actions={SUB}))
        [got] = await broker.receive(u, "g", "devices", "c1", max_messages=10)
        assert got.body == b"devices/open/b"
        await broker.ack(u, "g", "devices", got.receipt_handle)
        [lag] = broker.lag("g")
        assert (lag.committed, lag.inflight) == (3, 0)  # nothing left behind, nothing retried
        assert broker.counters["messages_withheld", "devices"] == 2
    run(tmp_path, scenario)


def test_a_pull_skips_denied_subjects_and_its_next_offset_moves_past_them(tmp_path):
    from tests.unit.core.test_broker import run

    async def scenario(broker) -> None:
        u = await _reader_world(broker, "devices/open/a", "devices/secret/b", "devices/secret/c")
        broker.users.put_rule(_rule("devices/secret/#", allow=False, actions={SUB}, user="u"))
        first = await broker.pull(u, "g", "devices", 0, 0, max_messages=1)
        assert ([m.body for m in first.messages], first.next_offset) == ([b"devices/open/a"], 1)
        rest = await broker.pull(u, "g", "devices", 0, first.next_offset, max_messages=10)
        assert (rest.messages, rest.next_offset) == ([], 3)
        everything = await broker.pull(SYSTEM_PRINCIPAL, "g", "devices", 0, 0, max_messages=10)
        assert len(everything.messages) == 3  # admins are bound by no rule
    run(tmp_path, scenario)


def test_a_rule_added_later_applies_to_the_next_delivery_and_to_redeliveries(tmp_path):
    from tests.unit.core.test_broker import run

    async def scenario(broker) -> None:
        u = await _reader_world(broker, "devices/d1/a", "devices/d1/b")
        first = await broker.receive(u, "g", "devices", "c1", max_messages=1)
        assert [m.body for m in first] == [b"devices/d1/a"]
        broker.users.put_rule(_rule("devices/d1/#", allow=False, actions={SUB}))
        # the unsettled one falls due again at once: withheld now, so settled, not redelivered
        await broker.change_invisible(u, "g", "devices", first[0].receipt_handle, 0)
        assert await broker.receive(u, "g", "devices", "c1", max_messages=10) == []
        [lag] = broker.lag("g")
        assert (lag.committed, lag.inflight) == (2, 0)
        with pytest.raises(MessageNotFound):
            broker.lookup_messages(u, first[0].msg_id)
        assert broker.lookup_key(u, "devices", "k").messages == []
        assert broker.find_in_time(u, "devices", 0, 2**62) == []
        broker.users.delete_rule(EVERYONE, "devices/d1/#", False)
        assert [m.body for m in broker.lookup_key(u, "devices", "k").messages] == [b"devices/d1/b",
                                                                            b"devices/d1/a"]
    run(tmp_path, scenario)


def test_readers_pay_nothing_per_message_without_rules_and_once_per_subject_with_them(
        tmp_path, monkeypatch):
    from tests.unit.core.test_broker import run
    decided = []
    decide = RuleSet.decide
    monkeypatch.setattr(RuleSet, "decide", lambda self, *a, **k: decided.append(a) or decide(
        self, *a, **k))

    async def scenario(broker) -> None:
        u = await _reader_world(broker, *["devices/d1/t"] * 500, *["devices/d2/t"] * 500)
        assert broker.withheld_by_rules(u) is None  # no rule: no check at all per message
        broker.users.put_rule(_rule("orders/#", allow=False, actions={PUB}))
        assert broker.withheld_by_rules(u) is None  # a rule on publishing only: none either
        broker.users.put_rule(_rule("devices/d2/#", allow=False, actions={SUB}))
        assert broker.withheld_by_rules(SYSTEM_PRINCIPAL) is None  # admins: none
        decided.clear()
        pulled = await broker.pull(u, "g", "devices", 0, 0, max_messages=10_000)
        assert len(pulled.messages) == 500
        assert len(decided) == 2  # one decision per subject, then the cache answers
    run(tmp_path, scenario)


def test_a_lite_topic_reader_never_gets_a_denied_subject_and_its_lite_topics_move_on(tmp_path):
    import asyncio

    from core import lite
    from core.model import SYSTEM, MessageType, OutgoingMessage, TopicConfig
    from tests.unit.core.test_broker import run

    def to(name: str, subject: str) -> OutgoingMessage:
        return OutgoingMessage("chats", subject.encode(), lite_topic=name,
                               properties={"sluice.subject": subject})

    async def scenario(broker) -> None:
        await broker.create_topic(SYSTEM, TopicConfig("chats", 1, MessageType.LITE))
        await asyncio.to_thread(broker.users.create_user, "u", "pw")
        for kind, name in ((ResourceKind.TOPIC, "chats"), (ResourceKind.GROUP, "g")):
            await asyncio.to_thread(broker.users.grant, Permission("u", kind, name, frozenset({SUB})))
        u = await asyncio.to_thread(broker.users.principal, "u")
        broker.users.put_rule(_rule("chats/secret/#", allow=False, actions={SUB}))
        await broker.send(SYSTEM, [to("s1", "chats/secret/a"), to("s1", "chats/open/b"),
                                   to("s2", "chats/secret/c"), to("s2", "chats/secret/d")])
        await broker.sync_lite_subscription(u, "g", "chats", "c1", lite.PARTIAL_ADD, ["s1", "s2"])
        [b] = await broker.receive(u, "g", "chats", "c1")
        assert b.body == b"chats/open/b"
        await broker.ack(u, "g", "chats", b.receipt_handle)
        await broker.send(SYSTEM, [to("s2", "chats/open/e")])
        assert [m.body for m in await broker.receive(u, "g", "chats", "c1")] == [b"chats/open/e"]
    run(tmp_path, scenario, store="file")


def test_a_dead_letter_copy_is_withheld_as_the_subject_it_was_sent_with(tmp_path):
    import asyncio

    from core.model import SYSTEM
    from tests.unit.core.test_broker import run

    async def scenario(broker) -> None:
        u = await _reader_world(broker, "devices/secret/a", "devices/open/b")
        for delivery in await broker.receive(SYSTEM, "g", "devices", "c1", max_messages=10):
            await broker.forward_to_dead_letter(SYSTEM, "g", "devices", delivery.receipt_handle)
        await asyncio.to_thread(broker.users.grant, Permission(
            "u", ResourceKind.TOPIC, "%DLQ%g", frozenset({SUB})))
        broker.users.put_rule(_rule("devices/secret/#", allow=False, actions={SUB}))
        copies = await broker.pull(u, "dlq-reader", "%DLQ%g", 0, 0, max_messages=10)
        assert [m.body for m in copies.messages] == [b"devices/open/b"]
    run(tmp_path, scenario)
