"""The official RocketMQ 5 Python client (``rocketmq-python-client``) against Sluice, unchanged.

Its timings set the pace: a push consumer asks for its assignment every 5 s, every client
heartbeats every 10 s, and a simple consumer long polls for ``await_duration`` seconds. Tests
wait on events with generous timeouts, never on fixed sleeps.
"""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from contextlib import contextmanager

import grpc
import pytest
from rocketmq import (ClientConfiguration, ConsumeResult, Credentials, FilterExpression,
                      LitePushConsumer, LiteSimpleConsumer, Message, MessageListener, Producer, PushConsumer,
                      SimpleConsumer)
from rocketmq.grpc_protocol import Code, FilterType, TransactionResolution
from rocketmq.v5.producer import TransactionChecker
from rocketmq.v5.exception import (BadRequestException, IllegalArgumentException,
                                   LiteSubscriptionQuotaExceededException, NotFoundException,
                                   PayloadTooLargeException)

from core.model import SYSTEM, MessageType

WAIT = 60
"""Seconds any single expected event may take (assignment scans run every 5 s)."""
REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


REQUEST_TIMEOUT_S = 10
"""The client's RPC deadline (its default is 3 s): a loaded 2-core CI machine must not turn a
slow answer into a failed call."""


def config(nb, user: str | None = None, password: str | None = None) -> ClientConfiguration:
    return ClientConfiguration(nb.endpoint, Credentials(user or nb.user, password or nb.password),
                               request_timeout=REQUEST_TIMEOUT_S)


@pytest.fixture(autouse=True)
def main_thread_event_loop():
    """The official client builds gRPC objects on the calling thread, where grpc asks asyncio
    for the current event loop. Once anything in this process has run ``asyncio.run`` (other
    test modules do), that question raises instead of making a loop, and the client's
    telemetry stream, then its route lookup, fail at random. Give the main thread a loop."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    yield
    asyncio.set_event_loop(None)
    loop.close()


@contextmanager
def started(client):
    """Start a client; shut it down afterwards (NotifyClientTermination included)."""
    client.startup()
    try:
        yield client
    finally:
        if client.is_running:
            client.shutdown()


def new_message(topic: str, body: bytes, tag: str | None = None, keys: tuple[str, ...] = (),
                properties: dict[str, str] | None = None, group: str | None = None) -> Message:
    message = Message()
    message.topic = topic
    message.body = body
    if tag:
        message.tag = tag
    if keys:
        Message.keys.fset(message, *keys)  # the setter takes the keys as separate arguments
    for key, value in (properties or {}).items():
        message.add_property(key, value)
    if group:
        message.message_group = group
    return message


def send_all(producer: Producer, topic: str, bodies: list[bytes], **kw) -> None:
    for body in bodies:
        producer.send(new_message(topic, body, **kw))


def receive_until(consumer: SimpleConsumer, count: int, *, invisible_s: int = 30, ack: bool = True,
                  timeout: float = WAIT) -> list:
    """Receive until ``count`` messages arrived (acking them unless told not to)."""
    got: list = []
    deadline = time.monotonic() + timeout
    while len(got) < count:
        assert time.monotonic() < deadline, f"received {len(got)} of {count} messages in {timeout}s"
        for message in consumer.receive(32, invisible_s):
            got.append(message)
            if ack:
                consumer.ack(message)
    return got


def wait_for(predicate: Callable[[], object], timeout: float = WAIT, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while not (result := predicate()):
        assert time.monotonic() < deadline, f"{what} not met within {timeout}s"
        time.sleep(0.1)
    return result


def once_reachable(action: Callable[[], object], timeout: float = WAIT):
    """Run ``action`` until the client's channel has reconnected (it fails fast meanwhile)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return action()
        except grpc.aio.AioRpcError as error:
            if error.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


class Recorder(MessageListener):
    """A push listener that records every delivery and answers with ``decide(message)``."""

    def __init__(self, decide: Callable[[Message], ConsumeResult] = lambda m: ConsumeResult.SUCCESS):
        self.decide = decide
        self.deliveries: list[Message] = []
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)

    def consume(self, message: Message) -> ConsumeResult:
        with self.lock:
            self.deliveries.append(message)
            self.changed.notify_all()
        return self.decide(message)

    def bodies(self) -> list[bytes]:
        with self.lock:
            return [m.body for m in self.deliveries]

    def wait(self, predicate: Callable[[list[Message]], bool], timeout: float = WAIT) -> None:
        with self.lock:
            assert self.changed.wait_for(lambda: predicate(self.deliveries), timeout), \
                f"push deliveries so far: {[(m.body, m.delivery_attempt) for m in self.deliveries]}"


def assignment(nb, group: str) -> dict[str, list[int]]:
    """client id -> queues core assigned, for the group's live members."""
    def read(broker):
        return {m.client_id: sorted(q for _, q in m.queues) for m in broker.describe_group(group).members}
    try:
        return nb.run(read)
    except Exception:  # noqa: BLE001 - the group may not exist yet
        return {}


# --- produce and consume ---

def test_send_receive_ack_with_a_simple_consumer(native_broker):
    native_broker.create_topic("orders", queues=4)
    with started(Producer(config(native_broker), ("orders",))) as producer:
        receipt = producer.send(new_message("orders", b"first", tag="TagA", keys=("k1",),
                                            properties={"color": "red"}))
        assert receipt.message_id
        send_all(producer, "orders", [f"m{i}".encode() for i in range(9)])
    subscription = {"orders": FilterExpression()}
    with started(SimpleConsumer(config(native_broker), "g", subscription, await_duration=2)) as consumer:
        got = receive_until(consumer, 10)
        assert sorted(m.body for m in got) == sorted([b"first"] + [f"m{i}".encode() for i in range(9)])
        first = next(m for m in got if m.body == b"first")
        assert (first.tag, first.keys, first.properties) == ("TagA", {"k1"}, {"color": "red"})
        assert first.message_id == receipt.message_id and first.delivery_attempt == 1
        assert consumer.receive(32, 30) == []  # all acked: nothing comes back


def test_tag_filter(native_broker):
    native_broker.create_topic("orders", queues=2)
    with started(Producer(config(native_broker), ("orders",))) as producer:
        for i in range(6):
            producer.send(new_message("orders", f"m{i}".encode(), tag="TagA" if i % 2 else "TagB"))
    subscription = {"orders": FilterExpression("TagA || TagC")}
    with started(SimpleConsumer(config(native_broker), "g", subscription, await_duration=2)) as consumer:
        got = receive_until(consumer, 3)
        assert sorted(m.body for m in got) == [b"m1", b"m3", b"m5"]
        assert consumer.receive(32, 30) == []


def test_sql92_filter_with_a_simple_consumer(native_broker):
    native_broker.create_topic("orders", queues=2)
    with started(Producer(config(native_broker), ("orders",))) as producer:
        for i in range(8):
            producer.send(new_message("orders", f"m{i}".encode(), tag="TagA" if i % 2 else "TagB",
                                      properties={"amount": str(i * 10), "region": "eu" if i < 6 else "us"}))
    selector = FilterExpression("region = 'eu' AND amount BETWEEN 20 AND 50 AND TAGS = 'TagA'",
                                FilterType.SQL)
    with started(SimpleConsumer(config(native_broker), "g", {"orders": selector}, await_duration=2)) as consumer:
        got = receive_until(consumer, 2)
        assert sorted(m.body for m in got) == [b"m3", b"m5"]
        assert consumer.receive(32, 30) == []


def test_sql92_filter_with_a_push_consumer(native_broker):
    native_broker.create_topic("orders", queues=2)
    listener = Recorder()
    selector = FilterExpression("priority IS NOT NULL AND priority >= 5", FilterType.SQL)
    with started(PushConsumer(config(native_broker), "urgent", listener, {"orders": selector})), \
            started(Producer(config(native_broker), ("orders",))) as producer:
        for i in range(10):
            properties = {"priority": str(i)} if i % 3 else {}
            producer.send(new_message("orders", f"m{i}".encode(), properties=properties))
        listener.wait(lambda ds: len(ds) >= 3)
        producer.send(new_message("orders", b"last", properties={"priority": "9"}))
        listener.wait(lambda ds: b"last" in [m.body for m in ds])
        assert sorted(listener.bodies()) == [b"last", b"m5", b"m7", b"m8"]


def test_delayed_messages_arrive_when_due_and_a_recalled_one_never(native_broker):
    native_broker.create_topic("reminders", queues=2, message_type=MessageType.DELAY)
    with started(Producer(config(native_broker), ("reminders",))) as producer:
        due = int(time.time() * 1000) + 2000
        receipts = {}
        for name in ("keep", "recall"):
            message = new_message("reminders", name.encode(), properties={"kind": name})
            message.delivery_timestamp = due
            receipts[name] = producer.send(message)
        assert receipts["keep"].recall_handle
        assert producer.recall_message("reminders", receipts["recall"].recall_handle) \
            == receipts["recall"].message_id
        subscription = {"reminders": FilterExpression()}
        with started(SimpleConsumer(config(native_broker), "g", subscription, await_duration=5)) as consumer:
            got = receive_until(consumer, 1)
            arrived = int(time.time() * 1000)
            assert [(m.body, m.message_id) for m in got] == [(b"keep", receipts["keep"].message_id)]
            assert due <= arrived < due + 1500
            assert consumer.receive(32, 30) == []
        with pytest.raises(NotFoundException):
            producer.recall_message("reminders", receipts["keep"].recall_handle)


class Ledger(TransactionChecker):
    """A producer's local record of its transactions: what it answers when the broker asks."""

    def __init__(self, decisions: dict[bytes, TransactionResolution]) -> None:
        self.decisions = decisions
        self.asked: list[tuple[bytes, str]] = []
        self.changed = threading.Condition()

    def check(self, message: Message) -> TransactionResolution:
        with self.changed:
            self.asked.append((message.body, message.message_id))
            self.changed.notify_all()
        return self.decisions[message.body]

    def wait(self, count: int) -> None:
        with self.changed:
            assert self.changed.wait_for(lambda: len(self.asked) >= count, WAIT), self.asked


def test_transactions_commit_roll_back_and_are_checked_back_when_left_open(native_broker_factory):
    nb = native_broker_factory(core={"transaction_check_delay_ms": 1000,
                                     "transaction_check_interval_ms": 1000})
    nb.create_topic("payments", queues=2, message_type=MessageType.TRANSACTION)
    ledger = Ledger({b"open-commit": TransactionResolution.COMMIT,
                     b"open-rollback": TransactionResolution.ROLLBACK})
    with started(Producer(config(nb), ("payments",), checker=ledger)) as producer:
        receipts, transactions = {}, {}
        for body in (b"commit", b"rollback", b"open-commit", b"open-rollback"):
            transaction = transactions[body] = producer.begin_transaction()
            receipts[body] = producer.send(new_message("payments", body, keys=("order-1",)), transaction)
            assert receipts[body].transaction_id
            if body == b"commit":
                transaction.commit()
            elif body == b"rollback":
                transaction.rollback()
        ledger.wait(2)
        assert sorted(ledger.asked) == sorted((b, receipts[b].message_id)
                                              for b in (b"open-commit", b"open-rollback"))
        subscription = {"payments": FilterExpression()}
        with started(SimpleConsumer(config(nb), "g", subscription, await_duration=2)) as consumer:
            got = receive_until(consumer, 2)
            assert sorted((m.body, m.message_id) for m in got) == sorted(
                (b, receipts[b].message_id) for b in (b"commit", b"open-commit"))
            assert got[0].keys == {"order-1"}
            assert consumer.receive(32, 30) == []
        with pytest.raises(Exception, match="already"):  # decided: a second commit is refused
            transactions[b"commit"].commit()
    assert nb.run(lambda b: b._engine.transactions.open_count) == 0


def test_an_unanswered_transaction_is_discarded_after_the_check_limit(native_broker_factory, caplog):
    nb = native_broker_factory(core={"transaction_check_delay_ms": 200,
                                     "transaction_check_interval_ms": 200, "transaction_check_max": 3})
    nb.create_topic("payments", queues=1, message_type=MessageType.TRANSACTION)
    with started(Producer(config(nb), ("payments",), checker=Ledger({}))) as producer:
        transaction = producer.begin_transaction()
        producer.send(new_message("payments", b"forgotten"), transaction)
        wait_for(lambda: nb.run(lambda b: b._engine.transactions.open_count) == 0,
                 what="the open transaction to be discarded")
    assert "checked 3 times without a decision" in caplog.text
    with started(SimpleConsumer(config(nb), "g", {"payments": FilterExpression()},
                                await_duration=1)) as consumer:
        assert consumer.receive(32, 30) == []


def test_priority_messages_are_received_highest_first(native_broker):
    native_broker.create_topic("tasks", queues=4, message_type=MessageType.PRIORITY)
    with started(Producer(config(native_broker), ("tasks",))) as producer:
        for i, priority in enumerate([0, 3, 1, 3, 2, 0]):
            message = new_message("tasks", f"{priority}-{i}".encode())
            message.priority = priority
            producer.send(message)
    subscription = {"tasks": FilterExpression()}
    with started(SimpleConsumer(config(native_broker), "g", subscription, await_duration=2)) as consumer:
        got = []
        while len(got) < 6:
            for message in consumer.receive(1, 30):
                got.append((message.body, message.priority))
                consumer.ack(message)
    assert got == [(b"3-1", 3), (b"3-3", 3), (b"2-4", 2), (b"1-2", 1), (b"0-0", 0), (b"0-5", 0)]


def test_a_push_consumer_takes_a_backlog_highest_priority_first(native_broker):
    native_broker.create_topic("tasks", queues=3, message_type=MessageType.PRIORITY)
    with started(Producer(config(native_broker), ("tasks",))) as producer:
        for i in range(30):
            message = new_message("tasks", f"{i % 3}-{i}".encode())
            message.priority = i % 3
            producer.send(message)
    listener = Recorder()
    with started(PushConsumer(config(native_broker), "g", listener, {"tasks": FilterExpression()})):
        listener.wait(lambda ds: len(ds) >= 30)
    priorities = [m.priority for m in listener.deliveries]
    assert sorted(priorities) == sorted([0, 1, 2] * 10)
    # the listener runs on a thread pool, so calls may interleave: compare where each lands
    mean_position = {p: sum(i for i, q in enumerate(priorities) if q == p) / 10 for p in (0, 2)}
    assert mean_position[2] < mean_position[0], priorities


def subscribe_lite(consumer: LiteSimpleConsumer | LitePushConsumer, lite_topic: str) -> None:
    """Subscribe as docs/features.md says. The client (5.1.x) counts its quota as 0 until the
    broker's settings arrive, a moment after startup, so the first try may be refused; and it
    sends the name split into characters, so ``subscribe_lite_all`` follows, stating its lite
    topics whole (it does so every 30 s by itself)."""
    deadline = time.monotonic() + WAIT
    while True:
        try:
            consumer.subscribe_lite(lite_topic)
            break
        except LiteSubscriptionQuotaExceededException:
            assert time.monotonic() < deadline, "the broker's settings never arrived"
            time.sleep(0.1)
    consumer.subscribe_lite_all()


def test_lite_topics_are_created_on_send_and_consumed_in_order_as_subscribed(native_broker):
    native_broker.create_topic("chats", queues=4, message_type=MessageType.LITE)
    with started(Producer(config(native_broker), ("chats",))) as producer:
        for i in range(4):
            for session in ("s1", "s2", "s3"):
                message = new_message("chats", f"{session}-{i}".encode())
                message.lite_topic = session
                producer.send(message)
    consumer = LiteSimpleConsumer("chats", config(native_broker), "assistants", await_duration=2)
    with started(consumer):
        subscribe_lite(consumer, "s1")
        subscribe_lite(consumer, "s2")
        got = receive_until(consumer, 8)
        for session in ("s1", "s2"):
            assert [m.body for m in got if m.lite_topic == session] == [f"{session}-{i}".encode() for i in range(4)]
        consumer.unsubscribe_lite("s1")
        subscribe_lite(consumer, "s3")
        assert sorted(m.body for m in receive_until(consumer, 4)) == [f"s3-{i}".encode() for i in range(4)]
        assert consumer.receive(32, 30) == []


def test_a_message_consumed_by_the_official_client_has_its_path_traced(native_broker_factory):
    nb = native_broker_factory(core={"message_trace": True})
    nb.create_topic("orders", queues=1)
    with started(Producer(config(nb), ("orders",))) as producer:
        receipt = producer.send(new_message("orders", b"traced"))
    consumer = SimpleConsumer(config(nb), "billing", {"orders": FilterExpression()}, await_duration=2)
    with started(consumer):
        [first] = receive_until(consumer, 1, ack=False)
        consumer.change_invisible_duration(first, 1)
        [again] = receive_until(consumer, 1)
    trace = nb.run(lambda b: b.trace_message(SYSTEM, receipt.message_id))
    assert trace.message.body == b"traced"
    assert [(e.event, e.group, e.client, e.attempt) for e in trace.events] == [
        ("delivered", "billing", consumer.client_id, 1),
        ("retried", "billing", consumer.client_id, 1),
        ("retried", "billing", consumer.client_id, 2),
        ("delivered", "billing", consumer.client_id, 2),
        ("acked", "billing", consumer.client_id, 0)]
    assert again.delivery_attempt == 2


def test_a_lite_push_consumer_gets_its_lite_topics_in_order(native_broker):
    native_broker.create_topic("chats", queues=2, message_type=MessageType.LITE)
    with started(Producer(config(native_broker), ("chats",))) as producer:
        for i in range(5):
            for session in ("s1", "s2"):
                message = new_message("chats", f"{session}-{i}".encode())
                message.lite_topic = session
                producer.send(message)
    listener = Recorder()
    with started(LitePushConsumer(config(native_broker), "assistants", "chats", listener)) as consumer:
        subscribe_lite(consumer, "s2")
        listener.wait(lambda ds: len(ds) >= 5)
    # handed out in order; the listener's threads may run them in any order
    assert sorted((m.lite_topic, m.body) for m in listener.deliveries) == \
        [("s2", f"s2-{i}".encode()) for i in range(5)]


def test_push_consumer_retries_a_failure_then_succeeds(native_broker):
    native_broker.create_topic("orders", queues=2)
    listener = Recorder(lambda m: ConsumeResult.FAILURE if m.delivery_attempt == 1 else ConsumeResult.SUCCESS)
    consumer = PushConsumer(config(native_broker), "g", listener, {"orders": FilterExpression()})
    with started(consumer), started(Producer(config(native_broker), ("orders",))) as producer:
        producer.send(new_message("orders", b"flaky"))
        listener.wait(lambda ds: len(ds) >= 2)
        first_two = [(m.body, m.delivery_attempt) for m in listener.deliveries[:2]]
        assert first_two == [(b"flaky", 1), (b"flaky", 2)]
        producer.send(new_message("orders", b"marker"))  # delivered after any stray redelivery
        listener.wait(lambda ds: b"marker" in [m.body for m in ds])
    assert listener.bodies().count(b"flaky") == 2


def test_push_consumer_exception_counts_as_failure(native_broker):
    native_broker.create_topic("orders", queues=1)

    def decide(message: Message) -> ConsumeResult:
        if message.delivery_attempt == 1:
            raise RuntimeError("listener bug")
        return ConsumeResult.SUCCESS
    listener = Recorder(decide)
    with started(PushConsumer(config(native_broker), "g", listener, {"orders": FilterExpression()})), \
            started(Producer(config(native_broker), ("orders",))) as producer:
        producer.send(new_message("orders", b"x"))
        listener.wait(lambda ds: [m.delivery_attempt for m in ds] == [1, 2])


def test_dead_letter_after_max_attempts(native_broker):
    native_broker.create_topic("orders", queues=1)
    native_broker.create_topic("%DLQ%fragile", queues=1)  # so the reader can long-poll it
    native_broker.create_group("fragile", max_attempts=2, initial_backoff_ms=100, max_backoff_ms=500)
    listener = Recorder(lambda m: ConsumeResult.FAILURE)
    with started(PushConsumer(config(native_broker), "fragile", listener, {"orders": FilterExpression()})), \
            started(Producer(config(native_broker), ("orders",))) as producer:
        producer.send(new_message("orders", b"poison", tag="T"))
        listener.wait(lambda ds: len(ds) >= 2)
        dlq = {"%DLQ%fragile": FilterExpression()}
        with started(SimpleConsumer(config(native_broker), "dlq-reader", dlq, await_duration=2)) as reader:
            dead = receive_until(reader, 1)
    assert [m.body for m in dead] == [b"poison"]
    assert dead[0].properties["sluice.dlq.origin_topic"] == "orders"
    assert [m.delivery_attempt for m in listener.deliveries] == [1, 2]


def test_fifo_group_keeps_a_message_group_in_order(native_broker):
    native_broker.create_topic("fifo", queues=4, message_type=MessageType.FIFO)
    native_broker.create_group("ordered", fifo=True)
    listener = Recorder()
    with started(Producer(config(native_broker), ("fifo",))) as producer:
        for i in range(10):
            producer.send(new_message("fifo", f"{i}".encode(), group="order-1"))
    consumer = PushConsumer(config(native_broker), "ordered", listener, {"fifo": FilterExpression()})
    with started(consumer):
        assert consumer.fifo
        listener.wait(lambda ds: len(ds) >= 10)
    assert listener.bodies()[:10] == [f"{i}".encode() for i in range(10)]
    assert {m.message_group for m in listener.deliveries} == {"order-1"}


# --- clustering ---

def test_two_push_consumers_split_the_queues_and_one_takes_over_when_the_other_stops(native_broker):
    native_broker.create_topic("orders", queues=4)
    one, two = Recorder(), Recorder()
    first = PushConsumer(config(native_broker), "g", one, {"orders": FilterExpression()})
    second = PushConsumer(config(native_broker), "g", two, {"orders": FilterExpression()})
    with started(Producer(config(native_broker), ("orders",))) as producer, started(first):
        second.startup()
        try:
            wait_for(lambda: sorted(len(q) for q in assignment(native_broker, "g").values()) == [2, 2],
                     what="two members with two queues each")
            send_all(producer, "orders", [f"a{i}".encode() for i in range(20)])
            wait_for(lambda: len(one.bodies()) + len(two.bodies()) >= 20, what="20 deliveries")
            assert one.bodies() and two.bodies(), "both members should have received some"
            assert sorted(one.bodies() + two.bodies()) == sorted(f"a{i}".encode() for i in range(20))
        finally:
            second.shutdown()
        wait_for(lambda: assignment(native_broker, "g") == {first.client_id: [0, 1, 2, 3]},
                 what="the remaining member owning every queue")
        send_all(producer, "orders", [f"b{i}".encode() for i in range(20)])
        one.wait(lambda ds: sum(m.body.startswith(b"b") for m in ds) >= 20)
    assert not any(body.startswith(b"b") for body in two.bodies())


def test_two_simple_consumers_share_messages_and_one_gets_everything_after_the_other_stops(native_broker):
    native_broker.create_topic("orders", queues=4)
    subscription = {"orders": FilterExpression()}
    with started(Producer(config(native_broker), ("orders",))) as producer, \
            started(SimpleConsumer(config(native_broker), "g", subscription, await_duration=1)) as one:
        two = SimpleConsumer(config(native_broker), "g", subscription, await_duration=1)
        with started(two):
            send_all(producer, "orders", [f"a{i}".encode() for i in range(20)])
            got: dict[SimpleConsumer, list] = {one: [], two: []}
            deadline = time.monotonic() + WAIT
            while len(got[one]) + len(got[two]) < 20:  # small batches, taking turns
                assert time.monotonic() < deadline, f"received {len(got[one]) + len(got[two])} of 20"
                for consumer in (one, two):
                    for message in consumer.receive(2, 60):
                        got[consumer].append(message.body)
                        consumer.ack(message)
            assert got[one] and got[two], "both consumers should have received some"
            assert sorted(got[one] + got[two]) == sorted(f"a{i}".encode() for i in range(20))
            send_all(producer, "orders", [b"held"])
            held = receive_until(two, 1, invisible_s=2, ack=False)  # two stops holding it, unacked
        send_all(producer, "orders", [f"b{i}".encode() for i in range(5)])
        after = receive_until(one, 6)
    assert held[0].body == b"held"
    assert sorted(m.body for m in after) == sorted([b"held"] + [f"b{i}".encode() for i in range(5)])
    assert next(m for m in after if m.body == b"held").delivery_attempt == 2


CONSUMER_CHILD = """
import sys, threading
from rocketmq import (ClientConfiguration, ConsumeResult, Credentials, FilterExpression,
                      MessageListener, PushConsumer)
class Listener(MessageListener):
    def consume(self, message):
        print("GOT", message.body.decode(), flush=True)
        return ConsumeResult.SUCCESS
endpoint, user, password = sys.argv[1:4]
consumer = PushConsumer(ClientConfiguration(endpoint, Credentials(user, password)), "g", Listener(),
                        {"orders": FilterExpression()})
consumer.startup()
print("STARTED", consumer.client_id, flush=True)
threading.Event().wait()
"""


def test_a_push_consumer_that_stops_heartbeating_loses_its_queues(native_broker_factory):
    # Short long polls and invisibility, so nothing the frozen member asked for outlives its eviction.
    nb = native_broker_factory(core={"max_long_poll_ms": 3_000, "default_invisible_ms": 5_000})
    nb.create_topic("orders", queues=4)
    child = subprocess.Popen([sys.executable, "-c", CONSUMER_CHILD, nb.endpoint, nb.user, nb.password],
                             cwd=REPO, stdout=subprocess.PIPE, text=True)
    survivor_listener = Recorder()
    try:
        line = child.stdout.readline()
        assert line.startswith("STARTED"), line
        child_id = line.split()[1]
        survivor = PushConsumer(config(nb), "g", survivor_listener, {"orders": FilterExpression()})
        with started(survivor), started(Producer(config(nb), ("orders",))) as producer:
            wait_for(lambda: sorted(assignment(nb, "g")) == sorted([child_id, survivor.client_id])
                     and all(assignment(nb, "g").values()), what="both members assigned")
            child.send_signal(signal.SIGSTOP)  # alive as far as TCP knows, but silent
            wait_for(lambda: assignment(nb, "g") == {survivor.client_id: [0, 1, 2, 3]},
                     what="the frozen member evicted after the heartbeat timeout")
            send_all(producer, "orders", [f"m{i}".encode() for i in range(12)])
            survivor_listener.wait(lambda ds: {m.body for m in ds} >= {f"m{i}".encode() for i in range(12)})
    finally:
        child.kill()
        child.wait(30)
        child.stdout.close()


# --- errors the client sees ---

def test_wrong_credentials_are_refused(native_broker):
    native_broker.create_topic("orders")
    with started(Producer(config(native_broker, password="wrong"), ("orders",))) as producer:
        with pytest.raises(Exception, match="route"):
            producer.send(new_message("orders", b"x"))
    consumer = SimpleConsumer(config(native_broker, user="nobody", password="x"), "g",
                              {"orders": FilterExpression()}, await_duration=1)
    with started(consumer):
        with pytest.raises(Exception):
            consumer.receive(1, 30)


def test_unknown_topic_is_an_error_when_topics_are_not_created_on_first_use(native_broker_factory):
    nb = native_broker_factory(core={"auto_create_topics": False})
    with started(Producer(config(nb))) as producer:
        with pytest.raises(Exception, match="route"):
            producer.send(new_message("no-such-topic", b"x"))


def test_a_topic_is_created_by_its_first_send_from_a_user_who_may_publish(native_broker):
    with started(Producer(config(native_broker), ("fresh",))) as producer:  # looks up its route
        assert "fresh" not in topic_names(native_broker)
        receipt = producer.send(new_message("fresh", b"first"))
    assert native_broker.run(lambda b: b.get_topic("fresh")).queue_count == 4
    with started(SimpleConsumer(config(native_broker), "g", {"fresh": FilterExpression()},
                                await_duration=2)) as consumer:
        assert [m.message_id for m in receive_until(consumer, 1)] == [receipt.message_id]


def test_a_consumer_of_a_missing_topic_creates_no_topic(native_broker):
    consumer = SimpleConsumer(config(native_broker), "g", {"typo": FilterExpression()},
                              await_duration=1)
    with started(consumer):
        with pytest.raises(Exception):
            consumer.receive(1, 30)
    assert "typo" not in topic_names(native_broker)


def topic_names(nb) -> set[str]:
    return {topic.name for topic in nb.run(lambda b: b.list_topics())}


def test_oversized_message_is_refused(native_broker_factory):
    nb = native_broker_factory(core={"max_message_bytes": 1024})
    nb.create_topic("orders", queues=1)
    with started(Producer(config(nb), ("orders",))) as producer:
        producer.send(new_message("orders", b"x" * 1024))
        with pytest.raises((PayloadTooLargeException, IllegalArgumentException), match="1024"):
            producer.send(new_message("orders", b"x" * 1025))


@pytest.mark.parametrize(("expression", "error", "code"), [
    (FilterExpression("TagA ||"), BadRequestException, Code.ILLEGAL_FILTER_EXPRESSION),
    (FilterExpression("a > 1 AND (b = 'x'", FilterType.SQL), BadRequestException,
     Code.ILLEGAL_FILTER_EXPRESSION),
])
def test_malformed_tag_and_sql92_filters_are_refused(native_broker, expression, error, code):
    native_broker.create_topic("orders", queues=1)
    consumer = SimpleConsumer(config(native_broker), "g", {"orders": expression}, await_duration=1)
    with started(consumer):
        with pytest.raises(error) as raised:
            consumer.receive(1, 30)
    assert raised.value.code == code


def test_invalid_receipt_handle_is_refused(native_broker):
    native_broker.create_topic("orders", queues=1)
    with started(Producer(config(native_broker), ("orders",))) as producer:
        producer.send(new_message("orders", b"x"))
    with started(SimpleConsumer(config(native_broker), "g", {"orders": FilterExpression()},
                                await_duration=2)) as consumer:
        message = receive_until(consumer, 1, ack=False)[0]
        real = message.receipt_handle
        message.receipt_handle = f"bogus-{uuid.uuid4().hex}"
        with pytest.raises(BadRequestException) as raised:
            consumer.ack(message)
        assert raised.value.code == Code.INVALID_RECEIPT_HANDLE
        message.receipt_handle = real
        consumer.ack(message)


def test_change_invisible_duration_redelivers(native_broker):
    native_broker.create_topic("orders", queues=1)
    with started(Producer(config(native_broker), ("orders",))) as producer:
        producer.send(new_message("orders", b"later"))
    with started(SimpleConsumer(config(native_broker), "g", {"orders": FilterExpression()},
                                await_duration=2)) as consumer:
        message = receive_until(consumer, 1, ack=False)[0]
        consumer.change_invisible_duration(message, 1)
        again = receive_until(consumer, 1)[0]
    assert (again.body, again.delivery_attempt) == (b"later", 2)



# --- the broker killed and restarted ---

def test_acknowledged_sends_survive_sigkill_and_old_receipts_expire(native_broker_process):
    proc = native_broker_process(topics=[("orders", 2)])
    bodies = [f"m{i}".encode() for i in range(20)]
    with started(Producer(config(proc), ("orders",))) as producer:
        send_all(producer, "orders", bodies)
    consumer = SimpleConsumer(config(proc), "g", {"orders": FilterExpression()}, await_duration=2)
    with started(consumer):
        before = receive_until(consumer, 1, ack=False)[0]
        proc.kill()
        proc.start()  # same data directory, same port: the client's channel reconnects
        with pytest.raises(BadRequestException) as raised:
            once_reachable(lambda: consumer.ack(before))
        assert raised.value.code == Code.INVALID_RECEIPT_HANDLE
        assert "restarted" in str(raised.value)
        after = receive_until(consumer, 20)
    assert sorted(m.body for m in after) == sorted(bodies)
