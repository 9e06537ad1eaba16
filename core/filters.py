"""Tag filter expressions (RocketMQ's ``TagA || TagB``; ``*`` or empty for every message)."""

from __future__ import annotations

from functools import lru_cache

from .errors import BadFilter, NotSupported

MAX_TAG_LENGTH = 255


class TagFilter:
    """A parsed tag expression. ``accepts(tag)`` is a set lookup."""

    __slots__ = ("tags", "expression")

    def __init__(self, tags: frozenset[str] | None, expression: str) -> None:
        self.tags = tags
        """None means every tag (and messages without one)."""
        self.expression = expression

    def accepts(self, tag: str) -> bool:
        """Whether a message with ``tag`` passes."""
        return self.tags is None or tag in self.tags


ACCEPT_ALL = TagFilter(None, "*")


@lru_cache(maxsize=4096)
def parse_filter(expression: str, expression_type: str = "TAG") -> TagFilter:
    """Parse a filter; raise BadFilter for malformed input and NotSupported for SQL92."""
    kind = (expression_type or "TAG").upper()
    if kind == "SQL92":
        raise NotSupported("SQL92 filters are not supported in this version; "
                           "filter by tag (`TagA || TagB`) instead")
    if kind != "TAG":
        raise BadFilter(f"unknown filter type {expression_type!r}: use TAG")
    text = expression.strip()
    if text in ("", "*"):
        return ACCEPT_ALL
    tags = [part.strip() for part in text.split("||")]
    for tag in tags:
        if not tag or tag == "*" or len(tag) > MAX_TAG_LENGTH or any(c in tag for c in "|&()'\"\t\n"):
            raise BadFilter(f"malformed tag filter {expression!r}: write tags separated by "
                            "'||', such as 'TagA || TagB', or '*' for every message")
    return TagFilter(frozenset(tags), text)
