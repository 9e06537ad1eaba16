"""The native edge against hostile callers, over real gRPC: signatures expire (a captured request
cannot be replayed later), wrong signatures are throttled per address, and route lookups say
nothing about topics the caller has no right on.
"""
from __future__ import annotations

import asyncio
import time
import uuid

import grpc
import pytest
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc
from rocketmq.grpc_protocol import service_pb2_grpc
from rocketmq.v5.util.signature import Signature

from core.model import Action, Permission, ResourceKind
from sluice.server.config import ConfigError, load_config
from protocols.native.auth import Authenticator
from protocols.native.server import start_native_server

Code = pb.Code
TIMEOUT = 10
UTC_FORMAT = "%Y%m%dT%H%M%SZ"


class SignedStub:
    """Generated stubs whose every call is signed with a chosen ``x-mq-date-time``."""

    def __init__(self, endpoint: str, access_key: str, secret: str) -> None:
        self.channel = grpc.insecure_channel(endpoint)
        self.stub = service_pb2_grpc.MessagingServiceStub(self.channel)
        self.access_key, self.secret = access_key, secret
        self.client_id = f"edge-{uuid.uuid4().hex[:8]}"

    def metadata(self, date: str) -> list[tuple[str, str]]:
        auth = (f"MQv2-HMAC-SHA1 Credential={self.access_key}, SignedHeaders=x-mq-date-time, "
                f"Signature={Signature.sign(self.secret, date)}")
        return [("x-mq-date-time", date), ("x-mq-client-id", self.client_id), ("authorization", auth)]

    def route(self, topic: str, date: str | None = None) -> rpc.QueryRouteResponse:
        date = time.strftime(UTC_FORMAT, time.gmtime()) if date is None else date
        return self.stub.QueryRoute(rpc.QueryRouteRequest(topic=pb.Resource(name=topic)),
                                    metadata=self.metadata(date), timeout=TIMEOUT)

    def assignment(self, topic: str, group: str = "g") -> rpc.QueryAssignmentResponse:
        date = time.strftime(UTC_FORMAT, time.gmtime())
        request = rpc.QueryAssignmentRequest(topic=pb.Resource(name=topic), group=pb.Resource(name=group))
        return self.stub.QueryAssignment(request, metadata=self.metadata(date), timeout=TIMEOUT)

    def close(self) -> None:
        self.channel.close()


@pytest.fixture
def admin(native_broker):
    stub = SignedStub(native_broker.endpoint, native_broker.user, native_broker.password)
    yield stub
    stub.close()


def utc_stamp(seconds_from_now: float) -> str:
    return time.strftime(UTC_FORMAT, time.gmtime(time.time() + seconds_from_now))


# --- signatures expire ---

@pytest.mark.parametrize("seconds", [-16 * 60, 16 * 60, -2 * 86_400, -365 * 86_400])
def test_a_signature_made_outside_the_skew_window_is_refused(native_broker, admin, seconds):
    native_broker.create_topic("orders")
    answer = admin.route("orders", utc_stamp(seconds))
    assert answer.status.code == Code.UNAUTHORIZED, answer.status
    assert "clock skew" in answer.status.message and "x-mq-date-time" in answer.status.message
    assert not answer.message_queues
    inside = [utc_stamp(-14 * 60), utc_stamp(14 * 60),
              time.strftime(UTC_FORMAT)]  # local time, as the official Java and Python clients sign
    assert [admin.route("orders", date).status.code for date in inside] == [Code.OK] * 3


@pytest.mark.parametrize("date", ["not-a-date", "20251340T000000Z", "2025-01-01T00:00:00Z",
                                  "20250101T000000", "20250101T000000Z; DROP"])
def test_a_signed_date_that_is_not_a_time_is_refused(native_broker, admin, date):
    native_broker.create_topic("orders")
    answer = admin.route("orders", date)
    assert answer.status.code == Code.UNAUTHORIZED, answer.status
    assert answer.status.message and not answer.message_queues


def test_the_window_is_a_setting(native_broker_factory):
    nb = native_broker_factory()
    nb.create_topic("orders")

    async def restart_with_window(broker):
        await nb.server.stop(0)
        nb.server = await start_native_server(broker, "127.0.0.1", 0, signature_max_skew_s=60)
    nb.run(restart_with_window)
    stub = SignedStub(nb.endpoint, nb.user, nb.password)
    try:
        assert stub.route("orders", utc_stamp(-30)).status.code == Code.OK
        refused = stub.route("orders", utc_stamp(-120))
        assert refused.status.code == Code.UNAUTHORIZED and "at most 60 s" in refused.status.message
    finally:
        stub.close()


# --- wrong signatures are throttled ---

def test_wrong_signatures_get_an_address_refused_while_another_address_signs_in(
        native_broker_factory):
    nb = native_broker_factory(core={"login_max_failures_per_peer_user": 3,
                                     "login_failure_delay_ms": 0})
    nb.create_topic("orders")
    nb.create_user("ann", "right", admin=True)
    forger, signer = SignedStub(nb.endpoint, "ann", "guess"), SignedStub(nb.endpoint, "ann", "right")
    try:
        for _ in range(3):
            refused = forger.route("orders").status
            assert refused.code == Code.UNAUTHORIZED and "signature check failed" in refused.message
        banned = signer.route("orders").status
        assert banned.code == Code.UNAUTHORIZED, "the right signature too, from this address"
        assert "too many failed logins for user 'ann' from address 127.0.0.1" in banned.message
        date = time.strftime(UTC_FORMAT, time.gmtime())
        elsewhere = nb.run(lambda broker: Authenticator(broker, None).principal(
            signer.metadata(date), "ipv4:127.0.0.2:40000"))
        assert elsewhere.user == "ann", "the same key signs in from another address"
    finally:
        forger.close()
        signer.close()


# --- rights before existence ---

def grant(nb, user: str, pattern: str, *actions: Action) -> None:
    permission = Permission(user, ResourceKind.TOPIC, pattern, frozenset(actions))
    nb.run(lambda b: asyncio.to_thread(b.users.grant, permission))


@pytest.fixture
def outsider(native_broker):
    """A user with rights on ``mine*`` topics only."""
    native_broker.create_user("outsider", "pw")
    grant(native_broker, "outsider", "mine*", Action.PUBLISH)
    stub = SignedStub(native_broker.endpoint, "outsider", "pw")
    yield stub
    stub.close()


def test_query_route_without_a_right_is_refused_alike_whether_the_topic_exists_or_not(
        native_broker, outsider):
    native_broker.create_topic("secret-orders", queues=2)
    existing = outsider.route("secret-orders")
    missing = outsider.route("secret-payments")
    assert existing.status.code == missing.status.code == Code.FORBIDDEN
    assert not existing.message_queues
    assert existing.status.message == missing.status.message.replace("secret-payments", "secret-orders")

    native_broker.create_topic("mine-1", queues=2)
    assert [q.id for q in outsider.route("mine-1").message_queues] == [0, 1]  # publish suffices
    created = outsider.route("mine-2")  # its own name space: answered, created by a first send
    assert created.status.code == Code.OK and len(created.message_queues) == 4
    grant(native_broker, "outsider", "secret-orders", Action.SUBSCRIBE)   # and so does subscribe
    assert outsider.route("secret-orders").status.code == Code.OK


def test_query_assignment_without_a_right_is_refused_alike_whether_the_topic_exists_or_not(
        native_broker, outsider):
    native_broker.create_topic("secret-orders", queues=2)
    group = Permission("outsider", ResourceKind.GROUP, "g", frozenset({Action.SUBSCRIBE}))
    native_broker.run(lambda b: asyncio.to_thread(b.users.grant, group))
    existing = outsider.assignment("secret-orders")
    missing = outsider.assignment("secret-payments")
    assert existing.status.code == missing.status.code == Code.FORBIDDEN
    assert not existing.assignments
    assert existing.status.message == missing.status.message.replace("secret-payments", "secret-orders")
    grant(native_broker, "outsider", "secret-orders", Action.SUBSCRIBE)
    assert outsider.assignment("secret-orders").status.code == Code.OK


def test_the_window_is_read_from_the_configuration():
    config = load_config(env={"SLUICE_NATIVE_SIGNATURE_MAX_SKEW_S": "60"})
    assert config.native.signature_max_skew_s == 60
    assert load_config().native.signature_max_skew_s == 900
    with pytest.raises(ConfigError, match="signature_max_skew_s"):
        load_config(env={"SLUICE_NATIVE_SIGNATURE_MAX_SKEW_S": "0"})
