"""The MQTT adapter, its sessions and the session registry, driven through fake wires.

Each test speaks MQTT bytes to a real front end over a core `Broker` on `MemoryStore` (see
``fake_wire.py``) and asserts on the packets written back: the handshake, delivery at QoS 0,
1 and 2, the receive window, persistent sessions across reconnects, takeover, keep alive,
wills, flow control, admission and malformed input.
"""
from __future__ import annotations

import asyncio
import functools
import time
from types import SimpleNamespace

import pytest

from core.model import Action, Permission, ResourceKind
from protocols.mqtt import adapter as adapter_module
from protocols.mqtt import registry as registry_module
from protocols.mqtt import session_store
from protocols.mqtt.flow_control import FlowControl
from protocols.mqtt.options import MqttOptions
from protocols.mqtt.packets import (ConnAck, Connect, Disconnect, PubAck, PubComp, Publish, PubRec,
                                    PubRel, SubAck, Subscribe, Subscription, UnsubAck, Unsubscribe,
                                    Will)
from protocols.mqtt.properties import Properties
from protocols.mqtt.reason_codes import ConnectReturnCode, ReasonCode

from tests.unit.mqtt.fake_wire import USER, V3, V5, Client, run, v5_expiry


def reasons(packets: list) -> list:
    """The reason codes of ``packets`` (reason strings aside)."""
    return [packet.reason_code for packet in packets]


async def subscribed(frontend, client_id: str, *filters: tuple[str, int], version: int = V5,
                     **connect: object) -> Client:
    """A connected client holding ``filters`` (filter, QoS)."""
    client = Client(frontend, version)
    assert (await client.connect(client_id, **connect)).reason_code == 0
    client.send(Subscribe(1, tuple(Subscription(f, qos) for f, qos in filters)))
    assert (await client.expect(SubAck)).reason_codes == tuple(qos for _, qos in filters)
    return client


async def published(frontend, *messages: Publish, client_id: str = "pub") -> Client:
    """A client that published ``messages`` and got every QoS 1 one acknowledged."""
    client = Client(frontend)
    await client.connect(client_id)
    client.send(*messages)
    for message in messages:
        if message.qos == 1:
            assert (await client.expect(PubAck)).packet_id == message.packet_id
    return client


# ---------------------------------------------------------------- CONNECT


def test_nothing_is_read_until_the_connack_is_out(tmp_path):
    async def scenario(frontend, broker):
        client = Client(frontend)
        client.send(Connect("c1", username=USER, password=b"lovelace", keep_alive=60))
        assert not client.wire.reading  # 3.1.4: later packets wait for the answer
        connack = await client.expect(ConnAck)
        assert (connack.reason_code, connack.session_present) == (ReasonCode.Success, False)
        assert client.wire.reading and not client.wire.closed
    run(tmp_path, scenario)


@pytest.mark.parametrize("version, code", [(V5, ReasonCode.BadUserNameOrPassword),
                                           (V3, ConnectReturnCode.BadUserNameOrPassword)])
def test_a_wrong_password_is_refused_and_the_connection_closed(tmp_path, version, code):
    async def scenario(frontend, broker):
        client = Client(frontend, version)
        assert (await client.connect(password=b"wrong")).reason_code == code
        assert await client.closed() == []
    run(tmp_path, scenario)


def test_a_v5_client_without_a_client_id_is_given_one(tmp_path):
    async def scenario(frontend, broker):
        connack = await Client(frontend).connect("")
        assert connack.properties.assigned_client_identifier.startswith("sluice-")
    run(tmp_path, scenario)


def test_connections_beyond_max_pending_connections_are_closed_at_once(tmp_path):
    async def scenario(frontend, broker):
        waiting = Client(frontend)
        refused = Client(frontend)
        assert refused.wire.aborted and refused.wire.written == b""
        assert (await waiting.connect()).reason_code == ReasonCode.Success
        assert not Client(frontend).wire.aborted  # the first no longer waits for a CONNACK
    run(tmp_path, scenario, MqttOptions(max_pending_connections=1))


# ---------------------------------------------------------------- delivery


def test_qos0_and_qos1_messages_reach_a_subscriber(tmp_path):
    async def scenario(frontend, broker):
        sub = await subscribed(frontend, "sub", ("t/#", 1))
        await published(frontend, Publish("t/a", b"zero", 0), Publish("t/b", b"one", 1, packet_id=7))
        zero, one = await sub.expect(Publish), await sub.expect(Publish)
        assert (zero.topic, zero.payload, zero.qos) == ("t/a", b"zero", 0)
        assert (one.topic, one.payload, one.qos) == ("t/b", b"one", 1)
        assert one.packet_id is not None
    run(tmp_path, scenario)


def test_a_puback_frees_the_receive_window(tmp_path):
    async def scenario(frontend, broker):
        sub = await subscribed(frontend, "sub", ("t", 1),
                               properties=Properties(receive_maximum=1))
        witness = await subscribed(frontend, "witness", ("t", 0))
        await published(frontend, Publish("t", b"1", 1, packet_id=1),
                        Publish("t", b"2", 1, packet_id=2))
        assert [(await witness.expect(Publish)).payload for _ in range(2)] == [b"1", b"2"]
        first = await sub.expect(Publish)
        assert first.payload == b"1"
        assert await sub.settled() == []  # the window of one is full
        sub.send(PubAck(first.packet_id))
        assert (await sub.expect(Publish)).payload == b"2"
    run(tmp_path, scenario)


def test_a_congested_wire_holds_qos1_messages_until_it_drains(tmp_path):
    async def scenario(frontend, broker):
        sub = await subscribed(frontend, "sub", ("t", 1))
        witness = await subscribed(frontend, "witness", ("t", 0))
        sub.wire.backlog = MqttOptions().max_buffered_bytes + 1
        await published(frontend, Publish("t", b"held", 1, packet_id=1))
        await witness.expect(Publish)
        assert await sub.settled() == []
        sub.wire.backlog = 0
        sub.adapter.writable()
        assert (await sub.expect(Publish)).payload == b"held"
    run(tmp_path, scenario)


def test_a_retained_message_reaches_a_new_subscriber(tmp_path):
    async def scenario(frontend, broker):
        await published(frontend, Publish("r/1", b"last", 1, retain=True, packet_id=3))
        sub = await subscribed(frontend, "sub", ("r/#", 1))
        message = await sub.expect(Publish)
        assert (message.topic, message.payload, message.retain) == ("r/1", b"last", True)
    run(tmp_path, scenario)


def test_each_filter_of_a_subscribe_and_unsubscribe_gets_its_own_answer(tmp_path):
    async def scenario(frontend, broker):
        client = Client(frontend)
        await client.connect()
        client.send(Subscribe(1, (Subscription("ok/+", 1), Subscription("bad/#/x", 0),
                                  Subscription("$share/g/s", 1))))
        assert (await client.expect(SubAck)).reason_codes == (1, ReasonCode.TopicFilterInvalid, 1)
        client.send(Unsubscribe(2, ("ok/+", "never")))
        assert (await client.expect(UnsubAck)).reason_codes == (
            ReasonCode.Success, ReasonCode.NoSubscriptionExisted)
        await published(frontend, Publish("ok/x", b"gone", 1, packet_id=1))
        assert await client.settled() == []
    run(tmp_path, scenario)


def test_a_qos2_publish_of_a_persistent_session_is_stored_once(tmp_path):
    async def scenario(frontend, broker):
        sub = await subscribed(frontend, "sub", ("q", 2))
        pub = Client(frontend)
        await pub.connect("pub", properties=v5_expiry(300))
        pub.send(Publish("q", b"once", 2, packet_id=9))
        assert (await pub.expect(PubRec)).packet_id == 9
        pub.send(Publish("q", b"once", 2, dup=True, packet_id=9))  # resent before PUBREL
        assert (await pub.expect(PubRec)).packet_id == 9
        pub.send(PubRel(9))
        assert (await pub.expect(PubComp)).packet_id == 9
        message = await sub.expect(Publish)
        assert (message.payload, message.qos) == (b"once", 2)
        sub.send(PubRec(message.packet_id))
        assert (await sub.expect(PubRel)).packet_id == message.packet_id
        sub.send(PubComp(message.packet_id))
        assert await sub.settled() == []
    run(tmp_path, scenario)


# ---------------------------------------------------------------- persistent sessions, takeover


def test_a_persistent_session_gets_what_was_published_while_it_was_away(tmp_path):
    async def scenario(frontend, broker):
        sub = await subscribed(frontend, "keeper", ("t/#", 1), properties=v5_expiry(300))
        sub.send(Disconnect())
        await sub.closed()
        await published(frontend, *(Publish("t/x", b"m%d" % i, 1, packet_id=i + 1) for i in range(3)))
        back = Client(frontend)
        connack = await back.connect("keeper", clean_start=False, properties=v5_expiry(300))
        assert connack.session_present
        messages = [await back.expect(Publish) for _ in range(3)]
        assert [m.payload for m in messages] == [b"m0", b"m1", b"m2"]
        back.send(*(PubAck(m.packet_id) for m in messages), Disconnect())
        await back.closed()
        again = Client(frontend)
        assert (await again.connect("keeper", clean_start=False,
                                    properties=v5_expiry(300))).session_present
        assert await again.settled() == []  # acknowledged: not sent again
    run(tmp_path, scenario)


def test_a_persistent_sessions_suback_waits_until_its_subscription_is_stored(tmp_path, monkeypatch):
    """A SIGKILL right after a SUBACK must not lose the subscription: the SUBACK of a persistent
    session goes out once the session's record with it is stored, not before."""
    stored = asyncio.Event()
    holding = []
    save = session_store.SessionStore.save

    def held_save(self, session, disconnected_at_ms=None):
        async def after_gate():
            if holding:
                await stored.wait()
            await save(self, session, disconnected_at_ms)
        return after_gate()
    monkeypatch.setattr(session_store.SessionStore, "save", held_save)

    async def scenario(frontend, broker):
        client = Client(frontend)
        assert (await client.connect("kept", clean_start=False, properties=v5_expiry(300))).reason_code == 0
        holding.append(True)
        client.send(Subscribe(1, (Subscription("t/#", 1),)))
        try:
            assert await client.settled() == [], "a SUBACK before the subscription was stored"
        finally:
            stored.set()
        assert (await client.expect(SubAck)).reason_codes == (1,)
    run(tmp_path, scenario)


def test_unacknowledged_messages_are_sent_again_with_the_same_packet_id(tmp_path):
    async def scenario(frontend, broker):
        sub = await subscribed(frontend, "keeper", ("t", 1), properties=v5_expiry(300))
        await published(frontend, Publish("t", b"unacked", 1, packet_id=1))
        first = await sub.expect(Publish)
        assert not first.dup
        sub.drop()
        back = Client(frontend)
        await back.connect("keeper", clean_start=False, properties=v5_expiry(300))
        again = await back.expect(Publish)
        assert (again.payload, again.packet_id, again.dup) == (b"unacked", first.packet_id, True)
    run(tmp_path, scenario)


def test_a_second_connection_takes_the_client_id_over(tmp_path):
    async def scenario(frontend, broker):
        first = await subscribed(frontend, "same", ("t", 1), properties=v5_expiry(300))
        second = Client(frontend)
        connack = await second.connect("same", clean_start=False, properties=v5_expiry(300))
        assert connack.session_present
        assert reasons(await first.closed()) == [ReasonCode.SessionTakenOver]
        await published(frontend, Publish("t", b"to the new one", 1, packet_id=1))
        assert (await second.expect(Publish)).payload == b"to the new one"
    run(tmp_path, scenario)


def test_a_session_is_not_resumed_by_another_user(tmp_path):
    async def scenario(frontend, broker):
        broker.users.create_user("mallory", "pw")
        await subscribed(frontend, "owned", ("t", 1), properties=v5_expiry(300))
        thief = Client(frontend)
        connack = await thief.connect("owned", clean_start=False, username="mallory",
                                      password=b"pw", properties=v5_expiry(300))
        assert connack.reason_code == ReasonCode.NotAuthorized
        await thief.closed()
    run(tmp_path, scenario)


def test_a_revoked_right_refuses_the_next_publish_to_a_topic_already_published_to(tmp_path):
    async def scenario(frontend, broker):
        broker.users.create_user("grace", "pw")
        broker.users.grant(Permission("grace", ResourceKind.TOPIC, "t", frozenset({Action.PUBLISH})))
        sub = await subscribed(frontend, "sub", ("t", 1))
        pub = Client(frontend)
        assert (await pub.connect("pub", username="grace", password=b"pw")).reason_code == 0
        pub.send(Publish("t", b"allowed", 1, packet_id=1))
        assert (await pub.expect(PubAck)).reason_code == ReasonCode.Success
        assert (await sub.expect(Publish)).payload == b"allowed"
        assert broker.users.revoke("grace", ResourceKind.TOPIC, "t")
        pub.send(Publish("t", b"no longer", 1, packet_id=2))
        assert (await pub.expect(PubAck)).reason_code == ReasonCode.NotAuthorized
        assert await sub.settled() == []
    run(tmp_path, scenario)


# ---------------------------------------------------------------- keep alive, wills, shutdown


def test_keep_alive_expiry_closes_the_connection_and_publishes_its_will(tmp_path, monkeypatch):
    later = [0.0]
    monkeypatch.setattr(registry_module, "KEEPALIVE_SWEEP_S", 0.01)
    monkeypatch.setattr(registry_module, "time",
                        SimpleNamespace(monotonic=lambda: time.monotonic() + later[0]))

    async def scenario(frontend, broker):
        watcher = await subscribed(frontend, "watcher", ("wills/#", 0), keep_alive=0)
        client = Client(frontend)
        await client.connect("quiet", keep_alive=1, will=Will("wills/quiet", b"gone"))
        later[0] = 10.0  # the sweep now sees 10 s without a packet
        assert reasons(await client.closed()) == [ReasonCode.KeepAliveTimeout]
        will = await watcher.expect(Publish)
        assert (will.topic, will.payload) == ("wills/quiet", b"gone")
    run(tmp_path, scenario)


def test_a_will_is_published_when_the_socket_drops_but_not_after_a_disconnect(tmp_path):
    async def scenario(frontend, broker):
        watcher = await subscribed(frontend, "watcher", ("wills/#", 0))
        polite, dropped = Client(frontend), Client(frontend, V3)
        await polite.connect("polite", will=Will("wills/polite", b"bye"))
        await dropped.connect("dropped", will=Will("wills/dropped", b"lost"))
        polite.send(Disconnect())
        await polite.closed()
        dropped.drop()
        will = await watcher.expect(Publish)
        assert (will.topic, will.payload) == ("wills/dropped", b"lost")
    run(tmp_path, scenario)


def test_stopping_tells_every_client_why(tmp_path):
    async def scenario(frontend, broker):
        client = Client(frontend)
        await client.connect()
        await frontend.stop()
        assert reasons(await client.closed()) == [ReasonCode.ServerShuttingDown]
    run(tmp_path, scenario)


# ---------------------------------------------------------------- hostile input, flow control


def test_a_malformed_packet_closes_only_its_own_connection(tmp_path):
    async def scenario(frontend, broker):
        good = await subscribed(frontend, "good", ("t", 0))
        bad = Client(frontend)
        await bad.connect("bad")
        bad.send_bytes(b"\x30\xff\xff\xff\xff\x7f")  # a remaining length of five bytes
        assert reasons(await bad.closed()) == [ReasonCode.MalformedPacket]
        good.send(Publish("t", b"still here"))
        assert (await good.expect(Publish)).payload == b"still here"
    run(tmp_path, scenario)


def test_reading_pauses_while_too_many_messages_wait_for_the_store(tmp_path, monkeypatch):
    monkeypatch.setattr(adapter_module, "FlowControl", functools.partial(FlowControl, max_unstored=2))

    async def scenario(frontend, broker):
        pub = Client(frontend)
        await pub.connect()
        pub.send(*(Publish("t", b"x", 1, packet_id=i) for i in (1, 2, 3)))
        assert not pub.wire.reading
        assert [(await pub.expect(PubAck)).packet_id for _ in range(3)] == [1, 2, 3]
        assert pub.wire.reading
    run(tmp_path, scenario)
