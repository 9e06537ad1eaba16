"""SQLAlchemy engines for the two supported metadata databases: SQLite and PostgreSQL (psycopg 3).

SQLite connections run in WAL mode (readers never wait for the writer), wait up to
``BUSY_TIMEOUT_S`` for another process's write lock, enforce foreign keys, and begin write
transactions with ``BEGIN IMMEDIATE`` so two writers queue up instead of failing on lock upgrade.

A SQLite database that cannot be opened for writing because its disk refuses (full or failing)
can still be read: ``open_snapshot`` copies it into memory without writing a byte.
"""

from __future__ import annotations

import os
import sqlite3
import uuid
from urllib.parse import quote

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

from core.errors import InvalidArgument

BUSY_TIMEOUT_S = 30.0
WRITE_OPTION = "sluice_write"
"""Execution option marking a write transaction (``BEGIN IMMEDIATE`` on SQLite)."""


def open_engine(url: str) -> Engine:
    """An engine for ``url``, a ``sqlite:///<file>`` or ``postgresql+psycopg://`` URL."""
    parsed = make_url(url)
    if parsed.drivername in ("sqlite", "sqlite+pysqlite"):
        if parsed.database in (None, "", ":memory:"):
            raise InvalidArgument(f"metadata URL {url!r} names no file: use sqlite:///<path>/metadata.db")
        return _sqlite_engine(url)
    if parsed.drivername == "postgresql+psycopg":
        return create_engine(parsed, pool_pre_ping=True)
    raise InvalidArgument(
        f"metadata URL {parsed.render_as_string(hide_password=True)!r} is not supported: "
        "use sqlite:///<path>/metadata.db or postgresql+psycopg://user:password@host/database")


def _sqlite_engine(url: str) -> Engine:
    engine = create_engine(url, connect_args={"timeout": BUSY_TIMEOUT_S})

    @event.listens_for(engine, "connect")
    def _configure(dbapi_connection, _record) -> None:
        # Let SQLAlchemy's "begin" event, not the driver, decide when and how transactions begin.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _begin(conn: Connection) -> None:
        write = conn.get_execution_options().get(WRITE_OPTION, False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")

    return engine


_DISK_ERRORS = (sqlite3.SQLITE_IOERR, sqlite3.SQLITE_FULL, sqlite3.SQLITE_CANTOPEN)


def refused_by_disk(error: DBAPIError) -> bool:
    """Whether a SQLite error says its disk refused: full, failing, or no room for a file."""
    code = getattr(error.orig, "sqlite_errorcode", None)
    return code is not None and code & 0xFF in _DISK_ERRORS


def open_snapshot(url: str) -> Engine:
    """A read-only engine over an in-memory copy of the SQLite database of ``url``, made
    without writing to its disk.

    A writable opener must first grow the database's WAL index (the ``-shm`` file) and may
    have to copy the WAL into the database: both need free space. This reads the WAL into
    memory instead (SQLite's ``readonly_shm``, which needs the ``-shm`` file to exist, not to
    hold anything) and copies the whole database into a private in-memory one, which lives
    until the engine is disposed.
    """
    path = os.path.abspath(make_url(url).database or "")
    os.close(os.open(path + "-shm", os.O_RDONLY | os.O_CREAT, 0o644))
    name = f"file:sluice-metadata-{uuid.uuid4().hex}?mode=memory&cache=shared"
    keeper = sqlite3.connect(name, uri=True, check_same_thread=False)
    try:
        source = sqlite3.connect(f"file:{quote(path)}?mode=ro&readonly_shm=1", uri=True)
        try:
            source.backup(keeper)
        finally:
            source.close()
    except BaseException:
        keeper.close()
        raise
    engine = create_engine("sqlite://", creator=lambda: sqlite3.connect(
        name, uri=True, check_same_thread=False))
    event.listen(engine, "engine_disposed", lambda _engine: keeper.close())
    return engine
