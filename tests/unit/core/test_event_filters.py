"""Push subscriptions' event filters: the CloudEvents Subscriptions API dialects and CESQL."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.errors import InvalidArgument
from core.event_filters import MAX_DEPTH, MAX_NODES, compile_filters

EVENT = {"specversion": "1.0", "id": "42", "source": "/sensors/t1", "type": "com.example.reading",
         "subject": "sensors/t1", "temp": "21", "flag": "true", "region": "eu-west"}


def matches(filters, attributes=EVENT) -> bool:
    return compile_filters(filters)(attributes)


@pytest.mark.parametrize("spec, expected", [
    ({"exact": {"type": "com.example.reading"}}, True),
    ({"exact": {"type": "com.example"}}, False),
    ({"exact": {"type": "COM.EXAMPLE.READING"}}, False),  # case-sensitive
    ({"exact": {"missing": ""}}, False),  # a missing attribute fails, even against ""
    ({"prefix": {"source": "/sensors/"}}, True),
    ({"prefix": {"source": "/other/"}}, False),
    ({"prefix": {"missing": ""}}, False),
    ({"suffix": {"subject": "/t1"}}, True),
    ({"suffix": {"subject": "/t2"}}, False),
    ({"suffix": {"region": ""}}, True),
    ({"not": {"exact": {"type": "com.example.reading"}}}, False),
    ({"not": {"exact": {"missing": "x"}}}, True),
    ({"all": [{"prefix": {"source": "/sensors/"}}, {"exact": {"region": "eu-west"}}]}, True),
    ({"all": [{"prefix": {"source": "/sensors/"}}, {"exact": {"region": "us"}}]}, False),
    ({"any": [{"exact": {"region": "us"}}, {"suffix": {"type": ".reading"}}]}, True),
    ({"any": [{"exact": {"region": "us"}}, {"suffix": {"type": ".created"}}]}, False),
    ({"all": [{"any": [{"exact": {"region": "us"}}, {"not": {"exact": {"region": "us"}}}]},
              {"not": {"all": [{"exact": {"id": "42"}}, {"exact": {"id": "43"}}]}}]}, True),
])
def test_each_dialect_and_nested_combinations(spec, expected):
    assert matches([spec]) is expected


def test_every_filter_of_the_list_must_match_and_no_filter_passes_everything():
    assert matches([]) is True
    assert matches([{"exact": {"id": "42"}}, {"prefix": {"type": "com."}}]) is True
    assert matches([{"exact": {"id": "42"}}, {"prefix": {"type": "org."}}]) is False


@pytest.mark.parametrize("sql, expected", [
    ("type = 'com.example.reading'", True),
    ('type = "com.example.reading"', True),
    ("type != 'x' AND id <> '43'", True),
    ("temp > 20 AND temp <= 21", True),
    ("temp > -5", True),
    ("temp < 20", False),
    ("flag = TRUE", True),
    ("flag = false", False),
    ("type LIKE 'com.example.%'", True),
    ("type LIKE '%.reading'", True),
    ("type LIKE '%example%'", True),
    ("type LIKE 'com.example.reading'", True),
    ("type NOT LIKE 'com.%'", False),
    ("type NOT LIKE 'org.x'", True),
    ("region LIKE 'eu\\_west'", False),
    ("EXISTS subject AND NOT EXISTS missing", True),
    ("EXISTS missing", False),
    ("region IN ('us', 'eu-west')", True),
    ("region NOT IN ('us', 'eu-west')", False),
    ("(region = 'us' OR region = 'eu-west') AND NOT (id = '1')", True),
    ("type = 'x' or true", True),
    ("missing = 'x'", False),
    ("NOT missing = 'x'", False),  # unknown stays unknown under NOT
    ("missing = 'x' OR id = '42'", True),
    ("region > 3 OR TRUE", True),  # 'eu-west' is no number: unknown, and OR TRUE decides
])
def test_cloudevents_sql(sql, expected):
    assert matches([{"sql": sql}]) is expected


def test_sql_combines_with_the_other_dialects():
    assert matches([{"any": [{"sql": "temp > 30"}, {"not": {"sql": "EXISTS missing"}}]}]) is True


@pytest.mark.parametrize("sql, named", [
    ("LOWER(type) = 'x'", "function LOWER() is not supported"),
    ("length(type) > 3", "function LENGTH() is not supported"),
    ("temp + 1 > 3", "arithmetic (+) is not supported"),
    ("temp - 1 > 3", "arithmetic (-) is not supported"),
    ("temp * 2 > 3", "arithmetic (*) is not supported"),
    ("flag = TRUE XOR id = '1'", "XOR is not supported"),
    ("type LIKE 'a_b'", "LIKE pattern 'a_b' is not supported"),
    ("type LIKE 'a%b'", "LIKE pattern 'a%b' is not supported"),
    ("Type = 'x'", "'Type' is not an attribute name"),
    ("temp > 1.5", "CloudEvents SQL has integers only"),
    ("temp > 9999999999", "larger than a 32-bit integer"),
    ("type = ", "at position 8: expected an attribute name or a value"),
    ("(type = 'x'", "expected ) to close the parenthesis"),
    ("EXISTS 'x'", "EXISTS takes an attribute name"),
    ("type #", "unexpected character '#'"),
    ("temp > 'abc'", "> compares numbers"),
    ("", "CloudEvents SQL filter is empty"),
    ("a = 'x' AND " * 200 + "TRUE", "the limit is 2048"),
])
def test_unsupported_or_malformed_sql_is_refused_naming_the_problem(sql, named):
    with pytest.raises(InvalidArgument) as error:
        compile_filters([{"sql": sql}])
    assert named in str(error.value)
    assert str(error.value).startswith("filters[0].sql: ")


@pytest.mark.parametrize("filters, named", [
    ("type = 'x'", "filters is a list of filter objects"),
    ([{"exact": {"type": "a", "id": "b"}}], "filters[0].exact: exact takes exactly one attribute"),
    ([{"prefix": {}}], "prefix takes exactly one attribute"),
    ([{"suffix": "x"}], "suffix takes exactly one attribute"),
    ([{"exact": {"Type": "x"}}], "'Type' is not an attribute name"),
    ([{"exact": {"type": 5}}], "filters[0].exact.type: the value is a string"),
    ([{"exact": {"type": "x" * 5000}}], "at most 4096 characters"),
    ([{"all": []}], "filters[0].all: all takes a non-empty list"),
    ([{"any": {"exact": {"id": "1"}}}], "any takes a non-empty list"),
    ([{"all": [{"exact": {"id": "1"}}, {"nope": 1}]}], "filters[0].all[1].nope: unknown filter "
                                                      "dialect 'nope'"),
    ([{"exact": {"id": "1"}, "prefix": {"id": "1"}}], "exactly one of exact, prefix"),
    ([{}], "exactly one of"),
    (["exact"], "exactly one of"),
    ([{"sql": 5}], "a CloudEvents SQL filter is a string"),
])
def test_bad_filters_are_refused_naming_where(filters, named):
    with pytest.raises(InvalidArgument) as error:
        compile_filters(filters)
    assert named in str(error.value)


def test_nesting_and_size_are_bounded():
    nested: dict = {"exact": {"id": "42"}}
    for _ in range(MAX_DEPTH - 1):
        nested = {"not": nested}
    assert matches([nested]) is (MAX_DEPTH % 2 == 1)
    with pytest.raises(InvalidArgument, match=f"nest deeper than {MAX_DEPTH}"):
        compile_filters([{"not": nested}])
    wide = [{"exact": {"id": "42"}}] * MAX_NODES
    assert matches(wide) is True
    with pytest.raises(InvalidArgument, match=f"more than {MAX_NODES} filter objects"):
        compile_filters(wide + [{"exact": {"id": "42"}}])


def test_attributes_that_are_not_text_never_match_and_never_raise():
    test = compile_filters([{"any": [{"exact": {"id": "42"}}, {"sql": "temp > 3"}]}])
    assert test({"id": 42, "temp": ["7"], 5: "x"}) is False  # type: ignore[dict-item]
    assert test({"temp": "1e400"}) is True
    assert test({"temp": "nan"}) is False


# --- property tests: a reference evaluator, and hostile input ---

NAMES = st.sampled_from(["type", "source", "id", "subject", "region"])
VALUES = st.text(alphabet="ab/.", max_size=4)
ATTRIBUTES = st.dictionaries(NAMES, VALUES, max_size=5)


def simple_filters(depth: int = 3) -> st.SearchStrategy:
    leaf = st.builds(lambda dialect, name, value: {dialect: {name: value}},
                     st.sampled_from(["exact", "prefix", "suffix"]), NAMES, VALUES)
    return st.recursive(leaf, lambda inner: st.one_of(
        st.builds(lambda items: {"all": items}, st.lists(inner, min_size=1, max_size=3)),
        st.builds(lambda items: {"any": items}, st.lists(inner, min_size=1, max_size=3)),
        st.builds(lambda item: {"not": item}, inner)), max_leaves=12)


def reference(spec: dict, attributes: dict[str, str]) -> bool:
    """The Subscriptions API's meaning, written as plainly as possible."""
    (dialect, argument), = spec.items()
    if dialect == "all":
        return all(reference(item, attributes) for item in argument)
    if dialect == "any":
        return any(reference(item, attributes) for item in argument)
    if dialect == "not":
        return not reference(argument, attributes)
    (name, value), = argument.items()
    if name not in attributes:
        return False
    found = attributes[name]
    return {"exact": found == value, "prefix": found.startswith(value),
            "suffix": found.endswith(value)}[dialect]


@settings(max_examples=300, deadline=None)
@given(st.lists(simple_filters(), max_size=3), ATTRIBUTES)
def test_compiled_filters_agree_with_the_reference(filters, attributes):
    try:
        test = compile_filters(filters)
    except InvalidArgument:  # only when the generated nesting exceeds the bound
        return
    assert test(attributes) is all(reference(spec, attributes) for spec in filters)


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=10)
SQL_WORDS = st.sampled_from(["type", "temp", "=", "<>", ">", "-", "+", "(", ")", "'a'", '"b"',
                             "1", "AND", "OR", "NOT", "LIKE", "'%x'", "IN", ",", "EXISTS",
                             "TRUE", "XOR", "LOWER", "IS", "NULL", "BETWEEN", "\\", "'"])


@settings(max_examples=300, deadline=None)
@given(JSONISH, st.dictionaries(st.text(max_size=5), st.text(max_size=5) | st.integers(),
                                max_size=4))
def test_hostile_filters_raise_only_invalid_argument(filters, attributes):
    try:
        test = compile_filters(filters)  # type: ignore[arg-type]
    except InvalidArgument:
        return
    assert test(attributes) in (True, False)  # type: ignore[arg-type]


@settings(max_examples=500, deadline=None)
@given(st.lists(SQL_WORDS, max_size=12).map(" ".join) | st.text(max_size=40),
       st.dictionaries(NAMES | st.just("temp"), st.text(max_size=6), max_size=5))
def test_hostile_sql_raises_only_invalid_argument_and_evaluates_without_raising(sql, attributes):
    try:
        test = compile_filters([{"sql": sql}])
    except InvalidArgument:
        return
    assert test(attributes) in (True, False)
