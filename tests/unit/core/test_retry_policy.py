"""Retry policies and group settings are validated in core, for every adapter alike; a policy
stored before validation existed still loads."""
from __future__ import annotations

import logging
import math

import pytest
from cryptography.fernet import Fernet
from sqlalchemy import create_engine, update

from core.errors import InvalidArgument
from core.metadata import MetadataRepository
from core.metadata.schema import consumer_groups
from core.model import ConsumeMode, GroupConfig, RetryPolicy


@pytest.mark.parametrize("refused, accepted, named", [
    ({"max_attempts": -5}, {"max_attempts": 1}, "max_attempts"),
    ({"max_attempts": 0}, {"max_attempts": 1}, "max_attempts"),
    ({"max_attempts": 1001}, {"max_attempts": 1000}, "max_attempts"),
    ({"max_attempts": True}, {"max_attempts": 1}, "max_attempts"),
    ({"max_attempts": 2.0}, {"max_attempts": 2}, "max_attempts"),
    ({"initial_backoff_ms": 0}, {"initial_backoff_ms": 1}, "initial_backoff_ms"),
    ({"initial_backoff_ms": 1.5}, {"initial_backoff_ms": 2}, "initial_backoff_ms"),
    ({"max_backoff_ms": -1}, {"initial_backoff_ms": 1, "max_backoff_ms": 1}, "max_backoff_ms"),
    ({"initial_backoff_ms": 2_000, "max_backoff_ms": 1_000},
     {"initial_backoff_ms": 1_000, "max_backoff_ms": 1_000}, "max_backoff_ms"),
    ({"multiplier": 0.99}, {"multiplier": 1}, "multiplier"),
    ({"multiplier": math.nan}, {"multiplier": 1.5}, "multiplier"),
    ({"multiplier": math.inf}, {"multiplier": 1e6}, "multiplier"),
    ({"multiplier": "2"}, {"multiplier": 2}, "multiplier"),
])
def test_a_retry_policy_out_of_range_is_refused_naming_the_field(refused, accepted, named):
    with pytest.raises(InvalidArgument, match=named):
        RetryPolicy(**refused)
    RetryPolicy(**accepted)  # the value at the edge itself is accepted


@pytest.mark.parametrize("fields", [{"consume_mode": "broadcast"}, {"retry": {"max_attempts": 3}},
                                    {"fifo": "yes"}])
def test_a_group_config_with_the_wrong_kinds_of_value_is_refused(fields):
    with pytest.raises(InvalidArgument):
        GroupConfig("g", **fields)


def test_a_group_stored_with_an_invalid_policy_loads_with_the_default_one(tmp_path, caplog):
    url = f"sqlite:///{tmp_path}/metadata.db"
    key = Fernet.generate_key()
    repository = MetadataRepository(url, key)
    repository.create_group(GroupConfig("old", ConsumeMode.BROADCAST, fifo=True))
    repository.close()
    engine = create_engine(url)
    with engine.begin() as conn:  # as a version without validation could have written it
        conn.execute(update(consumer_groups).values(max_attempts=-5))
    engine.dispose()

    repository = MetadataRepository(url, key)
    try:
        with caplog.at_level(logging.WARNING):
            assert repository.list_groups() == [GroupConfig("old", ConsumeMode.BROADCAST, fifo=True)]
    finally:
        repository.close()
    assert "'old'" in caplog.text and "max_attempts" in caplog.text
