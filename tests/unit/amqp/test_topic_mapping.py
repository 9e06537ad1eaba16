"""The cross-protocol topic mapping (DESIGN.md): routing keys and subjects swap ``.`` and ``/``
(a bijection: nothing merged, everything comes back), binding keys and MQTT filters map ``*``
and ``+``, and a translated binding matches exactly the subjects its key matches."""
from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from core.exchanges import TOPIC_SYNTAX
from core.routing import TopicSyntax
from protocols.amqp.mapping import (binding_key_of_filter, filter_of_binding_key, key_of_subject,
                                    read_filter, subject_of_key)

MQTT = TopicSyntax("/", "+", "#", multi_last=True, dollar_hidden=True)
TEXT = st.text(st.sampled_from("ab./%+*#$é"), max_size=12)
LITERAL = st.text(st.sampled_from("ab/%é"), max_size=3)
"""A literal word of a binding key: no separator, no wildcard character."""
WORD = st.one_of(LITERAL, st.just("*"), st.just("#"))
BINDING_KEY = st.lists(WORD, min_size=1, max_size=5).map(".".join)
ROUTING_KEY = st.lists(st.text(st.sampled_from("ab/%é"), max_size=3), min_size=1,
                       max_size=6).map(".".join)


def test_examples_of_the_contract():
    assert subject_of_key("devices.d1.telemetry") == "devices/d1/telemetry"
    assert key_of_subject("spBv1.0/plant1") == "spBv1/0.plant1"
    assert subject_of_key("v1/2.x") == "v1.2/x"
    assert filter_of_binding_key("devices.*.telemetry") == "devices/+/telemetry"
    assert filter_of_binding_key("a.#.b") == "a/#/b"
    assert filter_of_binding_key("a.b+c") is None
    assert binding_key_of_filter("devices/+/#") == "devices.*.#"
    assert binding_key_of_filter("a/*") is None
    assert read_filter("a.#.b") == "a/#"
    assert read_filter("a.b+c.d") == "a/+/d"


@given(TEXT)
def test_routing_keys_and_subjects_come_back_unchanged(text):
    assert key_of_subject(subject_of_key(text)) == text
    assert subject_of_key(key_of_subject(text)) == text


@given(TEXT)
def test_no_two_levels_are_merged(routing_key):
    assert len(subject_of_key(routing_key).split("/")) == len(routing_key.split("."))


@given(BINDING_KEY)
def test_binding_keys_and_filters_come_back_unchanged(binding_key):
    subject_filter = filter_of_binding_key(binding_key)
    assert subject_filter is not None
    assert binding_key_of_filter(subject_filter) == binding_key


@given(BINDING_KEY, ROUTING_KEY)
def test_a_translated_binding_reads_what_the_binding_key_matches(binding_key, routing_key):
    subject_filter = filter_of_binding_key(binding_key)
    subject = subject_of_key(routing_key)
    by_key = TOPIC_SYNTAX.levels_match(binding_key.split("."), routing_key.split("."))
    assert MQTT.levels_match(subject_filter.split("/"), subject.split("/")) == by_key
    if by_key:  # authorized on a filter at least as wide
        assert MQTT.levels_match(read_filter(binding_key).split("/"), subject.split("/"))
