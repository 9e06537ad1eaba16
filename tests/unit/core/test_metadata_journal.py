"""The metadata database replicated as a journal: a replicated write changes nothing until the
journal confirms it, then the same entry makes another node's database the same; an entry is
applied once; a refused write changes nothing anywhere."""
from __future__ import annotations

import pytest
from cryptography.fernet import Fernet

from core.errors import AlreadyExists, QuotaExceeded
from core.metadata import MetadataRepository
from core.model import Action, Permission, ResourceKind, TopicConfig

KEY = Fernet.generate_key()


def open_repo(path) -> MetadataRepository:
    return MetadataRepository(f"sqlite:///{path}", KEY)


def test_a_replicated_write_reaches_every_node_through_its_journal_entry(tmp_path):
    leader, follower = open_repo(tmp_path / "leader.db"), open_repo(tmp_path / "follower.db")
    entries: list[bytes] = []

    def journal(entry: bytes) -> int:
        if not entries:
            assert leader.get_user("alice") is None, "nothing is applied before the group confirms it"
        entries.append(entry)
        return len(entries) - 1
    leader.replicate_through(journal)
    leader.create_user("alice", "secret-pw")
    leader.grant(Permission("alice", ResourceKind.TOPIC, "orders.*", frozenset({Action.PUBLISH})))
    leader.put_topology("/", "queue", "jobs", '{"durable": true}')
    leader.create_topic(TopicConfig("orders", queue_count=2))
    with pytest.raises(AlreadyExists):
        leader.create_topic(TopicConfig("orders", queue_count=2))
    assert leader.verify_password("alice", "secret-pw") is not None
    for at, entry in enumerate(entries):
        assert follower.apply_journal(entry, at)
        assert not follower.apply_journal(entry, at), "an entry is applied once"
    assert follower.verify_password("alice", "secret-pw") is not None
    assert follower.signing_secret("alice") == b"secret-pw", "the same master key reads the secret"
    assert follower.permissions("alice") == leader.permissions("alice")
    assert follower.topology() == leader.topology()
    assert [t.name for t in follower.list_topics()] == ["orders"]
    assert follower.journal_position() == leader.journal_position() == len(entries) - 1


def test_a_write_the_group_refuses_changes_nothing(tmp_path):
    leader = open_repo(tmp_path / "leader.db")

    def refuse(entry: bytes) -> int:
        raise QuotaExceeded("only 1 replica(s) in sync, min_insync is 2")
    leader.replicate_through(refuse)
    with pytest.raises(QuotaExceeded):
        leader.create_user("bob", "pw-of-bob")
    assert leader.get_user("bob") is None
    assert leader.journal_position() == -1


def test_a_node_whose_log_begins_past_the_first_entries_starts_from_a_dump(tmp_path):
    """A dump carries every row and the journal position; restoring it replaces what the node
    had, and the next entries apply on top."""
    leader, follower = open_repo(tmp_path / "leader.db"), open_repo(tmp_path / "follower.db")
    entries: list[bytes] = []

    def journal(entry: bytes) -> int:
        entries.append(entry)
        return len(entries) - 1

    def confirmed() -> None:  # the leader applies the group's entries as every node does
        for at, entry in enumerate(entries):
            leader.apply_journal(entry, at)
    follower.create_user("stale", "from-an-earlier-life")
    leader.replicate_through(journal)
    leader.create_user("alice", "secret-pw")
    leader.grant(Permission("alice", ResourceKind.TOPIC, "orders.*", frozenset({Action.PUBLISH})))
    leader.put_topology("/", "queue", "jobs", '{"durable": true}')
    leader.create_topic(TopicConfig("orders", queue_count=2))
    confirmed()
    follower.restore(leader.dump())
    assert follower.get_user("stale") is None, "the restore replaces what the node had"
    assert follower.verify_password("alice", "secret-pw") is not None
    assert follower.signing_secret("alice") == b"secret-pw"
    assert follower.permissions("alice") == leader.permissions("alice")
    assert follower.topology() == leader.topology()
    assert follower.journal_position() == leader.journal_position() == len(entries) - 1
    leader.create_topic(TopicConfig("later", queue_count=1))
    confirmed()
    assert not follower.apply_journal(entries[0], 0), "entries the dump covers are not applied again"
    assert follower.apply_journal(entries[-1], len(entries) - 1)
    assert [t.name for t in follower.list_topics()] == [t.name for t in leader.list_topics()] == ["later", "orders"]
