"""The SQLite metadata database on a real full disk (a small tmpfs; skipped where mounting is not
permitted): a broker restarted there opens it read-only from memory, every write is refused with
QuotaExceeded (never a driver error), and writes resume by themselves once space is back."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from core.errors import QuotaExceeded
from core.metadata import MetadataRepository
from core.model import TopicConfig, User
from tests.conftest import fill_disk


@pytest.fixture
def disk(mount_tmpfs) -> Path:
    return mount_tmpfs("2m")


def test_a_database_reopened_on_a_full_disk_serves_reads_and_writes_again_once_space_is_back(
        disk, master_key):
    url = f"sqlite:///{disk}/metadata.db"
    repo = MetadataRepository(url, master_key)
    repo.create_user("alice", "secret")
    repo.create_topic(TopicConfig("orders"))
    repo.close()  # a clean close removes the WAL index, which a writable opener must grow again
    fill_disk(disk / "filler")

    repo = MetadataRepository(url, master_key)
    try:
        assert repo.read_only is not None and "full" in repo.read_only
        assert repo.verify_password("alice", "secret") == User("alice", False)
        assert [topic.name for topic in repo.list_topics()] == ["orders"]
        with pytest.raises(QuotaExceeded, match="nothing was changed"):
            repo.create_topic(TopicConfig("refused"))
        assert not repo.try_writable()
        os.remove(disk / "filler")
        repo.create_topic(TopicConfig("after"))  # reopens the file for writing first
        assert repo.read_only is None
        assert [topic.name for topic in repo.list_topics()] == ["after", "orders"]
    finally:
        repo.close()
    repo = MetadataRepository(url, master_key)
    try:
        assert repo.read_only is None
        assert [topic.name for topic in repo.list_topics()] == ["after", "orders"]
    finally:
        repo.close()


def test_a_write_the_disk_refuses_while_running_is_quota_exceeded(disk, master_key):
    repo = MetadataRepository(f"sqlite:///{disk}/metadata.db", master_key)
    try:
        fill_disk(disk / "filler")
        with pytest.raises(QuotaExceeded, match="metadata database cannot be written"):
            for number in range(10_000):  # until the WAL must grow
                repo.create_topic(TopicConfig(f"topic-{number}-" + "x" * 100))
        os.remove(disk / "filler")
        repo.create_topic(TopicConfig("after"))
        assert repo.get_topic("after") is not None
    finally:
        repo.close()
