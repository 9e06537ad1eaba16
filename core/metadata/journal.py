"""The metadata database replicated through the commit log: what a write changed, as statements.

On a node of a replica group every metadata write is first run in a transaction that is rolled
back, with its data-changing statements (INSERT, UPDATE, DELETE and their parameters) captured;
the statements go into the log as one journal entry, and only once the group has confirmed it
are they applied, in order, on the leader and on every follower alike (each node's database
records the journal position it has applied, in the same transaction). So no node's database
holds a change the group's log does not, and a node that leads next has every user, permission
and definition the old leader had. The dialect is the same on every node of a group.
"""
from __future__ import annotations

import base64
import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Connection, event, select

from .schema import journal_position, metadata, schema_version

JOURNAL_TOPIC = "%SYS%metadata"
"""The internal topic (one queue) holding journal entries."""
_CHANGES = ("INSERT", "UPDATE", "DELETE", "REPLACE")

Statement = tuple[str, Any, bool]
"""(SQL as the driver takes it, its parameters, whether it runs once per parameter set)."""


@contextmanager
def captured(conn: Connection) -> Iterator[list[Statement]]:
    """Record the data-changing statements ``conn`` executes inside the block."""
    found: list[Statement] = []

    def record(_conn, _cursor, statement: str, parameters: Any, _context, executemany: bool) -> None:
        if statement.lstrip().upper().startswith(_CHANGES):
            found.append((statement, parameters, executemany))
    event.listen(conn, "before_cursor_execute", record)
    try:
        yield found
    finally:
        event.remove(conn, "before_cursor_execute", record)


def encode(statements: Sequence[Statement]) -> bytes:
    return json.dumps([[sql, _plain(parameters), many] for sql, parameters, many in statements],
                      separators=(",", ":")).encode()


def decode(entry: bytes) -> list[Statement]:
    return [(sql, _typed(parameters), many) for sql, parameters, many in json.loads(entry)]


def apply(conn: Connection, entry: bytes, at: int) -> bool:
    """Run a journal entry's statements in ``conn``'s transaction and record its position
    ``at``; False (nothing run) if the database has applied it already."""
    if position(conn) >= at:
        return False
    for sql, parameters, many in decode(entry):
        if many:
            conn.exec_driver_sql(sql, [tuple(p) if isinstance(p, list) else p for p in parameters])
        else:
            conn.exec_driver_sql(sql, tuple(parameters) if isinstance(parameters, list) else parameters)
    set_position(conn, at)
    return True


def dump(conn: Connection) -> bytes:
    """Every row of every table but the schema's version, as JSON: what a node whose log begins
    past the journal's first entries starts from (``restore``), its position included."""
    tables = [table for table in metadata.sorted_tables if table is not schema_version]
    return json.dumps({table.name: [_plain(dict(row._mapping)) for row in conn.execute(select(table))]
                       for table in tables}, separators=(",", ":")).encode()


def restore(conn: Connection, data: bytes) -> None:
    """Replace every row of every table ``dump`` covers by those of ``data``, in ``conn``'s
    transaction."""
    rows = json.loads(data)
    tables = [table for table in metadata.sorted_tables if table is not schema_version]
    for table in reversed(tables):
        conn.execute(table.delete())
    for table in tables:
        if rows.get(table.name):
            conn.execute(table.insert(), [_typed(row) for row in rows[table.name]])


def position(conn: Connection) -> int:
    """The journal position this database has applied (-1: none)."""
    found = conn.execute(select(journal_position.c.queue_offset)).scalar()
    return -1 if found is None else found


def set_position(conn: Connection, at: int) -> None:
    if conn.execute(journal_position.update().values(queue_offset=at)).rowcount == 0:
        conn.execute(journal_position.insert().values(id=0, queue_offset=at))


def _plain(value: Any) -> Any:
    """Parameters as JSON: bytes tagged, tuples as lists."""
    if isinstance(value, bytes | bytearray | memoryview):
        return {"$b": base64.b64encode(bytes(value)).decode()}
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    return value


def _typed(value: Any) -> Any:
    if isinstance(value, dict):
        if set(value) == {"$b"}:
            return base64.b64decode(value["$b"])
        return {key: _typed(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_typed(item) for item in value]
    return value
