"""Tag filter expressions."""
from __future__ import annotations

import re

import pytest

from core.errors import BadFilter, NotSupported
from core.filters import parse_filter


@pytest.mark.parametrize("expression, tag, accepted", [
    ("*", "", True), ("", "x", True), ("A", "A", True), ("A", "B", False),
    ("A || B", "B", True), ("A||B", "C", False), (" A ||  B ", "A", True),
])
def test_tag_expressions(expression, tag, accepted):
    assert parse_filter(expression).accepts(tag) is accepted


@pytest.mark.parametrize("expression", ["A ||", "|| A", "A || || B", "A && B", "(A)", "A || *"])
def test_malformed_expressions_are_refused_with_advice(expression):
    with pytest.raises(BadFilter, match=re.escape("TagA || TagB")):
        parse_filter(expression)


def test_sql92_is_reported_unsupported():
    with pytest.raises(NotSupported):
        parse_filter("a > 1", "SQL92")
