"""Paging, sorting and filtering of list routes on the server: ``?limit=&offset=&sort=&q=``.

A route of the table that names the fields ``q`` searches (``Route.search``) is paged: its
handler returns the whole list the caller may see, then ``Page.apply`` keeps the rows whose
search fields hold ``q`` (case-insensitive), sorts them by ``sort`` (a field of the route's row
schema, ``-field`` for descending), and cuts ``limit`` rows from ``offset``. The body stays a
JSON list; the ``X-Total-Count`` header holds the number of rows after filtering. The query is
checked before the handler runs, so a bad value is a 400 that costs nothing.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .errors import HttpProblem

MAX_LIMIT = 1000
MAX_Q_CHARS = 200
MAX_OFFSET_DIGITS = 9
TOTAL_HEADER = "X-Total-Count"
SORTABLE_TYPES = frozenset({"string", "integer", "number", "boolean"})
_DIGITS = re.compile(r"[0-9]+")


@dataclass(frozen=True)
class Page:
    """What the caller asked for: rows matching ``q``, sorted, then ``limit`` from ``offset``."""

    search: tuple[str, ...]
    q: str = ""
    sort: str | None = None
    descending: bool = False
    offset: int = 0
    limit: int | None = None

    def apply(self, rows: Sequence[Mapping[str, Any]]) -> tuple[int, list[Mapping[str, Any]]]:
        """(rows after filtering, the page of them)."""
        kept = [row for row in rows if self._matches(row)] if self.q else list(rows)
        if self.sort is not None:
            field = self.sort
            kept.sort(key=lambda row: _order(row.get(field)), reverse=self.descending)
        end = None if self.limit is None else self.offset + self.limit
        return len(kept), kept[self.offset:end]

    def _matches(self, row: Mapping[str, Any]) -> bool:
        needle = self.q.casefold()
        return any(needle in str(row.get(name) or "").casefold() for name in self.search)


def _order(value: Any) -> tuple[int, Any, Any]:
    """A sort key for any JSON scalar: numbers, then text (case-insensitive), then the rest
    (null last ascending), so rows of mixed or missing values never fail to sort."""
    if isinstance(value, bool | int | float):
        return 0, value, 0
    if isinstance(value, str):
        return 1, value.casefold(), value
    return 2, str(value), 0


def sortable(schema: Mapping[str, Any]) -> tuple[str, ...]:
    """The fields of a row schema (OpenAPI object) that ``sort`` accepts: its scalar ones."""
    properties = schema.get("properties", {})
    return tuple(sorted(name for name, prop in properties.items()
                        if prop.get("type") in SORTABLE_TYPES))


def parse(query: Mapping[str, str], search: tuple[str, ...], fields: tuple[str, ...]) -> Page:
    """The page a request's query asks for; a 400 that says what to send for a bad value.
    ``fields``: what ``sort`` may name."""
    limit = query.get("limit")
    q = query.get("q", "")
    if len(q) > MAX_Q_CHARS:
        raise _bad(f"q is {len(q)} characters long; the filter takes at most {MAX_Q_CHARS}")
    sort, descending = _sort(query.get("sort"), fields)
    return Page(search, q, sort, descending, _number(query, "offset", 0, None) or 0,
                None if limit is None else _number(query, "limit", 1, MAX_LIMIT))


def _number(query: Mapping[str, str], name: str, low: int, high: int | None) -> int | None:
    raw = query.get(name)
    if raw is None:
        return None
    bounds = f"{low}-{high}" if high is not None else f"{low} or more"
    if not _DIGITS.fullmatch(raw) or len(raw) > MAX_OFFSET_DIGITS:
        raise _bad(f"{name}={raw[:40]!r} is not a whole number {bounds}")
    value = int(raw)
    if value < low or (high is not None and value > high):
        raise _bad(f"{name}={value} is out of range: use {bounds}")
    return value


def _sort(raw: str | None, fields: tuple[str, ...]) -> tuple[str | None, bool]:
    if raw is None or raw == "":
        return None, False
    descending = raw.startswith("-")
    name = raw[1:] if descending else raw
    if name not in fields:
        raise _bad(f"sort={raw[:60]!r} names no field of these rows; sort by one of: "
                   f"{', '.join(fields)} (prefix - for descending)")
    return name, descending


def _bad(message: str) -> HttpProblem:
    return HttpProblem(400, "invalid_query", message)
