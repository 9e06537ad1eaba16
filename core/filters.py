"""Subscription filters: tag expressions (RocketMQ's ``TagA || TagB``; ``*`` or empty for every
message) and SQL92 property expressions (``core.sql_filter``). Both answer ``matches(message)``."""

from __future__ import annotations

from functools import lru_cache
from typing import Protocol

from .errors import BadFilter
from .model import Delivery
from .sql_filter import Evaluate, compile_sql92

MAX_TAG_LENGTH = 255


class Filter(Protocol):
    """A parsed subscription filter."""

    expression: str

    def matches(self, message: Delivery) -> bool:
        """Whether ``message`` passes."""


class TagFilter:
    """A parsed tag expression. ``matches`` is a set lookup."""

    __slots__ = ("tags", "expression")

    def __init__(self, tags: frozenset[str] | None, expression: str) -> None:
        self.tags = tags
        """None means every tag (and messages without one)."""
        self.expression = expression

    def matches(self, message: Delivery) -> bool:
        """Whether ``message``'s tag passes."""
        return self.tags is None or message.tag in self.tags


class SqlFilter:
    """A compiled SQL92 expression over a message's properties and tag (``TAGS``)."""

    __slots__ = ("evaluate", "expression")

    def __init__(self, evaluate: Evaluate, expression: str) -> None:
        self.evaluate = evaluate
        self.expression = expression

    def matches(self, message: Delivery) -> bool:
        """Whether the expression is true for ``message`` (unknown does not pass)."""
        return self.evaluate(message.tag, message.properties) is True


ACCEPT_ALL = TagFilter(None, "*")


@lru_cache(maxsize=1024)
def parse_filter(expression: str, expression_type: str = "TAG") -> Filter:
    """Parse a filter of ``expression_type`` TAG or SQL92; BadFilter for malformed input."""
    kind = (expression_type or "TAG").upper()
    if kind == "SQL92":
        return SqlFilter(compile_sql92(expression), expression)
    if kind != "TAG":
        raise BadFilter(f"unknown filter type {expression_type!r}: use TAG or SQL92")
    text = expression.strip()
    if text in ("", "*"):
        return ACCEPT_ALL
    tags = [part.strip() for part in text.split("||")]
    for tag in tags:
        if not tag or tag == "*" or len(tag) > MAX_TAG_LENGTH or any(c in tag for c in "|&()'\"\t\n"):
            raise BadFilter(f"malformed tag filter {expression!r}: write tags separated by "
                            "'||', such as 'TagA || TagB', or '*' for every message")
    return TagFilter(frozenset(tags), text)
