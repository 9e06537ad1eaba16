"""SQLAlchemy engines for the two supported metadata databases: SQLite and PostgreSQL (psycopg 3).

SQLite connections run in WAL mode (readers never wait for the writer), wait up to
``BUSY_TIMEOUT_S`` for another process's write lock, enforce foreign keys, and begin write
transactions with ``BEGIN IMMEDIATE`` so two writers queue up instead of failing on lock upgrade.
"""

from __future__ import annotations

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import make_url

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
