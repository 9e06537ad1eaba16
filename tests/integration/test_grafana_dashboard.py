"""docs/grafana/sluice.json against a real broker's /metrics: every PromQL expression of the
dashboard (panel queries and template variables) names only series the broker exports, and the
dashboard takes its Prometheus as the ``DS_PROMETHEUS`` input, as an exported dashboard does."""
from __future__ import annotations

import json
import re
from pathlib import Path

from tests.integration.test_metrics_reference import busy_broker, scrape  # noqa: F401 - the fixture

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana" / "sluice.json"
DATASOURCE = "${DS_PROMETHEUS}"
_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or",
             "unless", "offset", "inf", "nan"}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: identifiers that are not functions,
    aggregations, keywords, label names of ``by``/``without``/``on`` clauses, label matchers,
    strings or durations."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)                   # strings
    text = re.sub(r"\{[^}]*\}", " ", text)                             # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)                            # ranges, subqueries
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        name, after = match.group(0), text[match.end():].lstrip()
        if after.startswith("(") or name.lower() in _KEYWORDS or name.startswith("$"):
            continue
        if match.start() > 0 and text[match.start() - 1] == "$":
            continue  # $__rate_interval, $job
        names.add(name)
    return names


def test_metric_names_are_read_from_promql_as_written():
    assert metric_names('sum by (protocol) (rate(a_total{job=~"$job"}[$__rate_interval]))') == {"a_total"}
    assert metric_names("topk(10, max without (queue) (b) / on (x) c)") == {"b", "c"}


def queries(dashboard: dict) -> list[tuple[str, str]]:
    """(where, PromQL) of every panel target and query variable."""
    found = [(f"panel {panel['title']!r}", target["expr"])
             for panel in dashboard["panels"] for target in panel.get("targets", [])]
    for variable in dashboard["templating"]["list"]:
        query = variable["query"]["query"] if isinstance(variable["query"], dict) else variable["query"]
        inner = re.fullmatch(r"label_values\((.*),\s*\w+\)", query)
        found.append((f"variable {variable['name']!r}", inner.group(1) if inner else query))
    return found


def test_the_dashboard_takes_its_prometheus_as_an_input():
    dashboard = json.loads(DASHBOARD.read_text())
    [source] = dashboard["__inputs"]
    assert source["name"] == "DS_PROMETHEUS" and source["pluginId"] == "prometheus"
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == DATASOURCE, panel["title"]
        assert all(target["datasource"]["uid"] == DATASOURCE for target in panel["targets"]), panel["title"]
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids are unique"


def test_every_query_names_only_series_the_broker_exports(busy_broker):  # noqa: F811
    text = scrape(busy_broker.admin)
    exported = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")}
    exported |= {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}
    dashboard = json.loads(DASHBOARD.read_text())
    named: set[str] = set()
    for where, expr in queries(dashboard):
        names = metric_names(expr)
        assert names, f"{where}: no metric in {expr!r}"
        unknown = sorted(names - exported)
        assert not unknown, f"{where}: {unknown} not exported by /metrics ({expr})"
        named |= names
    for wanted in ("sluice_protocol_connections", "sluice_protocol_messages_published_total",
                   "sluice_store_written_bytes_total", "sluice_group_lag", "sluice_amqp_queue_messages_ready",
                   "sluice_memory_alarm", "sluice_disk_alarm", "sluice_admin_requests_total"):
        assert wanted in named, f"no panel shows {wanted}"
