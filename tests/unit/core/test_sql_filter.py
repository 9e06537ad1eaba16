"""SQL92 property filters: the RocketMQ syntax, three-valued logic and bounded cost."""
from __future__ import annotations

import pytest

from core.errors import BadFilter
from core.sql_filter import MAX_DEPTH, MAX_EXPRESSION_LENGTH, MAX_NODES, compile_sql92

PROPERTIES = {"a": "10", "b": "abc", "price": "3.5", "flag": "true", "neg": "-2", "text": "x'y"}


def evaluate(expression: str, tag: str = "TagA", properties: dict[str, str] = PROPERTIES):
    return compile_sql92(expression)(tag, properties)


@pytest.mark.parametrize("expression, expected", [
    ("a > 5", True), ("a >= 10", True), ("a < 10", False), ("a <= 10.0", True),
    ("a = 10", True), ("a <> 10", False), ("a != 11", True), ("price > 3.25", True),
    ("neg < -1", True), ("a > 1e1", False), ("a BETWEEN 10 AND 20", True),
    ("a NOT BETWEEN 11 AND 20", True), ("price BETWEEN 4 AND 5", False),
    ("b = 'abc'", True), ("b <> 'abd'", True), ("text = 'x''y'", True),
    ("b IN ('x', 'abc')", True), ("b NOT IN ('x', 'abc')", False),
    ("TAGS = 'TagA'", True), ("TAGS IN ('TagB')", False), ("TAGS IS NOT NULL", True),
    ("missing IS NULL", True), ("a IS NULL", False), ("a IS NOT NULL", True),
    ("flag = TRUE", True), ("flag = FALSE", False), ("flag <> TRUE", False),
    ("b CONTAINS 'bc'", True), ("b STARTSWITH 'ab'", True), ("b ENDSWITH 'ab'", False),
    ("b NOT CONTAINS 'z'", True), ("b NOT STARTSWITH 'a'", False),
    ("a > 5 AND b = 'abc'", True), ("a > 50 OR b = 'abc'", True), ("NOT a > 50", True),
    ("(a > 50 OR b = 'x') AND TRUE", False), ("TRUE", True), ("FALSE", False),
    ("a > 5 and b = 'abc' or not flag = true", True),
])
def test_rocketmq_sql92_syntax(expression, expected):
    assert evaluate(expression) is expected


@pytest.mark.parametrize("expression", [
    "missing > 1", "missing = 'x'", "b > 1", "missing IN ('a')", "NOT missing > 1",
    "missing CONTAINS 'a'", "a = NULL", "missing > 1 AND a > 5", "missing > 1 OR a > 50",
])
def test_a_missing_or_unconvertible_property_makes_the_result_unknown(expression):
    assert evaluate(expression) is None


def test_unknown_is_absorbed_by_a_decisive_operand():
    assert evaluate("missing > 1 AND a > 50") is False
    assert evaluate("missing > 1 OR a > 5") is True


def test_a_message_without_a_tag_has_a_null_tags():
    assert evaluate("TAGS IS NULL", tag="") is True


@pytest.mark.parametrize("expression, position", [
    ("a >", 4), ("a > 5 AND", 10), ("(a > 5", 7), ("a >> 5", 4), ("a ~ 1", 3),
    ("a IN (1, 2)", 7), ("a BETWEEN 1 2", 13), ("a IS 5", 6), ("a NOT = 5", 7),
    ("a > 5 b = 1", 7), ("a", 2), ("a CONTAINS 5", 12), ("'abc", 1),
])
def test_a_malformed_expression_names_the_position(expression, position):
    with pytest.raises(BadFilter, match=f"at position {position}:"):
        compile_sql92(expression)


@pytest.mark.parametrize("expression", ["b > 'a'", "flag > TRUE"])
def test_ordering_is_for_numbers_only(expression):
    with pytest.raises(BadFilter, match="compare"):
        compile_sql92(expression)


def test_cost_is_bounded():
    with pytest.raises(BadFilter, match="characters long"):
        compile_sql92("a = 1 OR " * (MAX_EXPRESSION_LENGTH // 9) + "a = 1")
    with pytest.raises(BadFilter, match="operations"):
        compile_sql92(" OR ".join(["a = 1"] * (MAX_NODES + 1)))
    with pytest.raises(BadFilter, match="nests deeper"):
        compile_sql92("(" * (MAX_DEPTH + 1) + "a = 1" + ")" * (MAX_DEPTH + 1))
    with pytest.raises(BadFilter, match="nests deeper"):
        compile_sql92("NOT " * (MAX_DEPTH + 1) + "a = 1")
    assert evaluate("(" * MAX_DEPTH + "a = 10" + ")" * MAX_DEPTH) is True


def test_an_empty_expression_is_refused():
    with pytest.raises(BadFilter, match="empty"):
        compile_sql92("  ")
