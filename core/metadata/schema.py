"""The metadata tables and the ordered migrations that create and evolve them.

``MIGRATIONS[i]`` brings a database from schema version ``i`` to ``i + 1``; ``schema_version``
keeps one row per applied migration. A released migration never changes: when version 2 alters
a table, version 1 keeps creating the version-1 shape (copy its definitions into ``_v1`` then).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from sqlalchemy import (BigInteger, Boolean, Column, Connection, Double, ForeignKey, Integer,
                        MetaData, String, Table, func, select, text)

from core.errors import SluiceError

metadata = MetaData()

schema_version = Table(
    "schema_version", metadata,
    Column("version", Integer, primary_key=True, autoincrement=False),
    Column("applied_ms", BigInteger, nullable=False),
)

def _topic_columns() -> list[Column]:
    """The topics table as version 1 made it."""
    return [Column("name", String(127), primary_key=True),
            Column("queue_count", Integer, nullable=False),
            Column("message_type", String(16), nullable=False),
            Column("retention_ms", BigInteger),
            Column("compacted", Boolean, nullable=False)]


_TIER_COLUMNS = (("tier_retention_ms", BigInteger()), ("body_schema", String()))
"""Version 8: a topic's tier retention (ms, NULL: forever) and body schema (JSON Schema text)."""

topics = Table("topics", metadata, *_topic_columns(),
               *(Column(name, kind) for name, kind in _TIER_COLUMNS))
_topics_v1 = Table("topics", MetaData(), *_topic_columns())

consumer_groups = Table(
    "consumer_groups", metadata,
    Column("name", String(127), primary_key=True),
    Column("consume_mode", String(16), nullable=False),
    Column("fifo", Boolean, nullable=False),
    Column("max_attempts", Integer, nullable=False),
    Column("initial_backoff_ms", BigInteger, nullable=False),
    Column("max_backoff_ms", BigInteger, nullable=False),
    Column("multiplier", Double, nullable=False),
)

subscriptions = Table(
    "subscriptions", metadata,
    Column("group_name", String(127), ForeignKey(consumer_groups.c.name, ondelete="CASCADE"),
           primary_key=True),
    Column("topic", String(127), primary_key=True),
    Column("expression", String, nullable=False),
    Column("expression_type", String(16), nullable=False),
)

users = Table(
    "users", metadata,
    Column("name", String(127), primary_key=True),
    Column("admin", Boolean, nullable=False),
    Column("password_hash", String, nullable=False),
    # The password encrypted under the master key (Fernet): HMAC signatures need it back.
    Column("signing_secret", String, nullable=False),
)

permissions = Table(
    "permissions", metadata,
    Column("user_name", String(127), ForeignKey(users.c.name, ondelete="CASCADE"), primary_key=True),
    Column("kind", String(16), primary_key=True),
    Column("pattern", String(255), primary_key=True),
    Column("actions", String(64), nullable=False),  # comma-separated Action values, sorted
)


acl_rules = Table(
    "acl_rules", metadata,
    # "*" for rules that apply to every user, so no foreign key: deleting a user deletes its
    # rules in the repository.
    Column("user_name", String(127), primary_key=True),
    Column("pattern", String(1024), primary_key=True),
    Column("effect", String(8), primary_key=True),  # "allow" or "deny"
    Column("actions", String(64), nullable=False),  # comma-separated Action values, sorted
)


amqp_topology = Table(
    "amqp_topology", metadata,
    # One row per durable AMQP object of a virtual host: kind "vhost" (name ""), "exchange",
    # "queue" or "binding" (name: the binding's canonical key). ``spec`` is the object's
    # declared settings as JSON, written and read by core.
    Column("vhost", String(255), primary_key=True),
    Column("kind", String(16), primary_key=True),
    Column("name", String(1024), primary_key=True),
    Column("spec", String, nullable=False),
)


amqp_permissions = Table(
    "amqp_permissions", metadata,
    # RabbitMQ's permissions: per user per virtual host, three regular expressions matched
    # against exchange and queue names ('' matches nothing).
    Column("user_name", String(127), ForeignKey(users.c.name, ondelete="CASCADE"),
           primary_key=True),
    Column("vhost", String(255), primary_key=True),
    Column("configure", String(1024), nullable=False),
    Column("write", String(1024), nullable=False),
    Column("read", String(1024), nullable=False),
)


journal_position = Table(
    "journal_position", metadata,
    # On a node of a replica group: the queue offset of the last journal entry applied
    # (``journal.py``); one row.
    Column("id", Integer, primary_key=True, autoincrement=False),
    Column("queue_offset", BigInteger, nullable=False),
)


user_tokens = Table(
    "user_tokens", metadata,
    # API tokens (``core.tokens``): only the SHA-256 of each token is kept; deleting the user
    # deletes its tokens.
    Column("id", String(32), primary_key=True),
    Column("user_name", String(127), ForeignKey(users.c.name, ondelete="CASCADE"),
           nullable=False, index=True),
    Column("token_hash", String(64), nullable=False),  # hex SHA-256 of the whole token
    Column("created_ms", BigInteger, nullable=False),
    Column("last_used_ms", BigInteger),
)


push_subscriptions = Table(
    "push_subscriptions", metadata,
    # ``spec`` is the subscription's settings as JSON (core.push_model), written and read by
    # core; ``secret`` its signing secret encrypted under the master key (Fernet).
    Column("name", String(127), primary_key=True),
    Column("owner", String(127), nullable=False),
    Column("spec", String, nullable=False),
    Column("secret", String, nullable=False),
)


def _v1(conn: Connection) -> None:
    _topics_v1.create(conn)
    metadata.create_all(conn, tables=[consumer_groups, subscriptions, users, permissions])


def _v2(conn: Connection) -> None:
    metadata.create_all(conn, tables=[acl_rules])


def _v3(conn: Connection) -> None:
    metadata.create_all(conn, tables=[amqp_topology])


def _v4(conn: Connection) -> None:
    metadata.create_all(conn, tables=[amqp_permissions])


def _v5(conn: Connection) -> None:
    metadata.create_all(conn, tables=[journal_position])


def _v6(conn: Connection) -> None:
    metadata.create_all(conn, tables=[user_tokens])


def _v7(conn: Connection) -> None:
    metadata.create_all(conn, tables=[push_subscriptions])


def _v8(conn: Connection) -> None:
    for name, kind in _TIER_COLUMNS:
        conn.execute(text(f"ALTER TABLE topics ADD COLUMN {name} "
                          f"{kind.compile(dialect=conn.dialect)}"))


MIGRATIONS: tuple[Callable[[Connection], None], ...] = (_v1, _v2, _v3, _v4, _v5, _v6, _v7, _v8)
LATEST_VERSION = len(MIGRATIONS)

_PG_MIGRATION_LOCK = 0x51CE_0001
"""pg_advisory_xact_lock key: brokers opening one database at once migrate it one at a time."""


class SchemaTooNew(SluiceError):
    """The database was written by a newer Sluice than this one."""


def current_version(conn: Connection) -> int:
    """The highest applied migration, 0 for an empty database."""
    return conn.execute(select(func.coalesce(func.max(schema_version.c.version), 0))).scalar_one()


def migrate(conn: Connection, where: str) -> int:
    """Apply the missing migrations inside ``conn``'s transaction; return the schema version.

    The caller holds the database's write lock (SQLite ``BEGIN IMMEDIATE``); on PostgreSQL an
    advisory lock serializes concurrent openers. ``where`` names the database in errors.
    """
    if conn.dialect.name == "postgresql":
        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_MIGRATION_LOCK})
    metadata.create_all(conn, tables=[schema_version])
    version = current_version(conn)
    if version > LATEST_VERSION:
        raise SchemaTooNew(
            f"the metadata database {where} has schema version {version}, but this Sluice knows "
            f"versions up to {LATEST_VERSION} only: upgrade Sluice to open it")
    for number in range(version + 1, LATEST_VERSION + 1):
        MIGRATIONS[number - 1](conn)
        conn.execute(schema_version.insert().values(version=number, applied_ms=int(time.time() * 1000)))
    return LATEST_VERSION
