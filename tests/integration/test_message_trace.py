"""Message trace end to end: the Sluice SDK sends and pop-consumes through the native protocol of
a broker started by the composition root with ``core.message_trace`` on; one message is acked,
one retried then acked, one retried until dead-lettered; their traces are read through the admin
API and the ``sluice message trace`` command."""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import threading
import sys
import time

import pytest

from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc

from core.model import SYSTEM, GroupConfig, RetryPolicy, TopicConfig
from sluice.client import ClientConfig, Message, Producer, ReceivedMessage, SimpleConsumer
from tests.integration.native.test_server import Stub, message
from tests.integration.test_admin_api import BrokerThread, Http

TIMEOUT = 20
SLUICE = [sys.executable, "-m", "sluice.cli"]


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    thread = BrokerThread(str(tmp_path_factory.mktemp("trace") / "data"),
                          **{"core.message_trace": True})
    yield thread
    thread.stop()


def sdk_config(broker: BrokerThread) -> ClientConfig:
    return ClientConfig(f"127.0.0.1:{broker.running.native.port}", "sluice", "sluice",
                        request_timeout=5)


async def consume(broker: BrokerThread) -> tuple[dict[bytes, str], str]:
    """Send ok, retry and dead; ack ok at once, retry on its second delivery, and nack dead until
    the broker dead-letters it. Returns ({body: message id}, the consumer's client id)."""
    async with Producer(sdk_config(broker)) as producer:
        ids = {m.body: (await producer.send(m)).message_id
               for m in (Message("jobs", b"ok"), Message("jobs", b"retry"), Message("jobs", b"dead"))}
    async with SimpleConsumer(sdk_config(broker), "workers", {"jobs": "*"},
                              invisible_duration=30, await_duration=1) as consumer:
        acked: set[bytes] = set()
        deadline = time.monotonic() + TIMEOUT
        while acked != {b"ok", b"retry"}:
            assert time.monotonic() < deadline, f"only {acked} were acked"
            for message in await consumer.receive(16):
                await settle(consumer, message, acked)
        await wait_for_dead_letter(consumer, broker)
        return ids, consumer.client_id


async def settle(consumer: SimpleConsumer, message: ReceivedMessage, acked: set[bytes]) -> None:
    if message.body == b"ok" or (message.body == b"retry" and message.delivery_attempt == 2):
        await consumer.ack(message)
        acked.add(message.body)
    else:
        await consumer.change_invisible_duration(message, 0.1)


async def wait_for_dead_letter(consumer: SimpleConsumer, broker: BrokerThread) -> None:
    """Receive (nacking ``dead`` each time) until the group's dead-letter topic holds it."""
    deadline = time.monotonic() + TIMEOUT
    while not await asyncio.to_thread(broker.call, dead_letters(broker)):
        assert time.monotonic() < deadline, "the message was not dead-lettered"
        for message in await consumer.receive(16):
            await consumer.change_invisible_duration(message, 0.1)


async def dead_letters(broker: BrokerThread) -> int:
    """How many messages the group's dead-letter topic holds (on the broker's loop)."""
    core = broker.running.broker
    if "%DLQ%workers" not in {t.name for t in core.list_topics()}:
        return 0
    return len((await core.pull(SYSTEM, "check", "%DLQ%workers", 0, 0)).messages)


def test_traces_through_the_admin_api_and_the_cli(broker):
    broker.call(broker.running.broker.create_topic(SYSTEM, TopicConfig("jobs", queue_count=1)))
    broker.call(broker.running.broker.create_group(
        SYSTEM, GroupConfig("workers", retry=RetryPolicy(max_attempts=2))))
    ids, client_id = asyncio.run(asyncio.wait_for(consume(broker), 120))
    http = Http(broker.running.admin_url)

    def steps(body: bytes) -> list[tuple]:
        status, trace, _ = http("GET", f"/messages/{ids[body]}/trace")
        assert status == 200 and trace["message"]["body_text"] == body.decode()
        assert not trace["truncated"] and trace["max_events"] == 1000
        times = [e["time_ms"] for e in trace["events"]]
        assert times == sorted(times)
        return [(e["event"], e["group"], e["client"], e["attempt"]) for e in trace["events"]]

    stored = ("stored", "", "", 0)
    assert steps(b"ok") == [stored, ("delivered", "workers", client_id, 1),
                            ("acked", "workers", client_id, 0)]
    assert steps(b"retry") == [stored, ("delivered", "workers", client_id, 1),
                               ("retried", "workers", client_id, 1),
                               ("retried", "workers", client_id, 2),
                               ("delivered", "workers", client_id, 2),
                               ("acked", "workers", client_id, 0)]
    assert steps(b"dead") == [stored, ("delivered", "workers", client_id, 1),
                              ("retried", "workers", client_id, 1),
                              ("retried", "workers", client_id, 2),
                              ("delivered", "workers", client_id, 2),
                              ("retried", "workers", client_id, 2),
                              ("dead_lettered", "workers", client_id, 2)]

    cli = cli_run(broker, "message", "trace", ids[b"dead"])
    assert cli.returncode == 0, cli.stderr
    lines = cli.stdout.splitlines()
    assert lines[0].startswith(f"message {ids[b'dead']}  topic jobs")
    assert lines[1].split() == ["TIME", "EVENT", "GROUP", "CLIENT", "ATTEMPT", "DETAIL"]
    assert lines[-1].split()[2:] == ["dead_lettered", "workers", client_id, "2", "%DLQ%workers"]
    as_json = json.loads(cli_run(broker, "message", "trace", ids[b"ok"], "--json").stdout)
    assert [e["event"] for e in as_json["events"]] == ["stored", "delivered", "acked"]


def test_a_trace_of_an_unknown_message_says_what_to_check(broker):
    cli = cli_run(broker, "message", "trace", "0000000000FFFFFF")
    assert cli.returncode == 1
    assert "404" in cli.stderr and "aged out with retention" in cli.stderr


def cli_run(broker: BrokerThread, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*SLUICE, *args, "--admin", broker.running.admin_url], capture_output=True,
                          text=True, timeout=60, env={**os.environ, "SLUICE_USER": "sluice",
                                                     "SLUICE_PASSWORD": "sluice"})


def test_one_message_traced_through_an_mqtt_session_and_an_amqp_queue(broker):
    import paho.mqtt.client as mqtt
    import pika

    amqp = pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", broker.running.amqp_listener.port, "/",
        pika.PlainCredentials("sluice", "sluice"), connection_attempts=1, socket_timeout=10))
    channel = amqp.channel()
    channel.queue_declare("trace-q", durable=True)
    channel.queue_bind("trace-q", "amq.topic", "plant.#")
    received, subscribed = threading.Event(), threading.Event()
    device = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="dev-1", clean_session=False)
    device.username_pw_set("sluice", "sluice")
    device.on_message = lambda client, userdata, message: received.set()
    device.on_subscribe = lambda *args: subscribed.set()
    device.connect("127.0.0.1", broker.running.mqtt_listeners.ports["tcp"], keepalive=60)
    device.loop_start()
    try:
        device.subscribe("plant/#", qos=1)
        assert subscribed.wait(TIMEOUT), "no SUBACK"
        device.publish("plant/line-1", b"reading", qos=1).wait_for_publish(TIMEOUT)
        assert received.wait(TIMEOUT), "the session's message did not arrive"
        first = channel.basic_get("trace-q")[0]
        channel.basic_nack(first.delivery_tag, requeue=True)
        again = channel.basic_get("trace-q")[0]
        channel.basic_ack(again.delivery_tag)
    finally:
        device.loop_stop()
        device.disconnect()
        amqp.close()
    http = Http(broker.running.admin_url)
    [stored] = http("GET", "/topics/plant/messages?from=0")[1]
    deadline = time.monotonic() + TIMEOUT
    while True:  # the session's PUBACK reaches the broker after the message reached paho
        events = http("GET", f"/messages/{stored['msg_id']}/trace")[1]["events"]
        steps = [(e["event"], e["group"], e["client"], e["detail"]) for e in events]
        if ("acked", "mqtt:dev-1", "dev-1", "") in steps or time.monotonic() > deadline:
            break
    assert [s for s in steps if s[1] == "mqtt:dev-1"] == [
        ("delivered", "mqtt:dev-1", "dev-1", ""), ("acked", "mqtt:dev-1", "dev-1", "")]
    assert [s[:2] + s[3:] for s in steps if s[1] == "trace-q"] == [
        ("delivered", "trace-q", ""), ("retried", "trace-q", "requeued"),
        ("delivered", "trace-q", ""), ("acked", "trace-q", "")]


def test_an_id_reused_by_another_user_hides_neither_message_nor_trace(broker):
    """Bob sends, to his own topic, a message with the id of Alice's (a producer chooses its
    ids): Alice's lookup and trace, with her credentials, still show her message and only its
    events; Bob's show his; an admin, who may read both, sees both."""
    admin = Http(broker.running.admin_url)
    for user, topic, group in (("alice", "alice-jobs", "alice-workers"), ("bob", "bob-jobs", "bob-workers")):
        assert admin("POST", "/topics", {"name": topic, "queue_count": 1})[0] == 201
        assert admin("POST", "/groups", {"name": group})[0] == 201
        assert admin("POST", "/users", {"name": user, "password": f"{user}-pw"})[0] == 201
        for kind, pattern in (("topic", topic), ("group", group)):
            assert admin("POST", f"/users/{user}/permissions",
                         {"kind": kind, "pattern": pattern, "actions": ["publish", "subscribe"]})[0] == 201
    alice, bob = Http(admin.url, "alice", "alice-pw"), Http(admin.url, "bob", "bob-pw")

    async def traffic() -> tuple[str, str]:
        async with Producer(user_config(broker, "alice")) as producer:
            msg_id = (await producer.send(Message("alice-jobs", b"alice's"))).message_id
        alice_client = await consume_one(broker, "alice", "alice-workers", "alice-jobs")
        await asyncio.to_thread(send_with_id, broker, "bob", "bob-jobs", b"bob's", msg_id)
        await consume_one(broker, "bob", "bob-workers", "bob-jobs")
        return msg_id, alice_client
    msg_id, alice_client = asyncio.run(asyncio.wait_for(traffic(), 120))

    status, message, _ = alice("GET", f"/messages/{msg_id}")
    assert status == 200 and (message["topic"], message["body_text"], message["same_id"]) == \
        ("alice-jobs", "alice's", [])
    status, trace, _ = alice("GET", f"/messages/{msg_id}/trace")
    assert status == 200 and trace["message"]["body_text"] == "alice's" and trace["same_id"] == []
    assert [(e["event"], e["group"], e["client"]) for e in trace["events"]] == [
        ("stored", "", ""), ("delivered", "alice-workers", alice_client),
        ("acked", "alice-workers", alice_client)]
    status, trace, _ = bob("GET", f"/messages/{msg_id}/trace")
    assert trace["message"]["body_text"] == "bob's"
    assert {e["group"] for e in trace["events"]} == {"", "bob-workers"}
    assert alice("GET", f"/messages/{msg_id}?topic=bob-jobs")[0] == 404

    status, message, _ = admin("GET", f"/messages/{msg_id}")
    assert message["body_text"] == "bob's" and [m["body_text"] for m in message["same_id"]] == ["alice's"]
    status, trace, _ = admin("GET", f"/messages/{msg_id}/trace?topic=alice-jobs")
    assert trace["message"]["body_text"] == "alice's" and len(trace["events"]) == 3
    cli = cli_run(broker, "message", "trace", msg_id, "--topic", "alice-jobs")
    assert cli.returncode == 0 and "topic alice-jobs" in cli.stdout.splitlines()[0], cli.stderr
    cli = cli_run(broker, "message", "get", msg_id)
    assert cli.returncode == 0 and "bob-jobs" in cli.stdout and "alice-jobs" in cli.stdout, cli.stderr


def user_config(broker: BrokerThread, user: str) -> ClientConfig:
    return ClientConfig(f"127.0.0.1:{broker.running.native.port}", user, f"{user}-pw", request_timeout=5)


async def consume_one(broker: BrokerThread, user: str, group: str, topic: str) -> str:
    """Receive one message of ``topic`` as ``user`` and ack it; the consumer's client id."""
    async with SimpleConsumer(user_config(broker, user), group, {topic: "*"},
                              invisible_duration=30, await_duration=1) as consumer:
        deadline = time.monotonic() + TIMEOUT
        while not (received := await consumer.receive(1)):
            assert time.monotonic() < deadline, f"nothing arrived in {topic}"
        await consumer.ack(received[0])
        return consumer.client_id


def send_with_id(broker: BrokerThread, user: str, topic: str, body: bytes, msg_id: str) -> None:
    """Send one message with the id ``msg_id``, as a raw native client may (the SDK draws ids)."""
    stub = Stub(f"127.0.0.1:{broker.running.native.port}", user, f"{user}-pw")
    try:
        sent = message(topic, body)
        sent.system_properties.message_id = msg_id
        answer = stub.SendMessage(rpc.SendMessageRequest(messages=[sent]))
        assert answer.status.code == pb.Code.OK, answer.status
    finally:
        stub.close()
