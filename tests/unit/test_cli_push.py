"""`sluice push ...`: the request bodies its options make and how it prints the admin API's answers
(answers recorded in the shape the push-subscription routes give)."""
from __future__ import annotations

import pytest

from sluice.cli import main
from sluice.cli.main import build_parser
from sluice.cli.push import create_body, render_created, render_list, render_subscription

STATS = {"state": "running", "delivered": 120, "failed": 3, "retrying": 1, "dead_lettered": 2,
         "replies": 0, "lag": 7, "latency_ms": {"p50": 4.2, "p99": 31.0},
         "last_error": "503 from http://127.0.0.1:9000/ (attempt 2 of 10)", "last_status": 503}
SUBSCRIPTION = {"name": "fn", "owner": "alice", "sink": "http://127.0.0.1:9000/",
                "topic": "sensors", "subject_filter": "sensors/+/temp", "vhost": "", "queue": "",
                "filters": [{"prefix": {"type": "com.example."}}], "format": "binary",
                "transform": "{id: id}", "concurrency": 16, "rate_limit": 0.0,
                "timeout_ms": 10000, "max_attempts": 10, "backoff_min_ms": 1000,
                "backoff_max_ms": 300000, "dead_letter_topic": "fn.dlq", "ordered": False,
                "reply_topic": "", "paused": False, "created_ms": 1700000000000}


def body_of(*argv: str) -> dict:
    return create_body(build_parser().parse_args(["push", "create", *argv]))


def test_create_sends_only_the_options_given():
    assert body_of("fn", "--topic", "sensors", "--sink", "http://127.0.0.1:9000/") == {
        "name": "fn", "sink": "http://127.0.0.1:9000/", "topic": "sensors"}


def test_create_sends_every_setting():
    body = body_of("fn", "--topic", "sensors", "--subject-filter", "sensors/+/temp",
                   "--sink", "https://example.org/hook", "--filter", '{"exact": {"type": "a"}}',
                   "--filter", '{"sql": "temp > 20"}', "--format", "structured",
                   "--transform", "{id: id}", "--concurrency", "4", "--rate-limit", "2.5",
                   "--timeout-ms", "500", "--max-attempts", "3", "--dead-letter-topic", "dead",
                   "--ordered", "--reply-topic", "replies", "--secret", "whsec_abc")
    assert body == {"name": "fn", "sink": "https://example.org/hook", "topic": "sensors",
                    "subject_filter": "sensors/+/temp",
                    "filters": [{"exact": {"type": "a"}}, {"sql": "temp > 20"}],
                    "format": "structured", "transform": "{id: id}", "concurrency": 4,
                    "rate_limit": 2.5, "timeout_ms": 500, "max_attempts": 3,
                    "dead_letter_topic": "dead", "ordered": True, "reply_topic": "replies",
                    "secret": "whsec_abc"}


@pytest.mark.parametrize("queue, vhost, name", [
    ("//orders", "/", "orders"), ("orders", "/", "orders"), ("prod/orders", "prod", "orders")])
def test_a_queue_source_names_its_virtual_host(queue, vhost, name):
    body = body_of("fn", "--queue", queue, "--sink", "http://127.0.0.1:9000/")
    assert (body["vhost"], body["queue"]) == (vhost, name) and "topic" not in body


@pytest.mark.parametrize("argv, said", [
    (["--sink", "http://h/"], "either --topic TOPIC or --queue VHOST/QUEUE"),
    (["--topic", "t", "--queue", "//q", "--sink", "http://h/"], "either --topic"),
    (["--queue", "//q", "--subject-filter", "a/#", "--sink", "http://h/"], "use it with --topic"),
    (["--queue", "prod/", "--sink", "http://h/"], "name the queue"),
    (["--topic", "t", "--sink", "http://h/", "--filter", "{exact: 1}"], "is not JSON"),
])
def test_bad_options_are_refused_before_any_request(argv, said, capsys):
    # the admin URL points nowhere: the command must fail on its options before calling it
    assert main(["push", "create", "fn", "--admin", "http://127.0.0.1:9", *argv]) == 2
    assert said in capsys.readouterr().err


def test_an_unknown_format_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["push", "create", "fn", "--topic", "t", "--sink", "http://h/", "--format", "xml"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'xml'" in capsys.readouterr().err


def test_create_prints_the_secret_once_with_a_warning():
    text = render_created(dict(SUBSCRIPTION, secret="whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"))
    assert "created push subscription fn: sensors (sensors/+/temp) -> http://127.0.0.1:9000/" in text
    assert "signing secret: whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw" in text
    assert "not shown again" in text


def test_list_is_a_table_of_sources_states_and_counters():
    queued = dict(SUBSCRIPTION, name="orders-hook", topic="", subject_filter="", vhost="/",
                  queue="orders", format="raw", stats=dict(STATS, state="paused", delivered=0))
    lines = render_list([dict(SUBSCRIPTION, stats=STATS), queued]).splitlines()
    assert lines[0].split() == ["NAME", "SOURCE", "SINK", "FORMAT", "STATE", "DELIVERED",
                                "FAILED", "RETRYING", "LAG"]
    assert lines[1].split() == ["fn", "sensors", "(sensors/+/temp)", "http://127.0.0.1:9000/",
                                "binary", "running", "120", "3", "1", "7"]
    assert lines[2].split() == ["orders-hook", "queue", "//orders", "http://127.0.0.1:9000/",
                                "raw", "paused", "0", "3", "1", "7"]
    assert "no push subscriptions" in render_list([])


def test_show_prints_settings_counters_latency_and_the_last_error():
    text = render_subscription(dict(SUBSCRIPTION, stats=STATS))
    for expected in ["push subscription fn", "owner:", "alice", "filters:",
                     '[{"prefix": {"type": "com.example."}}]', "transform:", "{id: id}",
                     "dead letters to:", "fn.dlq", "state:", "running", "dead-lettered:",
                     "latency:", "p50 4.2 ms, p99 31.0 ms", "last status:", "503",
                     "last error:", "503 from http://127.0.0.1:9000/ (attempt 2 of 10)"]:
        assert expected in text
    fresh = dict(STATS, latency_ms={"p50": None, "p99": None}, last_error=None, last_status=None)
    assert "p50 -, p99 -" in render_subscription(dict(SUBSCRIPTION, stats=fresh))


@pytest.mark.parametrize("leaf", ["create", "list", "show", "pause", "resume", "delete"])
def test_every_push_command_has_help(leaf, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["push", leaf, "--help"])
    assert exit_info.value.code == 0
    assert f"usage: sluice push {leaf}" in capsys.readouterr().out
