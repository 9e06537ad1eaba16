"""Hypothesis against the subscription filter parsers, which read text from any subscriber:
any string compiles or raises BadFilter, a compiled SQL92 expression evaluates to True, False
or None for any message without raising, and neither parsing nor evaluating costs more than
linear time."""
from __future__ import annotations

import time

from hypothesis import given, settings
from hypothesis import strategies as st

from core.errors import BadFilter
from core.filters import parse_filter
from core.model import Delivery
from core.sql_filter import MAX_NODES, compile_sql92

PIECES = ["a", "b", "TAGS", "NOT", "AND", "OR", "(", ")", "=", "<>", ">", ">=", "<", "<=", "!=",
          "BETWEEN", "IN", "IS", "NULL", "TRUE", "FALSE", "CONTAINS", "STARTSWITH", "ENDSWITH",
          "'x'", "'it''s'", "1", "-2.5", "1e3", ",", "-", "'", "$", "."]
sql_like = st.lists(st.sampled_from(PIECES), max_size=40).map(" ".join)
properties = st.dictionaries(st.sampled_from(["a", "b", "c"]), st.text(max_size=8), max_size=3)


@settings(max_examples=500, deadline=None)
@given(expression=st.one_of(sql_like, st.text(max_size=80)), tag=st.text(max_size=4),
       props=properties)
def test_any_text_compiles_or_is_refused_and_evaluation_never_raises(expression, tag, props):
    try:
        evaluate = compile_sql92(expression)
    except BadFilter:
        return
    assert evaluate(tag, props) in (True, False, None)


@settings(max_examples=300, deadline=None)
@given(expression=st.text(max_size=80), tag=st.text(max_size=4))
def test_any_tag_expression_parses_or_is_refused(expression, tag):
    try:
        selector = parse_filter(expression, "TAG")
    except BadFilter:
        return
    assert selector.matches(Delivery("t", 0, 0, "id", b"", tag, (), {}, 0, 0)) in (True, False)


def _evaluate_seconds(evaluate, properties: dict[str, str]) -> float:
    best = float("inf")
    for _ in range(3):
        began = time.perf_counter()
        for _ in range(20):
            evaluate("", properties)
        best = min(best, time.perf_counter() - began)
    return best


def test_evaluation_cost_is_linear_in_the_property_sizes():
    """A subscriber's worst case, an expression of the most substring tests allowed, against properties
    ten times as long costs about ten times as long (under 30 leaves room for a noisy machine;
    a quadratic matcher shows 100)."""
    clause = "(a CONTAINS 'aaaaaaab' OR b ENDSWITH 'ab' OR a > 1) AND "
    expression = (clause * (MAX_NODES // 7))[:-5]  # seven operations per clause
    evaluate = compile_sql92(expression)
    small = _evaluate_seconds(evaluate, {"a": "a" * 20_000, "b": "b" * 20_000})
    large = _evaluate_seconds(evaluate, {"a": "a" * 200_000, "b": "b" * 200_000})
    assert evaluate("", {"a": "a" * 10, "b": "b"}) is None
    assert large / small < 30, f"20,000 characters: {small:.4f} s, 200,000: {large:.4f} s"
