"""The native server spoken to directly with the generated gRPC stubs: every RPC, every error
code, authentication, and garbage on the port."""
from __future__ import annotations

import os
import queue
import socket
import threading
import time
import uuid
import zlib

import grpc
import pytest
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc
from rocketmq.grpc_protocol import service_pb2_grpc
from rocketmq.v5.util.signature import Signature

from core.model import Action, MessageType, Permission, Principal, ResourceKind

Code = pb.Code
TIMEOUT = 10


class Stub:
    """A MessagingService stub that signs every call like the official clients."""

    def __init__(self, endpoint: str, access_key: str = "", secret: str = "", client_id: str | None = None):
        self.channel = grpc.insecure_channel(endpoint)
        self.stub = service_pb2_grpc.MessagingServiceStub(self.channel)
        self.access_key, self.secret = access_key, secret
        self.client_id = client_id or f"test-{uuid.uuid4().hex[:8]}"

    def metadata(self) -> list[tuple[str, str]]:
        date = time.strftime("%Y%m%dT%H%M%SZ")
        auth = (f"MQv2-HMAC-SHA1 Credential={self.access_key}, SignedHeaders=x-mq-date-time, "
                f"Signature={Signature.sign(self.secret, date)}")
        return [("x-mq-date-time", date), ("x-mq-client-id", self.client_id), ("authorization", auth)]

    def __getattr__(self, name: str):
        method = getattr(self.stub, name)
        return lambda request, timeout=TIMEOUT: method(request, metadata=self.metadata(), timeout=timeout)

    def close(self) -> None:
        self.channel.close()


@pytest.fixture
def stub(native_broker):
    client = Stub(native_broker.endpoint, native_broker.user, native_broker.password)
    yield client
    client.close()


def wait_for(predicate, timeout: float = TIMEOUT):
    """Poll ``predicate`` until it is truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not (result := predicate()):
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)
    return result


def res(name: str) -> pb.Resource:
    return pb.Resource(name=name)


def message(topic: str, body: bytes, tag: str = "", **system) -> pb.Message:
    system.setdefault("message_type", pb.MessageType.NORMAL)
    props = pb.SystemProperties(message_id=uuid.uuid4().hex, body_encoding=pb.Encoding.IDENTITY, **system)
    if tag:
        props.tag = tag
    return pb.Message(topic=res(topic), body=body, system_properties=props)


def route(stub: Stub, topic: str) -> rpc.QueryRouteResponse:
    return stub.QueryRoute(rpc.QueryRouteRequest(topic=res(topic)))


def receive(stub: Stub, group: str, topic: str, queue: int = 0, *, batch: int = 32, poll_ms: int = 0,
            expression: str = "*", filter_type=pb.FilterType.TAG, timeout: float = TIMEOUT):
    request = rpc.ReceiveMessageRequest(
        group=res(group), message_queue=pb.MessageQueue(topic=res(topic), id=queue), batch_size=batch,
        filter_expression=pb.FilterExpression(type=filter_type, expression=expression))
    request.invisible_duration.FromMilliseconds(30_000)
    if poll_ms:
        request.long_polling_timeout.FromMilliseconds(poll_ms)
    return list(stub.ReceiveMessage(request, timeout=timeout))


def test_route_names_this_server_and_every_queue(native_broker, stub):
    native_broker.create_topic("orders", queues=3, message_type=MessageType.FIFO)
    answer = route(stub, "orders")
    assert answer.status.code == Code.OK
    assert [q.id for q in answer.message_queues] == [0, 1, 2]
    queue = answer.message_queues[0]
    assert queue.permission == pb.Permission.READ_WRITE
    assert list(queue.accept_message_types) == [pb.MessageType.FIFO]
    assert queue.broker.name == "sluice"
    assert [(a.host, a.port) for a in queue.broker.endpoints.addresses] == [("127.0.0.1", native_broker.port)]


def test_route_echoes_the_address_the_client_used(native_broker, stub):
    native_broker.create_topic("orders")
    asked = pb.Endpoints(scheme=pb.AddressScheme.DOMAIN_NAME,
                         addresses=[pb.Address(host="localhost", port=native_broker.port)])
    answer = stub.QueryRoute(rpc.QueryRouteRequest(topic=res("orders"), endpoints=asked))
    assert answer.message_queues[0].broker.endpoints == asked


def test_send_receive_ack_with_every_property(native_broker, stub):
    native_broker.create_topic("orders", queues=1)
    sent = message("orders", b"hello", tag="TagA", keys=["k1", "k2"])
    sent.user_properties["color"] = "red"
    sent.system_properties.born_timestamp.FromMilliseconds(1_700_000_000_000)
    answer = stub.SendMessage(rpc.SendMessageRequest(messages=[sent]))
    assert answer.status.code == Code.OK, answer.status.message
    assert answer.entries[0].message_id == sent.system_properties.message_id
    assert answer.entries[0].offset == 0

    responses = receive(stub, "g", "orders")
    assert responses[0].HasField("delivery_timestamp")
    assert responses[-1].status.code == Code.OK
    got = [r.message for r in responses if r.HasField("message")]
    assert len(got) == 1
    props = got[0].system_properties
    assert got[0].body == b"hello" and got[0].user_properties["color"] == "red"
    assert (props.tag, list(props.keys)) == ("TagA", ["k1", "k2"])
    assert props.message_id == sent.system_properties.message_id
    assert props.born_timestamp.ToMilliseconds() == 1_700_000_000_000
    assert props.store_timestamp.ToMilliseconds() > 0
    assert (props.queue_id, props.queue_offset, props.delivery_attempt) == (0, 0, 1)
    assert props.receipt_handle and 0 < props.invisible_duration.ToMilliseconds() <= 30_000
    assert props.body_digest.checksum == format(zlib.crc32(b"hello"), "08X")

    ack = stub.AckMessage(rpc.AckMessageRequest(group=res("g"), topic=res("orders"), entries=[
        rpc.AckMessageEntry(message_id=props.message_id, receipt_handle=props.receipt_handle)]))
    assert ack.status.code == Code.OK and ack.entries[0].status.code == Code.OK
    assert receive(stub, "g", "orders")[-1].status.code == Code.MESSAGE_NOT_FOUND


def test_fifo_message_group_travels_as_a_system_property(native_broker, stub):
    native_broker.create_topic("fifo", queues=2, message_type=MessageType.FIFO)
    sent = message("fifo", b"x", message_group="order-7")
    assert stub.SendMessage(rpc.SendMessageRequest(messages=[sent])).status.code == Code.OK
    got = [r.message for q in (0, 1) for r in receive(stub, "g", "fifo", q) if r.HasField("message")]
    assert [m.system_properties.message_group for m in got] == ["order-7"]
    assert "sluice.message_group" not in got[0].user_properties


def test_batch_send_gives_one_entry_per_message(native_broker, stub):
    native_broker.create_topic("orders", queues=1)
    batch = [message("orders", b"a"), message("orders", b"b")]
    answer = stub.SendMessage(rpc.SendMessageRequest(messages=batch))
    assert answer.status.code == Code.OK
    assert [e.offset for e in answer.entries] == [0, 1]


def test_long_poll_returns_when_a_message_arrives(native_broker, stub):
    native_broker.create_topic("orders", queues=1)
    native_broker.create_group("g")
    other = Stub(native_broker.endpoint, native_broker.user, native_broker.password)
    box: list = []
    # a 30 s poll (the broker's longest) in a 60 s call, joined for TIMEOUT: only the message's
    # arrival can end it in time
    poller = threading.Thread(target=lambda: box.append(receive(
        other, "g", "orders", poll_ms=30_000, timeout=60)), daemon=True)
    poller.start()
    wait_for(lambda: native_broker.run(lambda b: b.describe_group("g").members))  # the poll is in
    stub.SendMessage(rpc.SendMessageRequest(messages=[message("orders", b"late")]))
    poller.join(TIMEOUT)
    assert box, "the long poll did not return when the message arrived"
    assert [r.message.body for r in box[0] if r.HasField("message")] == [b"late"]
    other.close()


def test_long_poll_ends_before_the_client_deadline(native_broker, stub):
    native_broker.create_topic("orders", queues=1)
    # a poll past the call's 2 s deadline: the call would fail with DEADLINE_EXCEEDED unless the
    # broker ends the poll first
    responses = receive(stub, "g", "orders", poll_ms=20_000, timeout=2)
    assert responses[-1].status.code == Code.MESSAGE_NOT_FOUND


def test_tag_filter(native_broker, stub):
    native_broker.create_topic("orders", queues=1)
    stub.SendMessage(rpc.SendMessageRequest(messages=[message("orders", b"a", tag="TagA"),
                                                      message("orders", b"b", tag="TagB")]))
    got = receive(stub, "g", "orders", expression="TagB || TagC")
    assert [r.message.body for r in got if r.HasField("message")] == [b"b"]


@pytest.mark.parametrize(("expression", "filter_type", "code"), [
    ("TagA ||", pb.FilterType.TAG, Code.ILLEGAL_FILTER_EXPRESSION),
    ("a >> 1", pb.FilterType.SQL, Code.ILLEGAL_FILTER_EXPRESSION),
    ("'unclosed", pb.FilterType.SQL, Code.ILLEGAL_FILTER_EXPRESSION),
])
def test_bad_filters(native_broker, stub, expression, filter_type, code):
    native_broker.create_topic("orders", queues=1)
    answer = receive(stub, "g", "orders", expression=expression, filter_type=filter_type)
    assert [r.status.code for r in answer] == [code]
    assert "position" in answer[0].status.message or "TagA || TagB" in answer[0].status.message


def test_a_pull_with_an_sql92_filter_returns_only_matching_messages(native_broker, stub):
    native_broker.create_topic("orders", queues=1)
    sent = [message("orders", f"m{i}".encode()) for i in range(6)]
    for i, entry in enumerate(sent):
        entry.user_properties["n"] = str(i)
    stub.SendMessage(rpc.SendMessageRequest(messages=sent))
    answer = stub.PullMessage(rpc.PullMessageRequest(
        group=res("g"), message_queue=pb.MessageQueue(topic=res("orders"), id=0), offset=0,
        batch_size=32, filter_expression=pb.FilterExpression(type=pb.FilterType.SQL,
                                                              expression="n >= 4 OR n = 1")),
        timeout=TIMEOUT)
    assert [r.message.body for r in answer if r.HasField("message")] == [b"m1", b"m4", b"m5"]


def test_change_invisible_duration_gives_a_new_handle_and_redelivers(native_broker, stub):
    native_broker.create_topic("orders", queues=1)
    stub.SendMessage(rpc.SendMessageRequest(messages=[message("orders", b"a")]))
    first = next(r.message for r in receive(stub, "g", "orders") if r.HasField("message"))
    request = rpc.ChangeInvisibleDurationRequest(group=res("g"), topic=res("orders"),
                                                 receipt_handle=first.system_properties.receipt_handle)
    request.invisible_duration.FromMilliseconds(0)
    changed = stub.ChangeInvisibleDuration(request)
    assert changed.status.code == Code.OK
    assert changed.receipt_handle != first.system_properties.receipt_handle
    again = next(r.message for r in receive(stub, "g", "orders", poll_ms=3000) if r.HasField("message"))
    assert again.system_properties.delivery_attempt == 2


def test_forward_to_dead_letter_queue(native_broker, stub):
    native_broker.create_topic("orders", queues=1)
    stub.SendMessage(rpc.SendMessageRequest(messages=[message("orders", b"poison")]))
    got = next(r.message for r in receive(stub, "g", "orders") if r.HasField("message"))
    answer = stub.ForwardMessageToDeadLetterQueue(rpc.ForwardMessageToDeadLetterQueueRequest(
        group=res("g"), topic=res("orders"), receipt_handle=got.system_properties.receipt_handle,
        message_id=got.system_properties.message_id, delivery_attempt=1, max_delivery_attempts=1))
    assert answer.status.code == Code.OK, answer.status.message
    dead = [r.message.body for r in receive(stub, "dlq-reader", "%DLQ%g") if r.HasField("message")]
    assert dead == [b"poison"]


@pytest.mark.parametrize("handle", ["garbage", "", "a.1.2.3.ffff"])
def test_invalid_receipt_handle(native_broker, stub, handle):
    native_broker.create_topic("orders", queues=1)
    answer = stub.AckMessage(rpc.AckMessageRequest(group=res("g"), topic=res("orders"), entries=[
        rpc.AckMessageEntry(message_id="x", receipt_handle=handle)]))
    assert answer.status.code == Code.INVALID_RECEIPT_HANDLE
    assert answer.entries[0].status.code == Code.INVALID_RECEIPT_HANDLE


def test_assignment_splits_queues_between_members(native_broker):
    native_broker.create_topic("orders", queues=4)
    one = Stub(native_broker.endpoint, native_broker.user, native_broker.password, "client-a")
    two = Stub(native_broker.endpoint, native_broker.user, native_broker.password, "client-b")
    request = rpc.QueryAssignmentRequest(topic=res("orders"), group=res("g"))
    one.QueryAssignment(request)
    two.QueryAssignment(request)
    mine = [a.message_queue.id for a in one.QueryAssignment(request).assignments]
    theirs = [a.message_queue.id for a in two.QueryAssignment(request).assignments]
    assert sorted(mine + theirs) == [0, 1, 2, 3] and len(mine) == 2
    bye = two.NotifyClientTermination(rpc.NotifyClientTerminationRequest(group=res("g")))
    assert bye.status.code == Code.OK
    assert [a.message_queue.id for a in one.QueryAssignment(request).assignments] == [0, 1, 2, 3]
    one.close()
    two.close()


def test_pull_and_offsets(native_broker, stub):
    native_broker.create_topic("orders", queues=1)
    before = int(time.time() * 1000) - 1
    stub.SendMessage(rpc.SendMessageRequest(messages=[message("orders", f"m{i}".encode()) for i in range(5)]))
    mq = pb.MessageQueue(topic=res("orders"), id=0)
    pull = rpc.PullMessageRequest(group=res("g"), message_queue=mq, offset=1, batch_size=2)
    pulled = list(stub.PullMessage(pull))
    assert [r.message.body for r in pulled if r.HasField("message")] == [b"m1", b"m2"]
    assert [r.next_offset for r in pulled if r.HasField("next_offset")] == [3]
    assert pulled[-1].status.code == Code.OK

    assert stub.GetOffset(rpc.GetOffsetRequest(group=res("g"), message_queue=mq)).offset == -1
    update = rpc.UpdateOffsetRequest(group=res("g"), message_queue=mq, offset=3)
    assert stub.UpdateOffset(update).status.code == Code.OK
    assert stub.GetOffset(rpc.GetOffsetRequest(group=res("g"), message_queue=mq)).offset == 3

    def query(policy, **kw):
        return stub.QueryOffset(rpc.QueryOffsetRequest(message_queue=mq, query_offset_policy=policy, **kw))
    assert query(pb.QueryOffsetPolicy.BEGINNING).offset == 0
    assert query(pb.QueryOffsetPolicy.END).offset == 5
    request = rpc.QueryOffsetRequest(message_queue=mq, query_offset_policy=pb.QueryOffsetPolicy.TIMESTAMP)
    request.timestamp.FromMilliseconds(before)
    assert stub.QueryOffset(request).offset == 0
    assert query(pb.QueryOffsetPolicy.TIMESTAMP).status.code == Code.BAD_REQUEST


def test_pull_outside_the_queue_is_refused(native_broker, stub):
    native_broker.create_topic("orders", queues=1)
    mq = pb.MessageQueue(topic=res("orders"), id=7)
    pulled = list(stub.PullMessage(rpc.PullMessageRequest(group=res("g"), message_queue=mq, offset=0)))
    assert [r.status.code for r in pulled] == [Code.BAD_REQUEST]


def test_telemetry_answers_consumer_settings_with_the_group_policy(native_broker, stub):
    native_broker.create_topic("orders")
    native_broker.create_group("g", max_attempts=3, initial_backoff_ms=250, max_backoff_ms=4_000, fifo=True)
    entry = pb.SubscriptionEntry(topic=res("orders"),
                                 expression=pb.FilterExpression(type=pb.FilterType.TAG, expression="*"))
    settings = pb.Settings(client_type=pb.ClientType.PUSH_CONSUMER,
                           subscription=pb.Subscription(group=res("g"), subscriptions=[entry]))
    stream = stub.stub.Telemetry(iter([rpc.TelemetryCommand(settings=settings)]), metadata=stub.metadata(),
                                 timeout=TIMEOUT)
    answer = next(stream)
    assert answer.status.code == Code.OK
    got = answer.settings
    assert got.backoff_policy.max_attempts == 3
    assert got.backoff_policy.exponential_backoff.initial.ToMilliseconds() == 250
    assert got.backoff_policy.exponential_backoff.max.ToMilliseconds() == 4_000
    assert got.subscription.fifo is True
    assert got.subscription.receive_batch_size == 32
    assert got.subscription.long_polling_timeout.seconds >= 1
    members = native_broker.run(lambda b: b.describe_group("g").members)
    assert [m.client_id for m in members] == [stub.client_id]


def test_telemetry_tells_producers_the_size_limit(native_broker, stub):
    settings = pb.Settings(client_type=pb.ClientType.PRODUCER,
                           publishing=pb.Publishing(topics=[res("orders")]))
    stream = stub.stub.Telemetry(iter([rpc.TelemetryCommand(settings=settings)]), metadata=stub.metadata(),
                                 timeout=TIMEOUT)
    answer = next(stream)
    assert answer.status.code == Code.OK
    assert answer.settings.publishing.max_body_size == 16 << 20  # RabbitMQ 4's default


def test_heartbeat_without_group_succeeds(stub):
    answer = stub.Heartbeat(rpc.HeartbeatRequest(client_type=pb.ClientType.PRODUCER))
    assert answer.status.code == Code.OK


def test_a_delayed_send_answers_a_recall_handle(native_broker, stub):
    native_broker.create_topic("orders", queues=1)
    delayed = message("orders", b"later")
    delayed.system_properties.delivery_timestamp.FromMilliseconds(int(time.time() * 1000) + 60_000)
    answer = stub.SendMessage(rpc.SendMessageRequest(messages=[delayed]))
    assert answer.status.code == Code.OK and answer.entries[0].recall_handle
    recall = rpc.RecallMessageRequest(topic=res("orders"), recall_handle=answer.entries[0].recall_handle)
    assert stub.RecallMessage(recall).status.code == Code.OK
    assert stub.RecallMessage(recall).status.code == Code.NOT_FOUND
    malformed = rpc.RecallMessageRequest(topic=res("orders"), recall_handle="h")
    assert stub.RecallMessage(malformed).status.code == Code.BAD_REQUEST


def end(stub: Stub, topic: str, entry: rpc.SendResultEntry, resolution) -> rpc.EndTransactionResponse:
    return stub.EndTransaction(rpc.EndTransactionRequest(
        topic=res(topic), message_id=entry.message_id, transaction_id=entry.transaction_id,
        resolution=resolution, source=pb.TransactionSource.SOURCE_CLIENT))


def test_a_half_message_is_invisible_until_committed_and_a_rolled_back_one_never_shows(native_broker, stub):
    native_broker.create_topic("payments", queues=1, message_type=MessageType.TRANSACTION)
    tx = pb.MessageType.TRANSACTION
    first, second = (stub.SendMessage(rpc.SendMessageRequest(
        messages=[message("payments", body, message_type=tx)])).entries[0] for body in (b"a", b"b"))
    assert first.status.code == Code.OK and first.transaction_id and second.transaction_id
    assert receive(stub, "g", "payments")[-1].status.code == Code.MESSAGE_NOT_FOUND
    assert end(stub, "payments", second, pb.TransactionResolution.ROLLBACK).status.code == Code.OK
    assert end(stub, "payments", first, pb.TransactionResolution.COMMIT).status.code == Code.OK
    got = [r.message for r in receive(stub, "g", "payments") if r.HasField("message")]
    assert [(m.body, m.system_properties.message_id) for m in got] == [(b"a", first.message_id)]
    assert got[0].system_properties.message_type == pb.MessageType.TRANSACTION
    again = end(stub, "payments", first, pb.TransactionResolution.COMMIT)
    assert again.status.code == Code.INVALID_TRANSACTION_ID and "already" in again.status.message
    unknown = end(stub, "payments", rpc.SendResultEntry(message_id="m", transaction_id="t"),
                  pb.TransactionResolution.COMMIT)
    assert unknown.status.code == Code.INVALID_TRANSACTION_ID
    undecided = end(stub, "payments", second, pb.TransactionResolution.TRANSACTION_RESOLUTION_UNSPECIFIED)
    assert undecided.status.code == Code.BAD_REQUEST


def test_transactional_and_plain_messages_keep_to_their_topics(native_broker, stub):
    native_broker.create_topic("payments", queues=1, message_type=MessageType.TRANSACTION)
    native_broker.create_topic("orders", queues=1)
    tx = pb.MessageType.TRANSACTION
    plain = stub.SendMessage(rpc.SendMessageRequest(messages=[message("payments", b"p")]))
    assert plain.status.code == Code.BAD_REQUEST and "within a transaction" in plain.status.message
    half = stub.SendMessage(rpc.SendMessageRequest(messages=[message("orders", b"h", message_type=tx)]))
    assert half.status.code == Code.BAD_REQUEST and "not transactional" in half.status.message
    mixed = stub.SendMessage(rpc.SendMessageRequest(
        messages=[message("payments", b"ok"), message("payments", b"tx", message_type=tx)]))
    assert [e.status.code for e in mixed.entries] == [Code.BAD_REQUEST] * 2
    assert receive(stub, "g", "orders")[-1].status.code == Code.MESSAGE_NOT_FOUND  # nothing stored


def test_errors_carry_their_rocketmq_code(native_broker_factory):
    nb = native_broker_factory(core={"max_message_bytes": 1024, "auto_create_groups": False,
                                     "auto_create_topics": False})
    nb.create_topic("orders", queues=1)
    stub = Stub(nb.endpoint, nb.user, nb.password)
    assert route(stub, "nope").status.code == Code.TOPIC_NOT_FOUND
    assert "does not exist" in route(stub, "nope").status.message
    big = stub.SendMessage(rpc.SendMessageRequest(messages=[message("orders", b"x" * 1025)]))
    assert big.status.code == Code.MESSAGE_BODY_TOO_LARGE and "1024" in big.status.message
    assert receive(stub, "no-group", "orders")[-1].status.code == Code.CONSUMER_GROUP_NOT_FOUND
    empty = stub.SendMessage(rpc.SendMessageRequest())
    assert empty.status.code == Code.BAD_REQUEST
    stub.close()


def test_wrong_credentials_and_missing_credentials_are_refused(native_broker):
    native_broker.create_topic("orders")
    for access_key, secret in [(native_broker.user, "wrong"), ("nobody", "x"), ("", "")]:
        stub = Stub(native_broker.endpoint, access_key, secret)
        answer = route(stub, "orders")
        assert answer.status.code == Code.UNAUTHORIZED, (access_key, answer.status)
        assert answer.status.message
        stub.close()
    raw = service_pb2_grpc.MessagingServiceStub(grpc.insecure_channel(native_broker.endpoint))
    unsigned = raw.QueryRoute(rpc.QueryRouteRequest(topic=res("orders")), timeout=TIMEOUT)
    assert unsigned.status.code == Code.UNAUTHORIZED


def test_anonymous_access_acts_for_the_given_principal(native_broker_factory):
    reads_orders = Permission("guest", ResourceKind.TOPIC, "orders", frozenset({Action.SUBSCRIBE}))
    nb = native_broker_factory(allow_anonymous=True,
                               anonymous_principal=Principal("guest", permissions=(reads_orders,)))
    nb.create_topic("orders", queues=1)
    stub = Stub(nb.endpoint)
    assert route(stub, "orders").status.code == Code.OK
    refused = stub.SendMessage(rpc.SendMessageRequest(messages=[message("orders", b"x")]))
    assert refused.status.code == Code.FORBIDDEN and "guest" in refused.status.message
    stub.close()


def test_a_bug_answers_internal_error_and_the_server_carries_on(native_broker, stub):
    native_broker.create_topic("orders", queues=1)
    broker = native_broker.broker
    original = broker.route_topic

    async def broken(principal, name):
        if name == "boom":
            raise RuntimeError("simulated bug")
        return await original(principal, name)
    broker.route_topic = broken
    try:
        answer = route(stub, "boom")
        assert answer.status.code == Code.INTERNAL_ERROR
        assert "simulated bug" not in answer.status.message
        assert route(stub, "orders").status.code == Code.OK
    finally:
        broker.route_topic = original


@pytest.mark.parametrize("garbage", [
    os.urandom(4096),
    b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n",
    b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + os.urandom(512),
])
def test_garbage_on_the_port_closes_only_that_connection(native_broker, stub, garbage):
    native_broker.create_topic("orders", queues=1)
    assert route(stub, "orders").status.code == Code.OK
    with socket.create_connection(("127.0.0.1", native_broker.port), timeout=TIMEOUT) as raw:
        raw.sendall(garbage)
        raw.settimeout(TIMEOUT)
        received = b""
        while chunk := _recv(raw):
            received += chunk
    assert route(stub, "orders").status.code == Code.OK
    fresh = Stub(native_broker.endpoint, native_broker.user, native_broker.password)
    assert route(fresh, "orders").status.code == Code.OK
    fresh.close()


def _recv(sock: socket.socket) -> bytes:
    """Read until the server closes the connection (b'' or a reset)."""
    try:
        return sock.recv(65536)
    except ConnectionResetError:
        return b""


def producer_stream(stub: Stub, topic: str):
    """Open a producer's Telemetry stream naming ``topic``; (requests to send, responses)."""
    requests: queue.Queue = queue.Queue()
    requests.put(rpc.TelemetryCommand(settings=pb.Settings(
        client_type=pb.ClientType.PRODUCER, publishing=pb.Publishing(topics=[res(topic)]))))
    responses = stub.stub.Telemetry(iter(requests.get, None), metadata=stub.metadata(), timeout=30)
    assert next(responses).status.code == Code.OK
    return requests, responses


def test_a_transaction_check_goes_only_to_a_producer_that_may_publish_to_the_topic(native_broker_factory):
    nb = native_broker_factory(core={"transaction_check_delay_ms": 100, "transaction_check_interval_ms": 100,
                                     "transaction_check_max": 1000})
    nb.create_topic("payments", queues=1, message_type=MessageType.TRANSACTION)
    nb.create_user("low", "secret")
    low, admin = Stub(nb.endpoint, "low", "secret"), Stub(nb.endpoint, nb.user, nb.password)
    low_requests, low_responses = producer_stream(low, "payments")
    sent = admin.SendMessage(rpc.SendMessageRequest(messages=[
        message("payments", b"private", message_type=pb.MessageType.TRANSACTION)])).entries[0]
    wait_for(lambda: nb.run(lambda b: b._engine.transactions._open[sent.offset].checks) >= 3)
    admin_requests, admin_responses = producer_stream(admin, "payments")
    check = next(admin_responses).recover_orphaned_transaction_command
    assert (check.transaction_id, check.message.body) == (sent.transaction_id, b"private")
    assert check.message.system_properties.message_id == sent.message_id
    low_requests.put(None)
    admin_requests.put(None)
    assert not any(r.HasField("recover_orphaned_transaction_command") for r in low_responses)
    low.close()
    admin.close()
