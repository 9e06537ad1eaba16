"""MetadataRepository: topics, groups, subscriptions, users and permissions in SQL.

Messages never live here; this is the small, slowly changing state the broker loads at start and
the admin API edits.

A broker restarted on a full disk must still start: when SQLite cannot be opened for writing
because its disk refuses, the repository serves reads from an in-memory copy and refuses writes
with ``QuotaExceeded``; each write (and ``try_writable``) tries to reopen the file for writing,
so it writes again once space is back, without a restart.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from cryptography.fernet import Fernet, InvalidToken
from sqlalchemy import Connection, Engine, Row, Table, exists, func, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.sql.dml import Insert

from core.errors import (AlreadyExists, GroupNotFound, InvalidArgument, PreconditionFailed,
                         QuotaExceeded, TopicNotFound, UserNotFound)
from core.model import (AclRule, Action, ConsumeMode, GroupConfig, MessageType, Permission,
                        ResourceKind, RetryPolicy, StoredToken, Subscription, TopicConfig, User)

from . import journal, master_key
from .engine import WRITE_OPTION, open_engine, open_snapshot, refused_by_disk
from .passwords import check_password, hash_password, waste_check
from .schema import (LATEST_VERSION, acl_rules, amqp_permissions, amqp_topology, consumer_groups,
                     current_version, migrate, push_subscriptions, subscriptions, topics,
                     user_tokens, users)
from .schema import permissions as permission_table

log = logging.getLogger(__name__)

_MAX_USER_NAME = 127
_ROWS_PER_STATEMENT = 500
"""Names in one ``IN (...)`` of a batch delete: well under every database's bound on bound
parameters."""


class MetadataRepository:
    """Durable metadata in SQLite (default) or PostgreSQL; the schema is migrated on open.

    Thread-safe: every call checks out its own pooled connection and runs in its own
    transaction. Every call blocks on database I/O (user calls also on scrypt), so callers on an
    event loop run them in an executor.
    """

    def __init__(self, url: str, secret_key: bytes) -> None:
        """Open (creating or migrating) the database at ``url``; ``secret_key`` is the master key."""
        try:
            self._fernet = Fernet(secret_key)
        except ValueError:
            raise master_key.BadMasterKey("the master key is not a Fernet key "
                                          "(32 url-safe base64-encoded bytes)") from None
        self._url = url
        self._reopening = threading.Lock()
        self.read_only: str | None = None
        """Why the database is served read-only from memory (its disk refused writes when it
        was opened); None while it is writable."""
        self._write_engine: Engine | None = None
        self._journal: Callable[[bytes], int] | None = None
        self._journal_lock = threading.Lock()
        """Replicated writes and journal applies, one at a time: each runs on the state the
        one before left."""
        try:
            self._engine = self._open_writable()
        except DBAPIError as error:
            if not (make_url(url).get_backend_name() == "sqlite" and refused_by_disk(error)):
                raise
            self._engine = self._open_snapshot(error)
        self._insert = postgresql.insert if self._engine.dialect.name == "postgresql" else sqlite.insert

    def _open_writable(self) -> Engine:
        """Open the database for writing and migrate it; sets the write engine."""
        engine = open_engine(self._url)
        writer = engine.execution_options(**{WRITE_OPTION: True})
        try:
            with writer.begin() as conn:
                migrate(conn, engine.url.render_as_string(hide_password=True))
        except BaseException:
            engine.dispose()
            raise
        self._write_engine = writer
        return engine

    def _open_snapshot(self, error: DBAPIError) -> Engine:
        """Serve reads from memory: the disk refused to open the database for writing."""
        try:
            engine = open_snapshot(self._url)
        except Exception:  # noqa: BLE001 - it cannot be read either: the first error stands
            raise error from None
        with engine.connect() as conn:
            version = current_version(conn)
        if version != LATEST_VERSION:  # migrating needs the disk
            engine.dispose()
            raise error
        self.read_only = (f"the metadata database cannot be written ({error.orig}): its disk is "
                          "full or failing; free space on it, writes resume by themselves")
        log.error("%s; it is served read-only until then", self.read_only)
        return engine

    def try_writable(self) -> bool:
        """Reopen a database served read-only for writing if its disk allows it now; whether it
        is writable. Blocks on database I/O."""
        with self._reopening:
            if self.read_only is None:
                return True
            try:
                engine = self._open_writable()
            except DBAPIError as error:
                if not refused_by_disk(error):
                    raise
                return False
            snapshot, self._engine, self.read_only = self._engine, engine, None
        snapshot.dispose()
        log.warning("the metadata database is writable again")
        return True

    def replicate_through(self, journal: Callable[[bytes], int] | None) -> None:
        """Replicate every write from now on (``journal.py``): ``journal(entry)`` puts it into
        the group's log and returns its position once confirmed (raising if the group refuses
        it). None: write directly again."""
        self._journal = journal

    def apply_journal(self, entry: bytes, at: int) -> bool:
        """Apply a confirmed journal entry at position ``at`` unless it was applied already
        (every node applies the group's entries in log order). Blocks on database I/O."""
        assert self._write_engine is not None
        with self._journal_lock, self._write_engine.begin() as conn:
            return journal.apply(conn, entry, at)

    def dump(self) -> bytes:
        """Every row of the database, its journal position included (``journal.dump``)."""
        with self._journal_lock, self._engine.connect() as conn:
            return journal.dump(conn)

    def restore(self, data: bytes) -> None:
        """Replace the database's rows by a ``dump`` of another node's, in one transaction."""
        assert self._write_engine is not None
        with self._journal_lock, self._write_engine.begin() as conn:
            journal.restore(conn, data)

    def journal_position(self) -> int:
        """The journal position this database has applied (-1: none)."""
        with self._engine.connect() as conn:
            return journal.position(conn)

    @contextlib.contextmanager
    def _writing(self) -> Iterator[Connection]:
        """A write transaction; QuotaExceeded (nothing changed) while the disk refuses writes.
        Replicated (``replicate_through``): the block runs in a transaction that is rolled back,
        its changes go through the journal and are applied once the group confirmed them."""
        if self.read_only is not None and not self.try_writable():
            raise QuotaExceeded(f"{self.read_only}; nothing was changed")
        assert self._write_engine is not None
        if self._journal is not None:
            with self._journal_lock:
                with self._write_engine.connect() as conn, journal.captured(conn) as statements:
                    transaction = conn.begin()
                    try:
                        yield conn
                    finally:
                        transaction.rollback()
                if statements:
                    entry = journal.encode(statements)
                    at = self._journal(entry)
                    with self._write_engine.begin() as conn:
                        journal.apply(conn, entry, at)
            return
        try:
            with self._write_engine.begin() as conn:
                yield conn
        except DBAPIError as error:
            if self._engine.dialect.name == "sqlite" and refused_by_disk(error):
                raise QuotaExceeded(f"the metadata database cannot be written ({error.orig}): its "
                                    "disk is full or failing; nothing was changed") from None
            raise

    @classmethod
    def for_data_dir(cls, data_dir: str, url: str | None = None, key: bytes | None = None) -> MetadataRepository:
        """Open the repository of a data dir: its master key (``key`` instead: a replica group's,
        the same on every node), and SQLite there unless ``url`` is given."""
        os.makedirs(data_dir, exist_ok=True)
        key = key or master_key.load_or_create(os.path.join(data_dir, "master.key"))
        return cls(url or f"sqlite:///{os.path.join(os.path.abspath(data_dir), 'metadata.db')}", key)

    def close(self) -> None:
        """Close every pooled connection."""
        with self._reopening:
            self._engine.dispose()

    def schema_version(self) -> int:
        """The schema version of the open database."""
        with self._engine.connect() as conn:
            return current_version(conn)

    # --- topics ---
    def create_topic(self, config: TopicConfig) -> None:
        """Store a new topic; AlreadyExists if the name is taken."""
        self._insert_new(topics, _topic_row(config), f"topic {config.name!r}")

    def update_topic(self, config: TopicConfig) -> None:
        """Replace a topic's settings; TopicNotFound if it does not exist."""
        if not self._update(topics, config.name, _topic_row(config)):
            raise TopicNotFound(config.name)

    def get_topic(self, name: str) -> TopicConfig | None:
        """The topic's settings, None if it does not exist."""
        row = self._get(topics, name)
        return _topic(row) if row else None

    def list_topics(self) -> list[TopicConfig]:
        """Every topic, by name."""
        return [_topic(row) for row in self._all(topics)]

    def delete_topic(self, name: str) -> bool:
        """Delete a topic's settings; whether it existed."""
        return self._delete(topics, name)

    # --- consumer groups ---
    def create_group(self, config: GroupConfig) -> None:
        """Store a new group; AlreadyExists if the name is taken."""
        self._insert_new(consumer_groups, _group_row(config), f"consumer group {config.name!r}")

    def update_group(self, config: GroupConfig) -> None:
        """Replace a group's settings; GroupNotFound if it does not exist."""
        if not self._update(consumer_groups, config.name, _group_row(config)):
            raise GroupNotFound(config.name)

    def get_group(self, name: str) -> GroupConfig | None:
        """The group's settings, None if it does not exist."""
        row = self._get(consumer_groups, name)
        return _group(row) if row else None

    def list_groups(self) -> list[GroupConfig]:
        """Every group, by name."""
        return [_group(row) for row in self._all(consumer_groups)]

    def delete_group(self, name: str) -> bool:
        """Delete a group and its subscriptions; whether it existed."""
        return self._delete(consumer_groups, name)

    # --- subscriptions ---
    def put_subscription(self, subscription: Subscription) -> None:
        """Store or replace the group's subscription to the topic; GroupNotFound without the group."""
        row = {"group_name": subscription.group, "topic": subscription.topic,
               "expression": subscription.expression,
               "expression_type": subscription.expression_type}
        try:
            with self._writing() as conn:
                conn.execute(self._upsert(subscriptions, row, ("group_name", "topic")))
        except IntegrityError:
            raise GroupNotFound(subscription.group) from None

    def list_subscriptions(self, group: str | None = None) -> list[Subscription]:
        """Every subscription, or the group's, by group and topic."""
        query = select(subscriptions).order_by(subscriptions.c.group_name, subscriptions.c.topic)
        if group is not None:
            query = query.where(subscriptions.c.group_name == group)
        with self._engine.connect() as conn:
            return [Subscription(row.group_name, row.topic, row.expression, row.expression_type)
                    for row in conn.execute(query)]

    def delete_subscription(self, group: str, topic: str) -> bool:
        """Delete the group's subscription to the topic; whether it existed."""
        with self._writing() as conn:
            return conn.execute(subscriptions.delete().where(
                subscriptions.c.group_name == group, subscriptions.c.topic == topic)).rowcount > 0

    # --- users ---
    def create_user(self, name: str, password: str, admin: bool = False) -> User:
        """Store a new user with a hashed password; AlreadyExists if the name is taken."""
        _check_user_name(name)
        self._insert_new(users, {"name": name, "admin": admin, **self._secrets(password)},
                         f"user {name!r}")
        return User(name, admin)

    def set_password(self, name: str, password: str) -> None:
        """Replace the user's password; UserNotFound if the user does not exist."""
        if not self._update(users, name, self._secrets(password)):
            raise _user_not_found(name)

    def delete_user(self, name: str) -> bool:
        """Delete a user, its permissions and its rules; whether it existed."""
        with self._writing() as conn:
            conn.execute(acl_rules.delete().where(acl_rules.c.user_name == name))
            conn.execute(user_tokens.delete().where(user_tokens.c.user_name == name))
            return conn.execute(users.delete().where(users.c.name == name)).rowcount > 0

    def get_user(self, name: str) -> User | None:
        """The user, None if it does not exist."""
        row = self._get(users, name)
        return User(row.name, row.admin) if row else None

    def list_users(self) -> list[User]:
        """Every user, by name."""
        return [User(row.name, row.admin) for row in self._all(users)]

    def verify_password(self, name: str, password: str) -> User | None:
        """The user if ``password`` is theirs, else None; an unknown name takes as long as a wrong password."""
        with self._engine.connect() as conn:
            row = conn.execute(select(users.c.admin, users.c.password_hash)
                               .where(users.c.name == name)).first()
        if row is None:
            waste_check(password)
            return None
        return User(name, row.admin) if check_password(row.password_hash, password) else None

    def signing_secret(self, name: str) -> bytes | None:
        """The user's password as the key of HMAC signatures, None if the user does not exist."""
        with self._engine.connect() as conn:
            token = conn.execute(select(users.c.signing_secret)
                                 .where(users.c.name == name)).scalar_one_or_none()
        if token is None:
            return None
        try:
            return self._fernet.decrypt(token.encode())
        except InvalidToken:
            raise master_key.BadMasterKey(
                f"the signing secret of user {name!r} was encrypted under another master key: "
                "restore the original master.key, or set the user's password again") from None

    # --- API tokens (core.tokens) ---
    def add_token(self, token: StoredToken, most: int) -> None:
        """Store a token's hash; UserNotFound without its user, PreconditionFailed when the
        user has ``most`` tokens already."""
        with self._writing() as conn:
            self._require_user(conn, token.user)
            count = conn.execute(select(func.count()).select_from(user_tokens).where(
                user_tokens.c.user_name == token.user)).scalar_one()
            if count >= most:
                raise PreconditionFailed(
                    f"user {token.user!r} has {count} API tokens, the most one user may have; "
                    f"delete unused ones (`sluice user token delete {token.user} ID`)")
            conn.execute(user_tokens.insert().values(
                id=token.id, user_name=token.user, token_hash=token.token_hash,
                created_ms=token.created_ms, last_used_ms=None))

    def tokens(self, user: str) -> list[StoredToken]:
        """The user's tokens, oldest first; UserNotFound if the user does not exist."""
        with self._engine.begin() as conn:
            self._require_user(conn, user)
            rows = conn.execute(select(user_tokens).where(user_tokens.c.user_name == user)
                                .order_by(user_tokens.c.created_ms, user_tokens.c.id))
            return [_token(row) for row in rows]

    def token(self, token_id: str) -> StoredToken | None:
        """The token with id ``token_id``, None if there is none."""
        with self._engine.connect() as conn:
            row = conn.execute(select(user_tokens).where(user_tokens.c.id == token_id)).first()
        return _token(row) if row else None

    def delete_token(self, user: str, token_id: str) -> bool:
        """Delete one of the user's tokens; whether it existed."""
        with self._writing() as conn:
            return conn.execute(user_tokens.delete().where(
                user_tokens.c.user_name == user, user_tokens.c.id == token_id)).rowcount > 0

    def token_used(self, token_id: str, at_ms: int) -> None:
        """Record that the token was last used at ``at_ms``."""
        with self._writing() as conn:
            conn.execute(user_tokens.update().where(user_tokens.c.id == token_id)
                         .values(last_used_ms=at_ms))

    # --- permissions ---
    def grant(self, permission: Permission) -> None:
        """Store the permission, replacing the actions of the same user, kind and pattern."""
        if not permission.pattern or not permission.actions:
            raise InvalidArgument("a permission needs a non-empty pattern and at least one action")
        row = {"user_name": permission.user, "kind": permission.kind.value,
               "pattern": permission.pattern,
               "actions": ",".join(sorted(a.value for a in permission.actions))}
        try:
            with self._writing() as conn:
                conn.execute(self._upsert(permission_table, row, ("user_name", "kind", "pattern")))
        except IntegrityError:
            raise _user_not_found(permission.user) from None

    def revoke(self, user: str, kind: ResourceKind, pattern: str) -> bool:
        """Delete the user's permission on ``kind``/``pattern``; whether it existed."""
        with self._writing() as conn:
            deleted = conn.execute(permission_table.delete().where(
                permission_table.c.user_name == user, permission_table.c.kind == kind.value,
                permission_table.c.pattern == pattern)).rowcount > 0
            if not deleted:
                self._require_user(conn, user)
        return deleted

    def permissions(self, user: str) -> list[Permission]:
        """The user's permissions, by kind and pattern; UserNotFound if the user does not exist."""
        with self._engine.begin() as conn:
            self._require_user(conn, user)
            rows = conn.execute(select(permission_table).where(permission_table.c.user_name == user)
                                .order_by(permission_table.c.kind, permission_table.c.pattern))
            return [Permission(user, ResourceKind(row.kind), row.pattern,
                               frozenset(Action(a) for a in row.actions.split(",")))
                    for row in rows]

    # --- access-control rules ---
    def put_rule(self, rule: AclRule) -> None:
        """Store the rule, replacing the actions of the same user, pattern and effect;
        UserNotFound unless its user exists or is ``*`` (everyone)."""
        row = {"user_name": rule.user, "pattern": rule.pattern,
               "effect": "allow" if rule.allow else "deny",
               "actions": ",".join(sorted(a.value for a in rule.actions))}
        with self._writing() as conn:
            if rule.user != "*":
                self._require_user(conn, rule.user)
            conn.execute(self._upsert(acl_rules, row, ("user_name", "pattern", "effect")))

    def delete_rule(self, user: str, pattern: str, allow: bool) -> bool:
        """Delete one rule; whether it existed."""
        with self._writing() as conn:
            return conn.execute(acl_rules.delete().where(
                acl_rules.c.user_name == user, acl_rules.c.pattern == pattern,
                acl_rules.c.effect == ("allow" if allow else "deny"))).rowcount > 0

    def rules(self, users_: tuple[str, ...] | None = None) -> list[AclRule]:
        """The rules of the given user names (``*`` for everyone's), or all, by user and pattern."""
        query = select(acl_rules).order_by(acl_rules.c.user_name, acl_rules.c.pattern,
                                           acl_rules.c.effect)
        if users_ is not None:
            query = query.where(acl_rules.c.user_name.in_(users_))
        with self._engine.connect() as conn:
            return [AclRule(row.user_name, row.pattern,
                            frozenset(Action(a) for a in row.actions.split(",")),
                            row.effect == "allow")
                    for row in conn.execute(query)]

    # --- helpers ---
    # --- AMQP topology: durable vhosts, exchanges, queues and bindings ---

    def put_topology(self, vhost: str, kind: str, name: str, spec: str) -> None:
        """Store (or replace) one durable AMQP object; ``spec`` is its settings as JSON."""
        row = {"vhost": vhost, "kind": kind, "name": name, "spec": spec}
        with self._writing() as conn:
            conn.execute(self._upsert(amqp_topology, row, ("vhost", "kind", "name")))

    def delete_topology(self, vhost: str, kind: str | None = None, name: str | None = None) -> int:
        """Delete one object, every object of a kind, or (both None) a whole virtual host;
        how many rows went."""
        query = amqp_topology.delete().where(amqp_topology.c.vhost == vhost)
        if kind is not None:
            query = query.where(amqp_topology.c.kind == kind)
        if name is not None:
            query = query.where(amqp_topology.c.name == name)
        with self._writing() as conn:
            return conn.execute(query).rowcount

    def delete_topology_rows(self, vhost: str, kind: str, names: Sequence[str]) -> int:
        """Delete the objects of one kind named ``names``, in one transaction; how many rows
        went (a queue deleted with thousands of bindings is one write, not thousands)."""
        deleted = 0
        with self._writing() as conn:
            for start in range(0, len(names), _ROWS_PER_STATEMENT):
                chunk = names[start:start + _ROWS_PER_STATEMENT]
                deleted += conn.execute(amqp_topology.delete().where(
                    amqp_topology.c.vhost == vhost, amqp_topology.c.kind == kind,
                    amqp_topology.c.name.in_(chunk))).rowcount
        return deleted

    def topology(self) -> list[tuple[str, str, str, str]]:
        """Every stored (vhost, kind, name, spec), ordered by vhost, kind and name."""
        query = select(amqp_topology).order_by(amqp_topology.c.vhost, amqp_topology.c.kind,
                                               amqp_topology.c.name)
        with self._engine.connect() as conn:
            return [(row.vhost, row.kind, row.name, row.spec) for row in conn.execute(query)]

    # --- AMQP permissions: configure / write / read expressions per user per vhost ---

    def put_vhost_permission(self, user: str, vhost: str, configure: str, write: str,
                             read: str) -> None:
        """Store (or replace) ``user``'s permission on ``vhost``; UserNotFound if no such user."""
        row = {"user_name": user, "vhost": vhost, "configure": configure, "write": write,
               "read": read}
        try:
            with self._writing() as conn:
                self._require_user(conn, user)
                conn.execute(self._upsert(amqp_permissions, row, ("user_name", "vhost")))
        except IntegrityError:
            raise _user_not_found(user) from None

    def delete_vhost_permissions(self, user: str | None = None, vhost: str | None = None) -> int:
        """Delete the permissions of a user, of a vhost, or of one user on one vhost; how many
        rows went."""
        query = amqp_permissions.delete()
        if user is not None:
            query = query.where(amqp_permissions.c.user_name == user)
        if vhost is not None:
            query = query.where(amqp_permissions.c.vhost == vhost)
        with self._writing() as conn:
            return conn.execute(query).rowcount

    def vhost_permissions(self) -> list[tuple[str, str, str, str, str]]:
        """Every (user, vhost, configure, write, read), by user and vhost."""
        query = select(amqp_permissions).order_by(amqp_permissions.c.user_name,
                                                  amqp_permissions.c.vhost)
        with self._engine.connect() as conn:
            return [(row.user_name, row.vhost, row.configure, row.write, row.read)
                    for row in conn.execute(query)]

    # --- push subscriptions: settings as JSON, the signing secret encrypted ---

    def create_push_subscription(self, name: str, owner: str, spec: str, secret: str) -> None:
        """Store a new push subscription; AlreadyExists if the name is taken."""
        row = {"name": name, "owner": owner, "spec": spec,
               "secret": self._fernet.encrypt(secret.encode()).decode()}
        self._insert_new(push_subscriptions, row, f"push subscription {name!r}")

    def update_push_subscription(self, name: str, spec: str) -> bool:
        """Replace a push subscription's settings; whether it exists."""
        return self._update(push_subscriptions, name, {"spec": spec})

    def delete_push_subscription(self, name: str) -> bool:
        """Delete a push subscription; whether it existed."""
        return self._delete(push_subscriptions, name)

    def push_subscriptions(self) -> list[tuple[str, str]]:
        """Every push subscription as (spec, signing secret), by name."""
        found = []
        for row in self._all(push_subscriptions):
            try:
                secret = self._fernet.decrypt(row.secret.encode()).decode()
            except InvalidToken:
                raise master_key.BadMasterKey(
                    f"the signing secret of push subscription {row.name!r} was encrypted under "
                    "another master key: restore the original master.key, or delete and "
                    "re-create the subscription") from None
            found.append((row.spec, secret))
        return found

    def _secrets(self, password: str) -> dict[str, str]:
        if not password:
            raise InvalidArgument("the password is empty: choose a non-empty password")
        return {"password_hash": hash_password(password),
                "signing_secret": self._fernet.encrypt(password.encode()).decode()}

    def _require_user(self, conn: Connection, name: str) -> None:
        if not conn.execute(select(exists().where(users.c.name == name))).scalar_one():
            raise _user_not_found(name)

    def _upsert(self, table: Table, row: Mapping[str, Any], keys: tuple[str, ...]) -> Insert:
        insert = self._insert(table).values(**row)
        return insert.on_conflict_do_update(
            index_elements=[table.c[k] for k in keys],
            set_={k: insert.excluded[k] for k in row if k not in keys})

    def _insert_new(self, table: Table, row: Mapping[str, Any], what: str) -> None:
        # RETURNING, not rowcount: psycopg reports no rowcount for INSERT ... ON CONFLICT DO NOTHING.
        statement = self._insert(table).values(**row).on_conflict_do_nothing().returning(table.c.name)
        with self._writing() as conn:
            inserted = conn.execute(statement).first()
        if inserted is None:
            raise AlreadyExists(f"{what} exists already; update or delete it, or choose another name")

    def _update(self, table: Table, name: str, values: Mapping[str, Any]) -> bool:
        with self._writing() as conn:
            return conn.execute(table.update().where(table.c.name == name).values(**values)).rowcount > 0

    def _get(self, table: Table, name: str) -> Row | None:
        with self._engine.connect() as conn:
            return conn.execute(select(table).where(table.c.name == name)).first()

    def _all(self, table: Table) -> list[Row]:
        with self._engine.connect() as conn:
            return list(conn.execute(select(table).order_by(table.c.name)))

    def _delete(self, table: Table, name: str) -> bool:
        with self._writing() as conn:
            return conn.execute(table.delete().where(table.c.name == name)).rowcount > 0


def _check_user_name(name: str) -> None:
    if (not name or len(name) > _MAX_USER_NAME or name.startswith("$") or ":" in name
            or "*" in name or not name.isprintable() or any(c.isspace() for c in name)):
        raise InvalidArgument(
            f"user name {name!r} is invalid: use 1-{_MAX_USER_NAME} printable characters without "
            "spaces, ':' or '*', not starting with '$'")


def _user_not_found(name: str) -> UserNotFound:
    return UserNotFound(f"user {name!r} does not exist; check the name or create the user "
                        f"(`sluice user create {name}`)")


def _token(row: Row) -> StoredToken:
    return StoredToken(row.id, row.user_name, row.token_hash, row.created_ms, row.last_used_ms)


def _topic_row(config: TopicConfig) -> dict[str, Any]:
    return {"name": config.name, "queue_count": config.queue_count,
            "message_type": config.message_type.value, "retention_ms": config.retention_ms,
            "compacted": config.compacted, "tier_retention_ms": config.tier_retention_ms,
            "body_schema": config.body_schema}


def _topic(row: Row) -> TopicConfig:
    return TopicConfig(row.name, row.queue_count, MessageType(row.message_type), row.retention_ms,
                       row.compacted, row.tier_retention_ms, row.body_schema, stored=True)


def _group_row(config: GroupConfig) -> dict[str, Any]:
    retry = config.retry
    return {"name": config.name, "consume_mode": config.consume_mode.value, "fifo": config.fifo,
            "max_attempts": retry.max_attempts, "initial_backoff_ms": retry.initial_backoff_ms,
            "max_backoff_ms": retry.max_backoff_ms, "multiplier": retry.multiplier}


def _group(row: Row) -> GroupConfig:
    try:
        retry = RetryPolicy(row.max_attempts, row.initial_backoff_ms, row.max_backoff_ms,
                            row.multiplier)
    except InvalidArgument as error:
        # Stored before retry policies were validated: serve the group with the default policy
        # rather than refuse to start.
        log.warning("group %r has an invalid stored retry policy (%s); serving it with the "
                    "default policy: delete and re-create the group to choose another", row.name,
                    error)
        retry = RetryPolicy()
    return GroupConfig(row.name, ConsumeMode(row.consume_mode), retry, row.fifo, stored=True)
