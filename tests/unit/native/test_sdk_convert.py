"""SDK conversions: messages to and from protobuf, ids, request signing (checked against the
official client's signature module), Status to error, the server's retry policy, config."""
from __future__ import annotations

import gzip
import re
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest
from rocketmq import ClientConfiguration, Credentials
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.v5.util import signature as official

from sluice.client import (BATCH_PROPERTY, BadRequestError, ClientConfig,
                                  InvalidReceiptHandleError, Message, PackedBatchError,
                                  ReceivedMessage, RetryPolicy, ServerError, TopicNotFoundError,
                                  pack_bodies)
from sluice.client.auth import request_metadata, sign
from sluice.client.config import new_client_id
from sluice.client.convert import (duration, endpoints, expand_packed, message_from_proto,
                                          message_to_proto, new_message_id)
from sluice.client.errors import error_from_status, raise_for_status

BORN_MS = 1_700_000_000_123


def test_message_to_proto_fills_resource_and_system_properties():
    message = Message("orders", b"body", tag="created", keys=["k1", "k2"],
                      properties={"region": "eu"})
    proto = message_to_proto(message, "ns1", 3, "01ABC", BORN_MS)
    assert (proto.topic.resource_namespace, proto.topic.name) == ("ns1", "orders")
    assert proto.body == b"body" and dict(proto.user_properties) == {"region": "eu"}
    props = proto.system_properties
    assert (props.tag, list(props.keys), props.message_id) == ("created", ["k1", "k2"], "01ABC")
    assert props.queue_id == 3 and props.born_timestamp.ToMilliseconds() == BORN_MS
    assert props.message_type == pb.MessageType.NORMAL
    assert props.body_encoding == pb.Encoding.IDENTITY
    assert not props.HasField("message_group") and not props.HasField("delivery_timestamp")


def test_message_group_makes_fifo_and_delivery_timestamp_makes_delay():
    fifo = message_to_proto(Message("t", b"x", message_group="g1"), "", 0, "id", BORN_MS)
    assert fifo.system_properties.message_type == pb.MessageType.FIFO
    assert fifo.system_properties.message_group == "g1"
    delay = message_to_proto(Message("t", b"x", delivery_timestamp=BORN_MS + 5000), "", 0, "id", BORN_MS)
    assert delay.system_properties.message_type == pb.MessageType.DELAY
    assert delay.system_properties.delivery_timestamp.ToMilliseconds() == BORN_MS + 5000


def _delivered(**system: object) -> pb.Message:
    """A message as the broker delivers it to a pop consumer."""
    props = pb.SystemProperties(message_id="01FF", keys=["k"], queue_id=2, queue_offset=41,
                                delivery_attempt=3, receipt_handle="rh-1", tag="t1",
                                message_group="g", **system)
    props.born_timestamp.FromMilliseconds(BORN_MS)
    props.store_timestamp.FromMilliseconds(BORN_MS + 7)
    return pb.Message(topic=pb.Resource(name="orders", resource_namespace="ns"),
                      user_properties={"a": "b"}, system_properties=props, body=b"payload")


def test_message_from_proto_reads_every_field():
    received = message_from_proto(_delivered())
    assert received == ReceivedMessage(
        topic="orders", queue_id=2, offset=41, message_id="01FF", body=b"payload", tag="t1",
        keys=("k",), properties={"a": "b"}, message_group="g", born_timestamp=BORN_MS,
        store_timestamp=BORN_MS + 7, delivery_attempt=3, receipt_handle="rh-1")


def test_a_message_survives_the_wire_both_ways():
    sent = Message("orders", b"\x00\xff", tag="t", keys=["a"], properties={"p": "v"}, message_group="g")
    wire = message_to_proto(sent, "", 5, new_message_id(), BORN_MS).SerializeToString()
    received = message_from_proto(pb.Message.FromString(wire))
    assert (received.topic, received.body, received.tag, received.keys, received.properties,
            received.message_group, received.queue_id, received.born_timestamp) == (
        "orders", b"\x00\xff", "t", ("a",), {"p": "v"}, "g", 5, BORN_MS)
    assert received.delivery_attempt == 1 and received.receipt_handle == ""


def test_gzip_bodies_are_decompressed():
    proto = _delivered(body_encoding=pb.Encoding.GZIP)
    proto.body = gzip.compress(b"payload" * 10)
    assert message_from_proto(proto).body == b"payload" * 10


def test_expand_packed_gives_one_message_per_body_at_the_same_offset():
    packed = ReceivedMessage("t", 1, 9, "id", pack_bodies([b"a", b"b", b"c"]),
                             properties={BATCH_PROPERTY: "3"})
    expanded = expand_packed(packed)
    assert [(m.body, m.offset, m.batch_index) for m in expanded] == [(b"a", 9, 0), (b"b", 9, 1), (b"c", 9, 2)]
    plain = ReceivedMessage("t", 1, 10, "id2", b"plain")
    assert expand_packed(plain) == [plain]


def test_expand_packed_refuses_a_count_that_does_not_match():
    packed = ReceivedMessage("t", 1, 9, "id", pack_bodies([b"a"]), properties={BATCH_PROPERTY: "2"})
    with pytest.raises(PackedBatchError, match="packs 1 bodies"):
        expand_packed(packed)


def test_message_ids_have_the_official_v1_layout_and_are_unique():
    ids = [new_message_id() for _ in range(1000)]
    assert all(re.fullmatch(r"01[0-9A-F]{32}", i) for i in ids)
    assert len(set(ids)) == len(ids)


def test_client_ids_follow_the_official_format():
    first, second = new_client_id(), new_client_id()
    host, pid, index, stamp = first.split("@")
    assert pid.isdigit() and index.isdigit() and re.fullmatch(r"[0-9a-z]+", stamp)
    assert first != second


def test_endpoints_scheme_follows_the_host():
    assert endpoints(ClientConfig("127.0.0.1:8081")).scheme == pb.AddressScheme.IPv4
    assert endpoints(ClientConfig("[::1]:8081")).addresses[0].host == "::1"
    assert endpoints(ClientConfig("broker.local:8081")).scheme == pb.AddressScheme.DOMAIN_NAME
    assert duration(1.5).ToMilliseconds() == 1500


@pytest.mark.parametrize("endpoint", ["localhost", "host:", ":8081", "host:0", "host:http"])
def test_config_refuses_malformed_endpoints(endpoint):
    with pytest.raises(ValueError, match="host:port"):
        ClientConfig(endpoint)


def test_config_needs_both_keys_or_neither():
    with pytest.raises(ValueError, match="both"):
        ClientConfig(access_key="ak")


# --- signing, against the official client ---

def test_signature_matches_the_official_client():
    for secret, date in [("secret", "20240102T030405Z"), ("", "20991231T235959Z"), ("ü-ß", "x")]:
        assert sign(secret, date) == official.Signature.sign(secret, date)


def test_metadata_matches_the_official_client_for_the_same_moment(monkeypatch):
    moment = datetime(2024, 1, 2, 3, 4, 5, tzinfo=timezone.utc)

    class FrozenDateTime(datetime):
        @classmethod
        def now(cls, tz=None):
            return moment

    monkeypatch.setattr(official, "datetime", FrozenDateTime)
    theirs = dict(official.Signature.metadata(
        ClientConfiguration("127.0.0.1:8081", Credentials("ak", "sk"), "ns"), "client-1"))
    ours = dict(request_metadata(ClientConfig(access_key="ak", secret_key="sk", namespace="ns"),
                                 "client-1", now=moment))
    for header in ("authorization", "x-mq-date-time", "x-mq-client-id", "x-mq-namespace",
                   "x-mq-language", "x-mq-protocol"):
        assert ours[header] == theirs[header], header
    assert ours.keys() == theirs.keys()


def test_no_credentials_no_authorization_header():
    headers = dict(request_metadata(ClientConfig(), "client-1"))
    assert "authorization" not in headers and headers["x-mq-client-id"] == "client-1"


# --- Status to error ---

def test_status_becomes_the_matching_error_with_the_servers_message():
    error = error_from_status(pb.Status(code=pb.Code.TOPIC_NOT_FOUND, message="topic 'x' does not exist"))
    assert isinstance(error, TopicNotFoundError)
    assert error.code == pb.Code.TOPIC_NOT_FOUND and error.message == "topic 'x' does not exist"
    assert str(error) == "topic 'x' does not exist [TOPIC_NOT_FOUND]"
    assert isinstance(error_from_status(pb.Status(code=pb.Code.INVALID_RECEIPT_HANDLE)),
                      InvalidReceiptHandleError)
    assert isinstance(error_from_status(pb.Status(code=pb.Code.ILLEGAL_OFFSET)), BadRequestError)
    assert isinstance(error_from_status(pb.Status(code=12345)), ServerError)


def test_ok_and_multiple_results_do_not_raise():
    raise_for_status(pb.Status(code=pb.Code.OK))
    raise_for_status(pb.Status(code=pb.Code.MULTIPLE_RESULTS))
    with pytest.raises(BadRequestError, match="BAD_REQUEST"):
        raise_for_status(pb.Status(code=pb.Code.BAD_REQUEST))


# --- the retry policy the broker sends ---

def test_retry_policy_defaults_to_exponential_1s_to_60s():
    policy = RetryPolicy.from_settings(None)
    assert [policy.backoff(n) for n in (1, 2, 3, 7, 8, 20)] == [1, 2, 4, 60, 60, 60]
    assert policy.max_attempts == 16


def test_retry_policy_from_the_brokers_settings():
    settings = pb.Settings(backoff_policy=pb.RetryPolicy(
        max_attempts=3, exponential_backoff=pb.ExponentialBackoff(
            initial=duration(0.2), max=duration(1.0), multiplier=3)))
    policy = RetryPolicy.from_settings(settings)
    assert policy.max_attempts == 3
    assert [round(policy.backoff(n), 6) for n in (1, 2, 3)] == [0.2, 0.6, 1.0]
    custom = pb.Settings(backoff_policy=pb.RetryPolicy(
        max_attempts=5, customized_backoff=pb.CustomizedBackoff(next=[duration(1), duration(10)])))
    assert [RetryPolicy.from_settings(custom).backoff(n) for n in (1, 2, 3)] == [1, 10, 10]


def test_importing_the_sdk_loads_no_broker_code():
    """Spark executors import the SDK with no broker around: not even parent packages may pull
    in core, store or another adapter."""
    code = ("import sys, sluice.client; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('core', 'store') "
            "or m.startswith(('protocols.mqtt', 'protocols.amqp', 'protocols.native.server'))))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).resolve().parents[3])
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_a_cluster_is_given_as_several_endpoints_and_each_is_checked():
    config = ClientConfig("127.0.0.2:8081, 127.0.0.3:8081,127.0.0.4:8081")
    assert config.endpoints == ("127.0.0.2:8081", "127.0.0.3:8081", "127.0.0.4:8081")
    assert [(a.host, a.port) for a in endpoints(config).addresses] == [
        ("127.0.0.2", 8081), ("127.0.0.3", 8081), ("127.0.0.4", 8081)]
    with pytest.raises(ValueError, match="host:port"):
        ClientConfig("127.0.0.2:8081,localhost")
    with pytest.raises(ValueError, match="empty"):
        ClientConfig(" , ")
