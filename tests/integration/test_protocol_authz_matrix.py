"""The authorization matrix of MQTT and the native (RocketMQ 5) protocol: every operation ×
{admin, owner, publish-only, other user, no rights, anonymous}, over real sockets against one
broker (anonymous access on: anonymous clients act as the user ``anonymous``, which has no
rights). The admin API's matrix is ``test_admin_authz_matrix.py``, AMQP's
``test_amqp_authz_matrix.py``.

Access rules hold for every reader: with a rule denying ``r-topic/secret/#`` to everyone and
one denying ``r-topic/hidden/#`` to the owner, each way of reading a topic (an MQTT
subscription, native ReceiveMessage and PullMessage, the admin API's reads and its tail) is a
row per subject: the admin (bound by no rule) gets every subject, the owner only the sibling
``r-topic/open/...``, the others nothing.

History tiered to the object store is read with the same rights: the broker tiers its 1 MiB
segments to a local directory and deletes them locally a second later, and a row per way of
reading (native PullMessage, the admin API's lookups by id, by key and by time) reads the first
message of the owner's ``t-topic``, which by then is only in the tier.

Each cell says whether the role may do the operation. Refused means the protocol's own answer
(MQTT 5: reason code 0x87; native: FORBIDDEN), never a dropped connection or an internal error;
allowed means anything else. The expected cells are written out, not derived from the rules.
"""
from __future__ import annotations

import asyncio
import base64
import json
import os
import socket
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from rocketmq.grpc_protocol.definition_pb2 import (Code, FilterExpression, MessageQueue,
                                                   Resource, TransactionResolution)
from rocketmq.grpc_protocol.service_pb2 import (AckMessageEntry, AckMessageRequest,
                                                EndTransactionRequest, PullMessageRequest, QueryAssignmentRequest,
                                                QueryRouteRequest, RecallMessageRequest,
                                                ReceiveMessageRequest, SendMessageRequest,
                                                SyncLiteSubscriptionRequest, UpdateOffsetRequest)

from core.model import SYSTEM, Action, OutgoingMessage
from sluice.server.app import start
from sluice.server.config import load_config
from protocols.mqtt.codec import MQTT_5, Decoder, encode
from protocols.mqtt.packets import (ConnAck, Connect, PubAck, Publish, SubAck, Subscribe,
                                    Subscription, Will)
from protocols.mqtt.properties import Properties
from sluice.client import ClientConfig, Message
from sluice.client.convert import duration, message_to_proto, new_message_id
from sluice.client.transport import Transport
from tests.waiting import wait_for

ROLES = ("admin", "owner", "publisher", "other", "none", "anonymous")
PASSWORD = "pw"
GRANTS = {  # role -> (kind, pattern, actions); admin is the default admin, anonymous has none
    "owner": [("topic", "m-topic", ["publish", "subscribe"]), ("group", "m-group", ["subscribe"]),
              ("topic", "r-topic", ["publish", "subscribe"]), ("group", "r-*", ["subscribe"]),
              ("topic", "t-topic", ["publish", "subscribe"]), ("group", "t-*", ["subscribe"])],
    "publisher": [("topic", "m-topic", ["publish"])],
    "other": [("topic", "o-topic", ["publish", "subscribe"]), ("group", "o-group", ["subscribe"])],
    "none": [],
    "anonymous": [],
}


def allowed(*roles: str) -> dict[str, bool]:
    return {role: role in roles for role in ROLES}


# ------------------------------------------------------------------------------ the broker

class Broker:
    """The whole broker (every listener) on its own thread's event loop."""

    def __init__(self, data_dir: str) -> None:
        config = load_config(overrides={"data_dir": data_dir, "native.port": 0,
                                        "admin.port": 0, "mqtt.port": 0, "mqtt.ws_port": 0,
                                        "amqp.port": 0,
                                        "auth.allow_anonymous": True,
                                        "tier.url": f"file://{data_dir}-tier",
                                        "tier.check_interval_ms": 200,
                                        "store.retention_max_age_ms": 1000,
                                        "core.retention_check_interval_ms": 250})
        self.data_dir = Path(data_dir)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.running = self.call(start(replace(config, store=replace(config.store,
                                                                     segment_size=1 << 20))))
        self.mqtt = self.running.mqtt_listeners.ports["tcp"]
        self.recall_handles: dict[str, str] = {}
        """topic -> the recall handle of a delayed message the admin sent to it"""
        self.tiered_id = ""
        """The id of the message of t-topic the admin sent first, since tiered and deleted locally"""
        self.rule_ids: dict[str, str] = {}
        """subject kind (secret, hidden, open) -> the id of the message of r-topic the admin sent"""
        self.read: dict[tuple[Callable, str], set[str]] = {}
        """(reader, role) -> the bodies that role read that way (``reads``)"""

    def call(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(30)

    def stop(self) -> None:
        self.call(self.running.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    from core.model import AclRule, GroupConfig, Permission, ResourceKind, TopicConfig
    world = Broker(str(tmp_path_factory.mktemp("protocol-matrix") / "data"))
    core = world.running.broker

    async def setup() -> None:
        for name in ("m-topic", "o-topic", "r-topic", "t-topic"):
            await core.create_topic(SYSTEM, TopicConfig(name, 1))
        world.tiered_id = await fill_tiered_topic(core)
        for name in ("m-group", "o-group"):
            await core.create_group(SYSTEM, GroupConfig(name))
        for role, grants in GRANTS.items():
            await asyncio.to_thread(core.users.create_user, role, PASSWORD)
            for kind, pattern, actions in grants:
                await asyncio.to_thread(core.users.grant, Permission(
                    role, ResourceKind(kind), pattern, frozenset(Action(a) for a in actions)))
        due = int(time.time() * 1000) + 3_600_000
        for key in ("m-topic", "o-topic", "o-topic/kept"):  # delayed messages to recall
            [held] = await core.send(SYSTEM, [OutgoingMessage(key.split("/")[0], b"later",
                                                              delivery_ts=due)])
            world.recall_handles[key] = held.recall_handle
        subscribe_only = frozenset({Action.SUBSCRIBE})
        await asyncio.to_thread(core.users.put_rule, AclRule("*", "r-topic/secret/#",
                                                             subscribe_only, allow=False))
        await asyncio.to_thread(core.users.put_rule, AclRule("owner", "r-topic/hidden/#",
                                                             subscribe_only, allow=False))
        for kind in SUBJECT_KINDS:
            [sent] = await core.send(SYSTEM, [rule_message(kind, f"r-topic/{kind}/stored")])
            world.rule_ids[kind] = sent.msg_id
    world.call(setup())
    wait_for(lambda: tiered_and_gone(world), "t-topic's history tiered and deleted locally", 120)
    owner_session = mqtt_connect(world, "owner", client_id="owner-session",
                                 properties=Properties(session_expiry_interval=3600))
    assert owner_session[1].reason_code == 0
    owner_session[0].close()
    yield world
    world.stop()


# ------------------------------------------------------------------------------ MQTT

def credentials(role: str) -> tuple[str | None, bytes | None]:
    if role == "anonymous":
        return None, None
    return ("sluice", b"sluice") if role == "admin" else (role, PASSWORD.encode())


def mqtt_read(sock: socket.socket, decoder: Decoder):
    while (packet := decoder.next_packet()) is None:
        data = sock.recv(65536)
        assert data, "the broker closed the connection instead of answering"
        decoder.feed(data)
    return packet


def mqtt_connect(world: Broker, role: str, *, client_id: str = "", will: Will | None = None,
                 properties: Properties = Properties()) -> tuple[socket.socket, ConnAck, Decoder]:
    sock = socket.create_connection(("127.0.0.1", world.mqtt), timeout=10)
    user, password = credentials(role)
    sock.sendall(encode(Connect(client_id=client_id or f"{role}-{id(sock)}", clean_start=False,
                                username=user, password=password, will=will,
                                properties=properties), MQTT_5))
    decoder = Decoder(MQTT_5)
    return sock, mqtt_read(sock, decoder), decoder


def mqtt_op(role: str, world: Broker, send: Callable[[socket.socket], None], answer: type) -> int:
    sock, ack, decoder = mqtt_connect(world, role)
    try:
        assert ack.reason_code == 0, ack
        send(sock)
        while not isinstance(packet := mqtt_read(sock, decoder), answer):
            pass  # an echo of our own publish may come first
        return packet.reason_code if answer is PubAck else packet.reason_codes[0]
    finally:
        sock.close()


def publish(topic: str, retain: bool = False):
    def op(role: str, world: Broker) -> bool:
        code = mqtt_op(role, world, lambda s: s.sendall(encode(
            Publish(topic, b"x", 1, retain, packet_id=1), MQTT_5)), PubAck)
        assert code in (0, 0x87), hex(code)
        return code == 0
    return op


def subscribe(topic_filter: str):
    def op(role: str, world: Broker) -> bool:
        code = mqtt_op(role, world, lambda s: s.sendall(encode(
            Subscribe(1, (Subscription(topic_filter, 1),)), MQTT_5)), SubAck)
        assert code in (1, 0x87), hex(code)
        return code == 1
    return op


def will(role: str, world: Broker) -> bool:
    sock, ack, _ = mqtt_connect(world, role, will=Will("m-topic/will", b"bye", 1, False))
    sock.close()
    assert ack.reason_code in (0, 0x87), ack
    return ack.reason_code == 0


def resume_owners_session(role: str, world: Broker) -> bool:
    sock, ack, _ = mqtt_connect(world, role, client_id="owner-session",
                                properties=Properties(session_expiry_interval=3600))
    sock.close()
    assert ack.reason_code in (0, 0x87), ack
    return ack.reason_code == 0


# ------------------------------------------------------------------------------ native

def native_call(world: Broker, role: str, method: str, request, stream: bool = False) -> int:
    user, password = credentials(role)
    config = ClientConfig(world.running.native_address, access_key=user or "",
                          secret_key=(password or b"").decode())

    async def call() -> int:
        transport = Transport(config, f"matrix-{role}")
        try:
            if stream:
                responses = await transport.server_stream(method, request, timeout=10)
                return next(r.status.code for r in responses if r.HasField("status"))
            return (await transport.unary(method, request)).status.code
        finally:
            await transport.close()
    return asyncio.run(call())


def native(method: str, request, stream: bool = False, refused: int = Code.FORBIDDEN):
    def op(role: str, world: Broker) -> bool:
        code = native_call(world, role, method, request(), stream)
        assert code != Code.INTERNAL_ERROR and code != Code.UNAUTHORIZED, Code.Name(code)
        return code != refused
    return op


def queue(topic: str) -> MessageQueue:
    return MessageQueue(topic=Resource(name=topic), id=0)


def send_request(topic: str, delay_ms: int = 0, **properties: str):
    def build() -> SendMessageRequest:
        due = int(time.time() * 1000) + delay_ms if delay_ms else 0
        message = message_to_proto(Message(topic, b"x", keys=["s/matrix"], properties=properties,
                                           delivery_timestamp=due),
                                   "", 0, new_message_id(), 0)
        return SendMessageRequest(messages=[message])
    return build


def recall(topic: str, handle_of: str, *, only_success: bool = False):
    """Recall, naming ``topic``, a delayed message the admin sent (``handle_of``). Once it is
    recalled, later cells are answered NOT_FOUND: allowed, as the right was not refused;
    ``only_success`` counts only a recall that succeeded."""
    def op(role: str, world: Broker) -> bool:
        request = RecallMessageRequest(topic=Resource(name=topic),
                                       recall_handle=world.recall_handles[handle_of])
        code = native_call(world, role, "RecallMessage", request)
        assert code in (Code.OK, Code.NOT_FOUND, Code.FORBIDDEN), Code.Name(code)
        return code == Code.OK if only_success else code != Code.FORBIDDEN
    return op


def end_transaction(topic: str):
    """Commit, naming ``topic``, a transaction no one opened: refused, or (the right granted)
    answered INVALID_TRANSACTION_ID."""
    def build() -> EndTransactionRequest:
        return EndTransactionRequest(topic=Resource(name=topic), message_id="m", transaction_id="0:m",
                                     resolution=TransactionResolution.COMMIT)
    return build


def receive_request() -> ReceiveMessageRequest:
    return ReceiveMessageRequest(group=Resource(name="m-group"), message_queue=queue("m-topic"),
                                 filter_expression=FilterExpression(expression="*"), batch_size=1,
                                 invisible_duration=duration(30), auto_renew=False,
                                 long_polling_timeout=duration(0.2))


def pull_request() -> PullMessageRequest:
    return PullMessageRequest(group=Resource(name="m-group"), message_queue=queue("m-topic"),
                              offset=0, batch_size=1,
                              filter_expression=FilterExpression(expression="*"),
                              long_polling_timeout=duration(0.2))


# ------------------------------------------------------------------------------ access rules

@dataclass(frozen=True)
class Operation:
    name: str
    run: Callable[[str, Broker], bool]
    expect: dict[str, bool]


SUBJECT_KINDS = ("secret", "hidden", "open")
"""r-topic/secret/... is denied to everyone, r-topic/hidden/... to the owner, r-topic/open/...
to no one. Stored messages carry the kind as their body; those sent while a reader is
connected carry ``live-<kind>``."""
RULE_KEY = "r-key"


def rule_message(body: str, subject: str) -> OutgoingMessage:
    return OutgoingMessage("r-topic", body.encode(), keys=(RULE_KEY,),
                           properties={"sluice.subject": subject})


def send_live(world: Broker) -> str:
    """Send one message of each kind to r-topic, then an end marker (returned) after them."""
    end = f"end-{uuid.uuid4().hex}"
    messages = [rule_message(f"live-{kind}", f"r-topic/{kind}/live") for kind in SUBJECT_KINDS]
    world.call(world.running.broker.send(SYSTEM, [*messages, rule_message(end, "r-topic/open/end")]))
    return end


def read_mqtt(role: str, world: Broker) -> set[str]:
    """Subscribe to r-topic/#, then read what live messages arrive."""
    sock, ack, decoder = mqtt_connect(world, role)
    try:
        assert ack.reason_code == 0, ack
        sock.sendall(encode(Subscribe(1, (Subscription("r-topic/#", 0),)), MQTT_5))
        if mqtt_read(sock, decoder).reason_codes[0] != 0:
            return set()
        end, bodies = send_live(world), set()
        while end not in bodies:
            packet = mqtt_read(sock, decoder)
            if isinstance(packet, Publish):
                bodies.add(packet.payload.decode())
        return bodies
    finally:
        sock.close()


def native_responses(world: Broker, role: str, method: str, request) -> list:
    user, password = credentials(role)
    config = ClientConfig(world.running.native_address, access_key=user or "",
                          secret_key=(password or b"").decode())

    async def call() -> list:
        transport = Transport(config, f"rules-{role}")
        try:
            return list(await transport.server_stream(method, request, timeout=10))
        finally:
            await transport.close()
    return asyncio.run(call())


def read_native_pop(role: str, world: Broker) -> set[str]:
    """ReceiveMessage in a group of the role's own until nothing more comes."""
    bodies: set[str] = set()
    while True:
        responses = native_responses(world, role, "ReceiveMessage", ReceiveMessageRequest(
            group=Resource(name=f"r-pop-{role}"), message_queue=queue("r-topic"),
            filter_expression=FilterExpression(expression="*"), batch_size=32,
            invisible_duration=duration(60), auto_renew=False,
            long_polling_timeout=duration(0.2)))
        got = [r.message.body.decode() for r in responses if r.HasField("message")]
        if not got:
            return bodies
        bodies.update(got)


def read_native_pull(role: str, world: Broker) -> set[str]:
    responses = native_responses(world, role, "PullMessage", PullMessageRequest(
        group=Resource(name=f"r-pull-{role}"), message_queue=queue("r-topic"), offset=0,
        batch_size=1000, filter_expression=FilterExpression(expression="*"),
        long_polling_timeout=duration(0.2)))
    return {r.message.body.decode() for r in responses if r.HasField("message")}


def admin_get(world: Broker, role: str, path: str):
    request = urllib.request.Request(world.running.admin_url + path)
    user, password = credentials(role)
    if user is not None:
        token = base64.b64encode(f"{user}:{password.decode()}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        return urllib.request.urlopen(request, timeout=10)
    except urllib.error.HTTPError as refused:
        assert refused.code in (401, 403, 404), refused
        return None


def read_admin(path: str):
    def read(role: str, world: Broker) -> set[str]:
        response = admin_get(world, role, path)
        return set() if response is None else {m["body_text"] for m in json.load(response)}
    return read


def read_admin_by_id(role: str, world: Broker) -> set[str]:
    found = set()
    for msg_id in world.rule_ids.values():
        response = admin_get(world, role, f"/messages/{msg_id}")
        if response is not None:
            found.add(json.load(response)["body_text"])
    return found


def read_admin_tail(role: str, world: Broker) -> set[str]:
    """The tail's history (stored kinds), then live messages until the end marker."""
    response = admin_get(world, role, "/topics/r-topic/tail?minutes=60")
    if response is None:
        return set()
    with response:
        end, bodies = send_live(world), set()
        while end not in bodies:
            line = json.loads(response.readline())
            assert "error" not in line, line
            bodies.add(line.get("body", ""))
        return bodies


READERS = {
    "MQTT subscriber": read_mqtt,
    "native ReceiveMessage": read_native_pop,
    "native PullMessage": read_native_pull,
    "admin GET /topics/{t}/messages?from=": read_admin("/topics/r-topic/messages?from=0&limit=1000"),
    "admin GET /topics/{t}/messages?key=": read_admin(f"/topics/r-topic/messages?key={RULE_KEY}&limit=1000"),
    "admin GET /messages/{id}": read_admin_by_id,
    "admin tail (history)": read_admin_tail,
    "admin tail (live)": read_admin_tail,
}
LIVE_READERS = {"MQTT subscriber", "admin tail (live)"}
"""Readers of messages sent while they read; the others read what was stored first."""


def reads(reader: str, kind: str):
    """An operation: whether the role, reading r-topic as ``reader``, gets the message of
    ``kind``. Each reader runs once per role; its rows share what it read."""
    body = f"live-{kind}" if reader in LIVE_READERS else kind

    def op(role: str, world: Broker) -> bool:
        key = (READERS[reader], role)  # the tail's two rows share one read
        if key not in world.read:
            world.read[key] = READERS[reader](role, world)
        return body in world.read[key]
    return op


RULE_ROWS = [
    Operation(f"{reader} gets a subject {what}", reads(reader, kind), expect)
    for reader in READERS
    for kind, what, expect in (
        ("secret", "a rule denies everyone", allowed("admin")),
        ("hidden", "a rule denies the owner", allowed("admin")),
        ("open", "no rule denies", allowed("admin", "owner")))
]


# ------------------------------------------------------------------------------ tiered history

TIERED_BODY, TIERED_KEY = "tiered-history", "t-key"


async def fill_tiered_topic(core) -> str:
    """Send ``TIERED_BODY`` to t-topic, then more than a 1 MiB segment after it, so that the
    segment holding it seals and is tiered; return its id."""
    [sent] = await core.send(SYSTEM, [OutgoingMessage("t-topic", TIERED_BODY.encode(),
                                                      keys=(TIERED_KEY,))])
    filler = [OutgoingMessage("t-topic", bytes(8192)) for _ in range(140)]
    for start in range(0, len(filler), 20):
        await core.send(SYSTEM, filler[start:start + 20])
    return sent.msg_id


def tiered_and_gone(world: Broker) -> int:
    """The oldest local segment's base once it is at or past the tiered end (0 until then)."""
    oldest = min(int(name) for name in os.listdir(world.data_dir / "commitlog") if name.isdigit())
    tiered = json.load(admin_get(world, "admin", "/tier")).get("tiered_end", 0)
    return oldest if 0 < tiered <= oldest else 0


def read_tiered_pull(role: str, world: Broker) -> set[str]:
    responses = native_responses(world, role, "PullMessage", PullMessageRequest(
        group=Resource(name=f"t-pull-{role}"), message_queue=queue("t-topic"), offset=0,
        batch_size=1, filter_expression=FilterExpression(expression="*"),
        long_polling_timeout=duration(0.2)))
    return {r.message.body.decode(errors="replace") for r in responses if r.HasField("message")}


def read_tiered_by_id(role: str, world: Broker) -> set[str]:
    response = admin_get(world, role, f"/messages/{world.tiered_id}")
    return set() if response is None else {json.load(response)["body_text"]}


TIERED_READERS = {
    "native PullMessage": read_tiered_pull,
    "admin GET /messages/{id}": read_tiered_by_id,
    "admin GET /topics/{t}/messages?key=": read_admin(f"/topics/t-topic/messages?key={TIERED_KEY}"),
    "admin GET /topics/{t}/messages?from=": read_admin("/topics/t-topic/messages?from=0&limit=1"),
}
TIER_ROWS = [Operation(f"{reader} of the owner's tiered history",
                       lambda role, world, read=read: TIERED_BODY in read(role, world),
                       allowed("admin", "owner"))
             for reader, read in TIERED_READERS.items()]


# ------------------------------------------------------------------------------ the table

TABLE = [
    Operation("MQTT publish", publish("m-topic/x"), allowed("admin", "owner", "publisher")),
    Operation("MQTT retained publish", publish("m-topic/r", retain=True),
              allowed("admin", "owner", "publisher")),
    Operation("MQTT will", will, allowed("admin", "owner", "publisher")),
    Operation("MQTT publish to another user's topic", publish("o-topic/x"), allowed("admin", "other")),
    Operation("MQTT delayed publish", publish("$delayed/60/m-topic/x"),
              allowed("admin", "owner", "publisher")),
    Operation("MQTT delayed publish to another user's topic", publish("$delayed/60/o-topic/x"),
              allowed("admin", "other")),
    Operation("MQTT subscribe", subscribe("m-topic/#"), allowed("admin", "owner")),
    Operation("MQTT shared subscribe", subscribe("$share/g/m-topic/#"), allowed("admin", "owner")),
    Operation("MQTT subscribe to every topic", subscribe("#"), allowed("admin")),
    Operation("MQTT resume another client's persistent session", resume_owners_session,
              allowed("owner")),
    Operation("native SendMessage", native("SendMessage", send_request("m-topic")),
              allowed("admin", "owner", "publisher")),
    Operation("native SendMessage to an internal topic",
              native("SendMessage", send_request("%SYS%mqtt.sessions")), allowed("admin")),
    Operation("native SendMessage with a subject outside its topic",
              native("SendMessage", send_request("m-topic", **{"sluice.subject": "o-topic/x"}),
                     refused=Code.BAD_REQUEST), allowed()),
    Operation("native delayed SendMessage", native("SendMessage", send_request("m-topic", 60_000)),
              allowed("admin", "owner", "publisher")),
    Operation("native delayed SendMessage to another user's topic",
              native("SendMessage", send_request("o-topic", 60_000)), allowed("admin", "other")),
    Operation("native RecallMessage", recall("m-topic", "m-topic"),
              allowed("admin", "owner", "publisher")),
    Operation("native RecallMessage of another user's message", recall("o-topic", "o-topic"),
              allowed("admin", "other")),
    Operation("native RecallMessage naming one's topic for another's message",
              recall("m-topic", "o-topic/kept", only_success=True), allowed()),
    Operation("native EndTransaction", native("EndTransaction", end_transaction("m-topic")),
              allowed("admin", "owner", "publisher")),
    Operation("native EndTransaction of another user's topic",
              native("EndTransaction", end_transaction("o-topic")), allowed("admin", "other")),
    Operation("native SyncLiteSubscription", native("SyncLiteSubscription", lambda: SyncLiteSubscriptionRequest(
        topic=Resource(name="m-topic"), group=Resource(name="m-group"), lite_topic_set=["s1"])),
        allowed("admin", "owner")),
    Operation("native SyncLiteSubscription on another user's topic", native(
        "SyncLiteSubscription", lambda: SyncLiteSubscriptionRequest(
            topic=Resource(name="o-topic"), group=Resource(name="m-group"), lite_topic_set=["s1"])),
        allowed("admin")),
    Operation("native QueryRoute", native("QueryRoute", lambda: QueryRouteRequest(
        topic=Resource(name="m-topic"))), allowed("admin", "owner", "publisher")),
    Operation("native QueryAssignment", native("QueryAssignment", lambda: QueryAssignmentRequest(
        topic=Resource(name="m-topic"), group=Resource(name="m-group"))), allowed("admin", "owner")),
    Operation("native ReceiveMessage", native("ReceiveMessage", receive_request, stream=True),
              allowed("admin", "owner")),
    Operation("native PullMessage", native("PullMessage", pull_request, stream=True),
              allowed("admin", "owner")),
    Operation("native AckMessage", native("AckMessage", lambda: AckMessageRequest(
        group=Resource(name="m-group"), topic=Resource(name="m-topic"),
        entries=[AckMessageEntry(message_id="0", receipt_handle="not-a-handle")])),
        allowed("admin", "owner")),
    Operation("native UpdateOffset", native("UpdateOffset", lambda: UpdateOffsetRequest(
        group=Resource(name="m-group"), message_queue=queue("m-topic"), offset=0)),
        allowed("admin", "owner")),
    *RULE_ROWS,
    *TIER_ROWS,
]


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("operation", TABLE, ids=lambda o: o.name)
def test_matrix(broker, operation, role):
    assert operation.run(role, broker) is operation.expect[role], (operation.name, role)


def test_the_table_covers_every_role():
    assert all(set(o.expect) == set(ROLES) for o in TABLE)
