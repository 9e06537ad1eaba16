"""The subject-to-topic table (``mqtt.topic_map``): where subjects are stored, and which topics a
subscription filter can reach, which is what subscribing is authorized on."""
from __future__ import annotations

import pytest

from core.errors import InvalidArgument
from core.topic_map import ANY_TOPIC, SubjectTopics, parse_rules
from protocols.mqtt.topics import SYNTAX
from sluice.server.config import ConfigError, load_config

FLEET = SubjectTopics(SYNTAX, parse_rules("+/telemetry=telemetry, site/+/alarm/#=alarms"))


@pytest.mark.parametrize("subject, topic", [
    ("d1/telemetry", "telemetry"),
    ("d2/telemetry", "telemetry"),
    ("site/berlin/alarm/fire", "alarms"),
    ("site/berlin/alarm", "alarms"),          # ``#`` also matches the parent level
    ("d1/status", "d1"),                      # no rule: the first level, as without a table
    ("site/berlin/door", "site"),
])
def test_the_first_matching_rule_names_the_topic_else_the_first_level(subject, topic):
    assert FLEET.topic_of(subject) == topic
    assert FLEET.contains(subject, topic)
    assert not FLEET.contains(subject, "elsewhere")


@pytest.mark.parametrize("subject_filter, topics", [
    ("+/telemetry", {"telemetry"}),                       # covered by one rule
    ("d1/telemetry", {"telemetry"}),
    ("d1/#", {"telemetry", "d1"}),                        # partly a rule's, partly d1's
    ("+/#", {"telemetry", "alarms", ANY_TOPIC}),          # any first level
    ("site/+/alarm/fire", {"alarms"}),
    ("site/#", {"telemetry", "alarms", "site"}),          # site/telemetry is the rule's too
    ("d1/status", {"d1"}),
])
def test_a_filter_reaches_every_topic_a_matching_subject_could_be_stored_in(subject_filter, topics):
    assert FLEET.topics_for_filter(subject_filter) == topics


def test_without_rules_subjects_go_to_their_first_level_escaped():
    plain = SubjectTopics(SYNTAX)
    assert plain.topic_of("devices/d1/telemetry") == "devices"
    assert plain.topic_of("a b/c") == "a%20b"
    assert plain.topics_for_filter("devices/+/telemetry") == {"devices"}
    assert plain.topics_for_filter("#") == {ANY_TOPIC}


@pytest.mark.parametrize("text, problem", [
    ("+/telemetry", "is not FILTER=TOPIC"),
    ("a/#/b=t", "'#'"),
    ("$SYS/#=sys", "starts with '$'"),
    ("+/t=%SYS%x", "internal topic"),
    ("+/t=bad name", "topic"),
])
def test_a_bad_rule_is_a_configuration_error_naming_the_setting(text, problem):
    with pytest.raises(ConfigError, match=r"mqtt\.topic_map: .*") as refused:
        load_config(env={"SLUICE_MQTT_TOPIC_MAP": text})
    assert problem in str(refused.value)


def test_rules_parse_in_order_and_blank_entries_are_skipped():
    assert parse_rules(" +/telemetry = telemetry ,, a/#=b ") == (("+/telemetry", "telemetry"),
                                                                 ("a/#", "b"))
    with pytest.raises(InvalidArgument):
        parse_rules("=t")
