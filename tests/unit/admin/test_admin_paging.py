"""``?limit=&offset=&sort=&q=`` of list routes: what a page holds, and a 400 naming the fix for
every bad value; hypothesis over the query, which is untrusted."""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocols.admin.errors import HttpProblem
from protocols.admin.openapi import SCHEMAS
from protocols.admin.paging import MAX_LIMIT, parse, sortable
from protocols.admin.routes import PAGE, ROUTES, TOTAL

ROWS = [{"name": "Beta", "size": 2, "owner": None}, {"name": "alpha", "size": 10, "owner": "x"},
        {"name": "gamma", "size": 2, "owner": "y"}, {"name": "delta-ALP", "size": None}]
FIELDS = ("name", "owner", "size")


def page(**query: str) -> tuple[int, list]:
    return parse(query, ("name", "owner"), FIELDS).apply(ROWS)


def test_q_filters_case_insensitively_on_the_search_fields_and_the_total_counts_the_matches():
    total, rows = page(q="ALP", limit="1")
    assert total == 2 and [r["name"] for r in rows] == ["alpha"]
    assert page(q="x")[0] == 1  # owner is searched too; size is not
    assert page(q="10")[0] == 0


def test_sort_orders_ascending_or_descending_with_missing_values_last():
    assert [r["name"] for r in page(sort="name")[1]] == ["alpha", "Beta", "delta-ALP", "gamma"]
    assert [r["name"] for r in page(sort="-name")[1]] == ["gamma", "delta-ALP", "Beta", "alpha"]
    assert [r["size"] for r in page(sort="size")[1]] == [2, 2, 10, None]


def test_limit_and_offset_cut_a_page_and_without_limit_the_list_is_whole():
    assert [r["name"] for r in page(sort="name", offset="1", limit="2")[1]] == ["Beta", "delta-ALP"]
    assert page(offset="10", limit="5") == (4, [])
    assert page()[1] == ROWS


@pytest.mark.parametrize("query, says", [
    ({"limit": "0"}, "limit=0 is out of range: use 1-1000"),
    ({"limit": str(MAX_LIMIT + 1)}, "out of range: use 1-1000"),
    ({"limit": "ten"}, "not a whole number 1-1000"),
    ({"limit": "+5"}, "not a whole number"),
    ({"offset": "-1"}, "offset='-1' is not a whole number 0 or more"),
    ({"sort": "colour"}, "sort by one of: name, owner, size"),
    ({"sort": "-"}, "sort by one of"),
    ({"q": "x" * 201}, "at most 200"),
])
def test_a_bad_value_is_a_400_that_says_what_to_send(query, says):
    with pytest.raises(HttpProblem) as refused:
        parse(query, ("name",), FIELDS)
    assert refused.value.status == 400 and says in str(refused.value)


def test_every_paged_route_documents_the_paging_query_and_the_total_header():
    paged = [r for r in ROUTES if r.search]
    assert {r.path for r in paged} >= {
        "/clients", "/topics", "/groups", "/users", "/queues", "/exchanges", "/bindings",
        "/vhosts", "/vhost-permissions", "/acl", "/amqp/connections", "/amqp/channels"}
    for route in paged:
        assert route.method == "GET" and route.response.startswith("[")
        assert set(PAGE) <= set(route.query) and TOTAL in route.headers, route.path
        fields = SCHEMAS[route.response.strip("[]")]["properties"]
        assert set(route.search) <= set(fields), route.path
        assert sortable(SCHEMAS[route.response.strip("[]")]), route.path


query_text = st.text(max_size=30)


@given(st.dictionaries(st.sampled_from(["limit", "offset", "sort", "q"]), query_text))
def test_any_query_is_a_page_or_a_400(query):
    try:
        total, rows = parse(query, ("name", "owner"), FIELDS).apply(ROWS)
    except HttpProblem as problem:
        assert problem.status == 400 and problem.code == "invalid_query"
        return
    assert 0 <= len(rows) <= total <= len(ROWS)
    assert len(rows) <= int(query.get("limit", MAX_LIMIT))
