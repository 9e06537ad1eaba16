"""MetadataRepository on SQLite and on a real PostgreSQL: every call, round trip and error."""
from __future__ import annotations

import stat
import statistics
import threading
import time

import pytest
from cryptography.fernet import Fernet
from sqlalchemy import create_engine, func, select, text

from core.errors import (AlreadyExists, GroupNotFound, InvalidArgument, TopicNotFound,
                         UserNotFound)
from core.metadata import LATEST_VERSION, BadMasterKey, MetadataRepository, SchemaTooNew
from core.metadata.schema import MIGRATIONS, schema_version, users
from core.model import (Action, ConsumeMode, GroupConfig, MessageType, Permission, ResourceKind,
                        RetryPolicy, Subscription, TopicConfig, User)

TOPIC = TopicConfig("orders", queue_count=3, message_type=MessageType.FIFO, retention_ms=86_400_000,
                    compacted=True, tier_retention_ms=30 * 86_400_000)
GROUP = GroupConfig("billing", ConsumeMode.BROADCAST,
                    RetryPolicy(max_attempts=5, initial_backoff_ms=250, max_backoff_ms=9_000,
                                multiplier=1.5), fifo=True)


def _perm(user: str, pattern: str, *actions: Action, kind: ResourceKind = ResourceKind.TOPIC) -> Permission:
    return Permission(user, kind, pattern, frozenset(actions))


# --- schema ---
def test_a_new_database_gets_the_latest_schema_and_reopening_changes_nothing(metadata_url, master_key):
    MetadataRepository(metadata_url, master_key).close()
    repo = MetadataRepository(metadata_url, master_key)
    assert repo.schema_version() == LATEST_VERSION == 8
    repo.create_topic(TOPIC)
    repo.close()
    repo = MetadataRepository(metadata_url, master_key)
    assert repo.get_topic("orders") == TOPIC
    repo.close()
    engine = create_engine(metadata_url)
    with engine.connect() as conn:
        rows = conn.execute(select(schema_version.c.version)).scalars().all()
    engine.dispose()
    assert rows == list(range(1, LATEST_VERSION + 1))


def test_a_version_7_database_gains_the_tier_settings_and_keeps_its_topics(metadata_url, master_key):
    engine = create_engine(metadata_url)
    with engine.begin() as conn:
        schema_version.create(conn)
        for number, migration in enumerate(MIGRATIONS[:7], start=1):
            migration(conn)
            conn.execute(schema_version.insert().values(version=number, applied_ms=0))
        conn.execute(text("INSERT INTO topics (name, queue_count, message_type, retention_ms, "
                          "compacted) VALUES ('old', 2, 'normal', 1000, false)"))
    engine.dispose()
    repo = MetadataRepository(metadata_url, master_key)
    assert repo.schema_version() == 8
    assert repo.get_topic("old") == TopicConfig("old", queue_count=2, retention_ms=1000)
    repo.update_topic(TopicConfig("old", queue_count=2, tier_retention_ms=5_000))
    assert repo.get_topic("old").tier_retention_ms == 5_000
    repo.close()


def test_a_database_from_a_newer_sluice_is_refused_with_upgrade_advice(metadata_url, master_key):
    MetadataRepository(metadata_url, master_key).close()
    engine = create_engine(metadata_url)
    with engine.begin() as conn:
        conn.execute(schema_version.insert().values(version=LATEST_VERSION + 1, applied_ms=0))
    engine.dispose()
    with pytest.raises(SchemaTooNew, match=f"version {LATEST_VERSION + 1}.*upgrade Sluice"):
        MetadataRepository(metadata_url, master_key)


@pytest.mark.parametrize("url", ["mysql://db/sluice", "postgresql://db/sluice", "sqlite://"])
def test_unsupported_urls_are_refused_with_the_supported_forms(url, master_key):
    with pytest.raises(InvalidArgument, match=r"sqlite:///<path>"):
        MetadataRepository(url, master_key)


# --- topics and groups ---
def test_topics_round_trip_every_field(repo):
    repo.create_topic(TOPIC)
    repo.create_topic(TopicConfig("alerts"))
    assert repo.get_topic("orders") == TOPIC
    assert repo.get_topic("alerts") == TopicConfig("alerts")
    assert repo.list_topics() == [TopicConfig("alerts"), TOPIC]
    changed = TopicConfig("orders", queue_count=16, retention_ms=None)
    repo.update_topic(changed)
    assert repo.get_topic("orders") == changed
    assert repo.get_topic("missing") is None


def test_topic_create_update_and_delete_report_what_exists(repo):
    repo.create_topic(TOPIC)
    with pytest.raises(AlreadyExists, match="'orders' exists already"):
        repo.create_topic(TopicConfig("orders"))
    with pytest.raises(TopicNotFound):
        repo.update_topic(TopicConfig("missing"))
    assert repo.delete_topic("orders") is True
    assert repo.delete_topic("orders") is False
    assert repo.list_topics() == []


def test_groups_round_trip_every_field(repo):
    repo.create_group(GROUP)
    repo.create_group(GroupConfig("audit"))
    assert repo.get_group("billing") == GROUP
    assert repo.list_groups() == [GroupConfig("audit"), GROUP]
    changed = GroupConfig("billing", retry=RetryPolicy(max_attempts=1, multiplier=3.25))
    repo.update_group(changed)
    assert repo.get_group("billing") == changed
    assert repo.get_group("missing") is None


def test_group_create_update_and_delete_report_what_exists(repo):
    repo.create_group(GROUP)
    with pytest.raises(AlreadyExists):
        repo.create_group(GroupConfig("billing"))
    with pytest.raises(GroupNotFound):
        repo.update_group(GroupConfig("missing"))
    assert repo.delete_group("billing") is True
    assert repo.delete_group("billing") is False


# --- subscriptions ---
def test_put_subscription_upserts_by_group_and_topic(repo):
    repo.create_group(GROUP)
    repo.create_group(GroupConfig("audit"))
    repo.put_subscription(Subscription("billing", "orders", "TagA || TagB"))
    repo.put_subscription(Subscription("billing", "orders", "amount > 10", "SQL92"))
    repo.put_subscription(Subscription("billing", "alerts"))
    repo.put_subscription(Subscription("audit", "orders"))
    assert repo.list_subscriptions("billing") == [
        Subscription("billing", "alerts"), Subscription("billing", "orders", "amount > 10", "SQL92")]
    assert len(repo.list_subscriptions()) == 3
    assert repo.delete_subscription("billing", "alerts") is True
    assert repo.delete_subscription("billing", "alerts") is False
    assert repo.list_subscriptions("billing") == [Subscription("billing", "orders", "amount > 10", "SQL92")]


def test_a_subscription_needs_its_group_and_goes_with_it(repo):
    with pytest.raises(GroupNotFound):
        repo.put_subscription(Subscription("ghost", "orders"))
    repo.create_group(GROUP)
    repo.create_group(GroupConfig("audit"))
    repo.put_subscription(Subscription("billing", "orders"))
    repo.put_subscription(Subscription("audit", "orders"))
    repo.delete_group("billing")
    assert repo.list_subscriptions() == [Subscription("audit", "orders")]
    repo.create_group(GROUP)
    assert repo.list_subscriptions("billing") == []


# --- users ---
def test_users_round_trip(repo):
    assert repo.create_user("alice", "s3cret") == User("alice")
    assert repo.create_user("root", "toor", admin=True) == User("root", admin=True)
    assert repo.get_user("alice") == User("alice")
    assert repo.get_user("nobody") is None
    assert repo.list_users() == [User("alice"), User("root", admin=True)]
    with pytest.raises(AlreadyExists, match="user 'alice' exists already"):
        repo.create_user("alice", "other")


def test_verify_password_right_wrong_unknown_and_after_a_change(repo):
    repo.create_user("alice", "s3cret", admin=True)
    assert repo.verify_password("alice", "s3cret") == User("alice", admin=True)
    assert repo.verify_password("alice", "S3cret") is None
    assert repo.verify_password("bob", "s3cret") is None
    repo.set_password("alice", "n3w")
    assert repo.verify_password("alice", "s3cret") is None
    assert repo.verify_password("alice", "n3w") == User("alice", admin=True)
    with pytest.raises(UserNotFound, match="sluice user create bob"):
        repo.set_password("bob", "x")


def test_an_unknown_user_takes_as_long_as_a_wrong_password(repo):
    repo.create_user("alice", "s3cret")

    def median_seconds(name: str) -> float:  # CPU time of this thread: other load does not count
        samples = []
        for _ in range(5):
            start = time.thread_time()
            repo.verify_password(name, "guess")
            samples.append(time.thread_time() - start)
        return statistics.median(samples)

    wrong, unknown = median_seconds("alice"), median_seconds("mallory")
    assert unknown > 0.5 * wrong, (unknown, wrong)


def test_the_password_is_never_stored_in_clear(repo, metadata_url):
    password = "correct-horse-battery-staple"
    repo.create_user("alice", password)
    engine = create_engine(metadata_url)
    with engine.connect() as conn:
        row = conn.execute(select(users).where(users.c.name == "alice")).one()
    engine.dispose()
    assert row.password_hash.startswith("scrypt$")
    for value in row:
        assert password not in str(value)
        assert password.encode().hex() not in str(value)


def test_signing_secret_round_trips_and_follows_password_changes(repo):
    repo.create_user("alice", "s3cret")
    assert repo.signing_secret("alice") == b"s3cret"
    repo.set_password("alice", "n3w-pässword")
    assert repo.signing_secret("alice") == "n3w-pässword".encode()
    assert repo.signing_secret("nobody") is None


def test_a_different_master_key_cannot_read_signing_secrets(repo, metadata_url):
    repo.create_user("alice", "s3cret")
    other = MetadataRepository(metadata_url, Fernet.generate_key())
    try:
        with pytest.raises(BadMasterKey, match="another master key"):
            other.signing_secret("alice")
        assert other.verify_password("alice", "s3cret") == User("alice")
    finally:
        other.close()


@pytest.mark.parametrize("name", ["", "has space", "$system", "a:b", "x" * 128, "tab\there"])
def test_invalid_user_names_are_refused(repo, name):
    with pytest.raises(InvalidArgument, match="user name"):
        repo.create_user(name, "pw")


def test_an_empty_password_is_refused(repo):
    with pytest.raises(InvalidArgument, match="password is empty"):
        repo.create_user("alice", "")


# --- permissions ---
def test_grant_upserts_by_user_kind_and_pattern(repo):
    repo.create_user("alice", "pw")
    repo.grant(_perm("alice", "orders-*", Action.PUBLISH))
    repo.grant(_perm("alice", "orders-*", Action.SUBSCRIBE, Action.ADMIN))
    repo.grant(_perm("alice", "orders-*", Action.SUBSCRIBE, kind=ResourceKind.GROUP))
    assert repo.permissions("alice") == [
        _perm("alice", "orders-*", Action.SUBSCRIBE, kind=ResourceKind.GROUP),
        _perm("alice", "orders-*", Action.SUBSCRIBE, Action.ADMIN)]


def test_revoke_removes_one_permission(repo):
    repo.create_user("alice", "pw")
    repo.grant(_perm("alice", "a", Action.PUBLISH))
    repo.grant(_perm("alice", "b", Action.PUBLISH))
    assert repo.revoke("alice", ResourceKind.TOPIC, "a") is True
    assert repo.revoke("alice", ResourceKind.TOPIC, "a") is False
    assert repo.revoke("alice", ResourceKind.GROUP, "b") is False
    assert repo.permissions("alice") == [_perm("alice", "b", Action.PUBLISH)]


def test_permission_calls_on_an_unknown_user_raise_user_not_found(repo):
    with pytest.raises(UserNotFound):
        repo.grant(_perm("ghost", "*", Action.PUBLISH))
    with pytest.raises(UserNotFound):
        repo.revoke("ghost", ResourceKind.TOPIC, "*")
    with pytest.raises(UserNotFound):
        repo.permissions("ghost")


def test_a_permission_needs_a_pattern_and_an_action(repo):
    repo.create_user("alice", "pw")
    with pytest.raises(InvalidArgument):
        repo.grant(_perm("alice", "", Action.PUBLISH))
    with pytest.raises(InvalidArgument):
        repo.grant(_perm("alice", "*"))


def test_deleting_a_user_deletes_its_permissions(repo):
    repo.create_user("alice", "pw")
    repo.create_user("bob", "pw")
    repo.grant(_perm("alice", "*", Action.PUBLISH))
    repo.grant(_perm("bob", "*", Action.PUBLISH))
    assert repo.delete_user("alice") is True
    assert repo.delete_user("alice") is False
    assert repo.get_user("alice") is None
    repo.create_user("alice", "pw")
    assert repo.permissions("alice") == []
    assert repo.permissions("bob") == [_perm("bob", "*", Action.PUBLISH)]


# --- concurrency ---
def test_concurrent_creators_of_one_name_get_one_success(repo):
    outcomes: list[str] = []
    start = threading.Barrier(8)

    def create(i: int) -> None:
        start.wait()
        try:
            repo.create_topic(TopicConfig("race", queue_count=i + 1))
            outcomes.append("created")
        except AlreadyExists:
            outcomes.append("exists")
        repo.create_topic(TopicConfig(f"own-{i}"))

    threads = [threading.Thread(target=create, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes) == ["created"] + ["exists"] * 7
    assert len(repo.list_topics()) == 9


# --- data dir ---
def test_for_data_dir_creates_a_private_master_key_once_and_reuses_it(tmp_path):
    data_dir = tmp_path / "data"
    repo = MetadataRepository.for_data_dir(str(data_dir))
    repo.create_user("alice", "s3cret")
    repo.close()
    key_file = data_dir / "master.key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    key = key_file.read_bytes()
    assert (data_dir / "metadata.db").is_file()
    assert not list(data_dir.glob(".master.key.*")), "the temporary key file was left behind"

    repo = MetadataRepository.for_data_dir(str(data_dir))
    assert repo.signing_secret("alice") == b"s3cret"
    repo.close()
    assert key_file.read_bytes() == key


def test_for_data_dir_keeps_the_key_there_when_the_database_is_elsewhere(tmp_path, metadata_url):
    repo = MetadataRepository.for_data_dir(str(tmp_path / "data"), metadata_url)
    repo.create_user("alice", "s3cret")
    repo.close()
    repo = MetadataRepository.for_data_dir(str(tmp_path / "data"), metadata_url)
    assert repo.signing_secret("alice") == b"s3cret"
    repo.close()


def test_a_damaged_master_key_file_is_reported(tmp_path):
    (tmp_path / "master.key").write_bytes(b"not a key")
    with pytest.raises(BadMasterKey, match="master.key is damaged"):
        MetadataRepository.for_data_dir(str(tmp_path))


def test_sqlite_runs_in_wal_mode(tmp_path, master_key):
    url = f"sqlite:///{tmp_path}/metadata.db"
    MetadataRepository(url, master_key).close()
    engine = create_engine(url)
    with engine.connect() as conn:
        assert conn.execute(text("PRAGMA journal_mode")).scalar_one() == "wal"
        assert conn.execute(select(func.count()).select_from(schema_version)).scalar_one() == LATEST_VERSION
    engine.dispose()


def test_amqp_topology_rows_upsert_and_delete_by_object_kind_or_vhost(repo):
    repo.put_topology("/", "exchange", "orders", '{"type": "topic"}')
    repo.put_topology("/", "exchange", "orders", '{"type": "fanout"}')
    repo.put_topology("/", "queue", "billing", "{}")
    repo.put_topology("shop", "queue", "billing", '{"x-max-length": 10}')
    assert repo.topology() == [("/", "exchange", "orders", '{"type": "fanout"}'),
                               ("/", "queue", "billing", "{}"),
                               ("shop", "queue", "billing", '{"x-max-length": 10}')]
    assert repo.delete_topology("/", "queue", "billing") == 1
    assert repo.delete_topology("/", "queue", "billing") == 0
    assert repo.delete_topology("shop") == 1
    assert repo.topology() == [("/", "exchange", "orders", '{"type": "fanout"}')]


def test_amqp_topology_rows_of_one_kind_are_deleted_by_name_in_one_call(repo):
    names = [f"binding-{i}" for i in range(1_200)]  # more than one statement's worth
    for name in names:
        repo.put_topology("/", "binding", name, "{}")
    repo.put_topology("/", "queue", "binding-0", "{}")
    repo.put_topology("shop", "binding", "binding-0", "{}")
    assert repo.delete_topology_rows("/", "binding", names[:-1] + ["missing"]) == 1_199
    assert repo.topology() == [("/", "binding", "binding-1199", "{}"),
                               ("/", "queue", "binding-0", "{}"),
                               ("shop", "binding", "binding-0", "{}")]
    assert repo.delete_topology_rows("/", "binding", []) == 0


def test_amqp_permissions_are_replaced_per_user_and_vhost_and_go_with_their_user(repo):
    repo.create_user("ann", "pw")
    repo.create_user("bo", "pw")
    repo.put_vhost_permission("ann", "/", ".*", ".*", ".*")
    repo.put_vhost_permission("ann", "/", "", "^app", ".*")
    repo.put_vhost_permission("ann", "shop", "", "", ".*")
    repo.put_vhost_permission("bo", "shop", ".*", "", "")
    assert repo.vhost_permissions() == [("ann", "/", "", "^app", ".*"),
                                        ("ann", "shop", "", "", ".*"),
                                        ("bo", "shop", ".*", "", "")]
    with pytest.raises(UserNotFound):
        repo.put_vhost_permission("nobody", "/", ".*", ".*", ".*")
    assert repo.delete_vhost_permissions(vhost="shop") == 2
    repo.delete_user("ann")
    assert repo.vhost_permissions() == []


def test_a_version_3_database_migrates_to_amqp_permissions(metadata_url, master_key):
    from core.metadata import schema
    engine = create_engine(metadata_url)
    with engine.begin() as conn:
        schema.metadata.create_all(conn, tables=[schema.schema_version])
        for number, migration in enumerate(schema.MIGRATIONS[:3], start=1):
            migration(conn)
            conn.execute(schema.schema_version.insert().values(version=number, applied_ms=0))
    engine.dispose()
    repo = MetadataRepository(metadata_url, master_key)
    repo.create_user("ann", "pw")
    repo.put_vhost_permission("ann", "/", ".*", ".*", ".*")
    assert repo.schema_version() == LATEST_VERSION and repo.vhost_permissions() == [("ann", "/", ".*", ".*",
                                                                         ".*")]
    repo.close()
