"""Subscription filters: tag expressions and SQL92 property expressions."""
from __future__ import annotations

import re

import pytest

from core.errors import BadFilter
from core.filters import parse_filter
from core.model import Delivery


def message(tag: str = "", **properties: str) -> Delivery:
    return Delivery("t", 0, 0, "id", b"", tag, (), properties, 0, 0)


@pytest.mark.parametrize("expression, tag, accepted", [
    ("*", "", True), ("", "x", True), ("A", "A", True), ("A", "B", False),
    ("A || B", "B", True), ("A||B", "C", False), (" A ||  B ", "A", True),
])
def test_tag_expressions(expression, tag, accepted):
    assert parse_filter(expression).matches(message(tag)) is accepted


@pytest.mark.parametrize("expression", ["A ||", "|| A", "A || || B", "A && B", "(A)", "A || *"])
def test_malformed_expressions_are_refused_with_advice(expression):
    with pytest.raises(BadFilter, match=re.escape("TagA || TagB")):
        parse_filter(expression)


def test_sql92_filters_read_properties_and_the_tag():
    selector = parse_filter("TAGS IN ('TagA', 'TagB') AND a BETWEEN 0 AND 3", "SQL92")
    assert selector.matches(message("TagA", a="2"))
    assert not selector.matches(message("TagC", a="2"))
    assert not selector.matches(message("TagA", a="4"))
    assert not selector.matches(message("TagA"))


def test_an_unknown_filter_type_is_refused():
    with pytest.raises(BadFilter, match="TAG or SQL92"):
        parse_filter("a", "REGEX")
