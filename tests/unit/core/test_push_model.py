"""Push subscription settings and the sink policy: what is refused, with a reason that names
the field or the setting to change."""
from __future__ import annotations

import pytest

from core.errors import InvalidArgument
from core.push_model import PushSubscription, from_json
from core.push_subscriptions import check_secret, new_secret
from core.sink_policy import SinkPolicy


def make(**fields) -> PushSubscription:
    return PushSubscription(**{"name": "p", "owner": "ann", "sink": "https://hooks.example.com/x",
                               "topic": "orders", **fields})


@pytest.mark.parametrize(("fields", "needle"), [
    ({"sink": "ftp://x/"}, "http"), ({"sink": "https://u:p@h/"}, "credentials"),
    ({"sink": "http:///nohost"}, "host"), ({"topic": "", "queue": ""}, "exactly one source"),
    ({"queue": "q"}, "exactly one source"), ({"topic": "", "queue": "q"}, "vhost"),
    ({"format": "xml"}, "format"), ({"concurrency": 257}, "concurrency"),
    ({"concurrency": True}, "concurrency"), ({"rate_limit": -1}, "rate_limit"),
    ({"backoff_min_ms": 10, "backoff_max_ms": 5}, "backoff_max_ms"),
    ({"subject_filter": "other/#"}, "does not lie in topic"), ({"name": "a" * 124}, "too long"),
    ({"filters": ({"exact": {}}, "x")}, "filters"), ({"ordered": "yes"}, "ordered"),
])
def test_invalid_settings_name_what_to_fix(fields, needle):
    with pytest.raises(InvalidArgument, match=needle):
        make(**fields)


def test_the_stored_form_round_trips_and_the_dead_letter_topic_defaults_to_name_dlq():
    subscription = make(filters=({"exact": {"type": "x"}},), ordered=True, reply_topic="r")
    assert from_json(subscription.to_json() | {"dead_letter_topic": ""}) == subscription
    assert subscription.dead_letters == "p.dlq" and subscription.group == "%PUSH%p"


def test_secrets_are_whsec_base64_of_24_bytes_or_more():
    assert check_secret(new_secret()).startswith("whsec_")
    for bad in ("", "whsec_", "whsec_c2hvcnQ=", "abc", None, "whsec_!!!"):
        with pytest.raises(InvalidArgument, match="whsec_"):
            check_secret(bad)


@pytest.mark.parametrize("address", ["127.0.0.1", "10.1.2.3", "192.168.0.1", "169.254.169.254",
                                     "0.0.0.0", "224.0.0.1", "::1", "fe80::1", "fc00::1",
                                     "::ffff:127.0.0.1", "100.64.0.1"])
def test_non_public_addresses_are_refused_by_default(address):
    policy = SinkPolicy.parse("")
    assert not policy.address_allowed(address)
    with pytest.raises(InvalidArgument, match="push.allowed_sinks"):
        policy.check_sink_host(address)


def test_public_addresses_and_listed_networks_and_hosts_are_allowed():
    policy = SinkPolicy.parse(" 127.0.0.0/8, 10.1.0.0/16 ,hooks.internal., fd00::/8")
    assert policy.address_allowed("93.184.216.34") and policy.address_allowed("2606:4700::1")
    assert policy.address_allowed("127.0.0.2") and policy.address_allowed("10.1.9.9")
    assert policy.address_allowed("::ffff:127.0.0.1") and policy.address_allowed("fd12::1")
    assert not policy.address_allowed("10.2.0.1") and not policy.address_allowed("169.254.169.254")
    assert policy.host_listed("HOOKS.internal") and not policy.host_listed("internal")
    policy.check_sink_host("localhost")  # a name: decided on its addresses when connecting


@pytest.mark.parametrize("entry", ["10.0.0.0/33", "not a host", "exa_mple.com", "-"])
def test_an_entry_that_is_neither_a_cidr_nor_a_host_name_is_refused(entry):
    with pytest.raises(ValueError, match="push.allowed_sinks"):
        SinkPolicy.parse(entry)
