"""Push subscriptions' transforms: JMESPath over the event's JSON data, with bounded cost."""
from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.errors import InvalidArgument, SluiceError
from core.event_transform import (MAX_DATA_BYTES, MAX_EXPRESSION_LENGTH, MAX_RESULT_BYTES,
                                  TransformError, compile_transform)

READING = json.dumps({"id": "d1", "site": {"name": "north"},
                      "readings": [{"value": 21.5, "unit": "C"}, {"value": 19, "unit": "C"}]}).encode()


@pytest.mark.parametrize("expression, expected", [
    ("id", "d1"),
    ("site.name", "north"),
    ("{id: id, temp: readings[0].value}", {"id": "d1", "temp": 21.5}),
    ("readings[*].value", [21.5, 19]),
    ("readings[?value > `20`].value", [21.5]),
    ("length(readings)", 2),
    ("missing", None),
    ("@", json.loads(READING)),
])
def test_selection_and_reshaping(expression, expected):
    assert json.loads(compile_transform(expression)(READING)) == expected


def test_the_result_is_compact_json_and_text_stays_unescaped():
    out = compile_transform("{name: name, n: n}")('{"name": "Zürich", "n": 1}'.encode())
    assert out == '{"name":"Zürich","n":1}'.encode()


@pytest.mark.parametrize("expression, named", [
    ("readings[", "not a JMESPath expression"),
    ("foo bar", "not a JMESPath expression"),
    ("", "a transform is a JMESPath expression"),
    ("a" * (MAX_EXPRESSION_LENGTH + 1), f"the limit is {MAX_EXPRESSION_LENGTH}"),
    ("(" * 900 + "a" + ")" * 90, "not a JMESPath expression"),
])
def test_bad_expressions_are_refused_at_compile_time(expression, named):
    with pytest.raises(InvalidArgument, match=named.replace("[", r"\[")):
        compile_transform(expression)


@pytest.mark.parametrize("data, named", [
    (b"not json", "the data is not JSON"),
    (b"\xff\xfe", "the data is not JSON"),
    (b"NaN", "the data is not JSON"),
    (b"[" * 100_000, "the data is not JSON"),
    (b" " * (MAX_DATA_BYTES + 1), f"reads at most {MAX_DATA_BYTES}"),
])
def test_data_that_is_not_json_or_too_large_raises_transform_error(data, named):
    with pytest.raises(TransformError, match=named):
        compile_transform("id")(data)


def test_transform_error_is_not_a_request_error():
    assert issubclass(TransformError, SluiceError) and not issubclass(TransformError, InvalidArgument)


def test_type_errors_at_run_time_are_transform_errors():
    with pytest.raises(TransformError, match="failed on this data"):
        compile_transform("length(id)")(b'{"id": 5}')


def test_doubling_expressions_stop_at_the_budget_instead_of_growing_without_bound():
    with pytest.raises(TransformError, match="simplify the expression"):
        compile_transform("@" + ".[@, @]" * 100)(b'"x"')
    with pytest.raises(TransformError, match="simplify the expression"):
        compile_transform("[@, @][*]" * 60)(b'"x"')


def test_a_result_larger_than_the_cap_is_refused():
    big = json.dumps(["x" * 1000] * (MAX_RESULT_BYTES // 1000 // 2)).encode()
    with pytest.raises(TransformError):
        compile_transform("[@, @, @]")(big)


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=20)
WORDS = st.sampled_from(["a", "b", "@", ".", "[*]", "[0]", "[?a > `1`]", "{x: a}", "[@, @]",
                         "length(@)", "sort(@)", "to_string(@)", "|", "&", "(", ")", "`1`",
                         "'s'", "*", "||", "!", "join(',', @)", "max_by(@, &a)", "[]", "[-1:]"])


@settings(max_examples=400, deadline=None)
@given(st.lists(WORDS, min_size=1, max_size=10).map("".join) | st.text(min_size=1, max_size=30),
       JSONISH.map(lambda value: json.dumps(value).encode()) | st.binary(max_size=30))
def test_hostile_expressions_and_data_raise_only_invalid_argument_or_transform_error(expression, data):
    try:
        transform = compile_transform(expression)
    except InvalidArgument:
        return
    try:
        out = transform(data)
    except TransformError:
        return
    json.loads(out)
