"""ServerConnection driven with plain bytes: client packets are built with the codec, and what
the connection writes back is decoded with a client-side Decoder."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocols.mqtt.codec import Decoder, encode
from protocols.mqtt.connection import ConnectionStateError, FlowControlFull, ServerConnection
from protocols.mqtt.events import (ConnectionClosed, ConnectRequested, MessagePublished,
                                   PublishReceived, ReleaseRequested,
                                   PublishAcknowledged, SubscribeRequested, UnsubscribeRequested)
from protocols.mqtt.packets import (Auth, ConnAck, Connect, Disconnect, PingReq, PingResp, PubAck,
                                    PubComp, Publish, PubRec, PubRel, SubAck, Subscribe,
                                    Subscription, UnsubAck, Unsubscribe, Will)
from protocols.mqtt.properties import Properties
from protocols.mqtt.reason_codes import ConnectReturnCode, ReasonCode
from protocols.mqtt.state_table import State

V3, V5 = 4, 5
BOTH = pytest.mark.parametrize("version", [V3, V5])


def wire(version: int, *packets: object) -> bytes:
    return b"".join(encode(p, version) for p in packets)  # type: ignore[arg-type]


def decode(version: int, data: bytes, *, reason_strings: bool = False) -> list[object]:
    """The packets in ``data``; the reason strings a DISCONNECT carries are dropped unless
    asked for, so tests compare reason codes."""
    decoder = Decoder(version)
    decoder.feed(data)
    out = []
    while (p := decoder.next_packet()) is not None:
        if isinstance(p, Disconnect) and not reason_strings:
            p = Disconnect(p.reason_code, replace(p.properties, reason_string=None))
        out.append(p)
    return out


def events(conn: ServerConnection) -> list[object]:
    out = []
    while (e := conn.next_event()) is not None:
        out.append(e)
    return out


def send(conn: ServerConnection, version: int, *packets: object, now: float = 0.0) -> list[object]:
    conn.receive_data(wire(version, *packets), now)
    return events(conn)


def connected(version: int, connect: Connect | None = None, **kw: object) -> ServerConnection:
    conn = ServerConnection(**kw)  # type: ignore[arg-type]
    [ev] = send(conn, version, connect or Connect("c1", keep_alive=10))
    assert isinstance(ev, ConnectRequested)
    conn.accept()
    return conn


# ----------------------------------------------------------------------------- handshake


def test_handshake_v311() -> None:
    conn = ServerConnection()
    will = Will("dead", b"bye", 1)
    evs = send(conn, V3, Connect("dev-1", False, 30, "u", b"p", will))
    assert evs == [ConnectRequested("dev-1", False, 30, "u", b"p", will, Properties(), V3)]
    assert conn.state is State.CONNECT_RECEIVED
    assert decode(V3, conn.accept(session_present=True)) == [ConnAck(True, ConnectReturnCode.Accepted)]
    assert conn.state is State.CONNECTED and conn.version == V3


def test_handshake_v5_advertises_our_limits() -> None:
    conn = ServerConnection(receive_maximum=10, topic_alias_maximum=5, max_packet_size=4096)
    [ev] = send(conn, V5, Connect("", properties=Properties(receive_maximum=3)))
    assert isinstance(ev, ConnectRequested) and ev.version == V5
    [ack] = decode(V5, conn.accept(assigned_client_id="gen-1"))
    assert isinstance(ack, ConnAck) and ack.reason_code == ReasonCode.Success
    assert ack.properties == Properties(assigned_client_identifier="gen-1", receive_maximum=10,
                                        topic_alias_maximum=5, maximum_packet_size=4096)


def test_packets_after_connect_wait_for_accept() -> None:
    conn = ServerConnection()
    evs = send(conn, V5, Connect("c"), Publish("t", b"x"), PingReq())
    assert [type(e) for e in evs] == [ConnectRequested]
    assert conn.data_to_send() == b""
    conn.accept()
    assert events(conn) == [MessagePublished("t", b"x", 0, False, None)]
    assert decode(V5, conn.data_to_send()) == [PingResp()]


@pytest.mark.parametrize(("version", "reason", "expected"), [
    (V3, ReasonCode.BadUserNameOrPassword, ConnAck(False, ConnectReturnCode.BadUserNameOrPassword)),
    (V3, ReasonCode.NotAuthorized, ConnAck(False, ConnectReturnCode.NotAuthorized)),
    (V5, ReasonCode.Banned, ConnAck(False, ReasonCode.Banned)),
])
def test_refuse_sends_a_failing_connack_and_closes(version: int, reason: ReasonCode,
                                                    expected: ConnAck) -> None:
    conn = ServerConnection()
    send(conn, version, Connect("c"), Publish("t", b"ignored"))
    assert decode(version, conn.refuse(reason)) == [expected]
    assert conn.state is State.CLOSED and events(conn) == []


def test_refuse_v311_without_a_return_code_just_closes() -> None:
    conn = ServerConnection()
    send(conn, V3, Connect("c"))
    assert conn.refuse(ReasonCode.Banned) == b""
    assert conn.state is State.CLOSED


def test_unsupported_protocol_level_gets_connack_0x01() -> None:
    conn = ServerConnection()
    raw = bytearray(encode(Connect("c"), V3))
    raw[8] = 3  # protocol level byte after the 0x0004 "MQTT" name
    conn.receive_data(bytes(raw), 0.0)
    assert events(conn) == [ConnectionClosed(ReasonCode.UnsupportedProtocolVersion, True)]
    assert decode(V3, conn.data_to_send()) == [ConnAck(False, ConnectReturnCode.UnacceptableProtocolVersion)]


# ----------------------------------------------------------------------------- inbound publish


@BOTH
def test_qos0_and_qos1_inbound(version: int) -> None:
    conn = connected(version)
    evs = send(conn, version, Publish("a", b"0"), Publish("b", b"1", 1, True, packet_id=7))
    assert evs == [MessagePublished("a", b"0", 0, False, None),
                   MessagePublished("b", b"1", 1, True, 7)]
    assert decode(version, conn.ack_publish(7)) == [PubAck(7)]
    with pytest.raises(ConnectionStateError):
        conn.ack_publish(7)


@BOTH
def test_qos2_inbound_is_exactly_once(version: int) -> None:
    conn = connected(version)
    pub = Publish("t", b"x", 2, packet_id=9)
    assert send(conn, version, pub) == [MessagePublished("t", b"x", 2, False, 9)]
    assert send(conn, version, Publish("t", b"x", 2, dup=True, packet_id=9)) == []  # before PUBREC
    assert decode(version, conn.ack_publish(9)) == [PubRec(9)]
    assert send(conn, version, Publish("t", b"x", 2, dup=True, packet_id=9)) == []  # PUBREC lost
    assert decode(version, conn.data_to_send()) == [PubRec(9)]
    assert send(conn, version, PubRel(9)) == []
    assert decode(version, conn.data_to_send()) == [PubComp(9)]
    # The id is free again: a new message with it is a new message.
    assert send(conn, version, pub) == [MessagePublished("t", b"x", 2, False, 9)]


def test_pubrel_for_unknown_id_v5_gets_packet_identifier_not_found() -> None:
    conn = connected(V5)
    assert send(conn, V5, PubRel(3)) == []
    assert decode(V5, conn.data_to_send()) == [PubComp(3, ReasonCode.PacketIdentifierNotFound)]
    assert conn.state is State.CONNECTED


def test_pubrel_for_unknown_id_v311_still_gets_pubcomp() -> None:
    conn = connected(V3)
    send(conn, V3, PubRel(3))
    assert decode(V3, conn.data_to_send()) == [PubComp(3)]


def test_receive_maximum_exceeded_closes_v5() -> None:
    conn = connected(V5, receive_maximum=2)
    evs = send(conn, V5, *(Publish("t", b"", 1, packet_id=i) for i in (1, 2, 3)))
    assert evs[-1] == ConnectionClosed(ReasonCode.ReceiveMaximumExceeded, True)
    assert decode(V5, conn.data_to_send()) == [Disconnect(ReasonCode.ReceiveMaximumExceeded)]


def test_topic_alias_set_then_used() -> None:
    conn = connected(V5, topic_alias_maximum=4)
    evs = send(conn, V5, Publish("long/topic", b"1", properties=Properties(topic_alias=2)),
               Publish("", b"2", properties=Properties(topic_alias=2, content_type="x")))
    assert evs == [MessagePublished("long/topic", b"1", 0, False, None),
                   MessagePublished("long/topic", b"2", 0, False, None, Properties(content_type="x"))]


@pytest.mark.parametrize("publish", [
    Publish("", b"", properties=Properties(topic_alias=1)),  # never set
    Publish("t", b"", properties=Properties(topic_alias=5)),  # above our maximum of 4
])
def test_bad_topic_alias_is_topic_alias_invalid(publish: Publish) -> None:
    conn = connected(V5, topic_alias_maximum=4)
    assert send(conn, V5, publish) == [ConnectionClosed(ReasonCode.TopicAliasInvalid, True)]
    assert decode(V5, conn.data_to_send()) == [Disconnect(ReasonCode.TopicAliasInvalid)]


# ----------------------------------------------------------------------------- subscribe, ping


@BOTH
def test_subscribe_and_unsubscribe(version: int) -> None:
    conn = connected(version)
    subs = (Subscription("a/+", 1), Subscription("b/#", 2))
    [ev] = send(conn, version, Subscribe(5, subs))
    assert ev == SubscribeRequested(5, subs)
    granted = [ReasonCode.GrantedQoS1, ReasonCode.NotAuthorized]
    expected = (1, 0x80) if version == V3 else (1, 0x87)
    [ack] = decode(version, conn.ack_subscribe(5, granted))
    assert isinstance(ack, SubAck) and tuple(ack.reason_codes) == expected
    assert send(conn, version, Unsubscribe(6, ("a/+",))) == [UnsubscribeRequested(6, ("a/+",))]
    reasons = () if version == V3 else (ReasonCode.Success,)
    assert decode(version, conn.ack_unsubscribe(6)) == [UnsubAck(6, reasons)]


@BOTH
def test_pingreq_is_answered_automatically(version: int) -> None:
    conn = connected(version)
    assert send(conn, version, PingReq(), PingReq()) == []
    assert decode(version, conn.data_to_send()) == [PingResp(), PingResp()]
    assert conn.data_to_send() == b""


# ----------------------------------------------------------------------------- keepalive, close


@BOTH
def test_keepalive_timeout_after_one_and_a_half_periods(version: int) -> None:
    conn = connected(version)  # keep_alive=10, accepted at t=0
    send(conn, version, PingReq(), now=5.0)
    conn.check_timeouts(19.9)
    assert events(conn) == []
    conn.check_timeouts(20.0)
    assert events(conn) == [ConnectionClosed(ReasonCode.KeepAliveTimeout, True)]
    conn.data_to_send()
    conn.check_timeouts(100.0)
    assert events(conn) == [] and conn.state is State.CLOSED


def test_keepalive_zero_never_times_out() -> None:
    conn = connected(V3, Connect("c", keep_alive=0))
    conn.check_timeouts(1e9)
    assert events(conn) == []


@BOTH
def test_clean_disconnect_suppresses_the_will(version: int) -> None:
    conn = connected(version)
    assert send(conn, version, Disconnect()) == [ConnectionClosed(ReasonCode.NormalDisconnection, False)]
    assert send(conn, version, Publish("after", b"")) == []


def test_disconnect_with_will_message_v5() -> None:
    conn = connected(V5)
    evs = send(conn, V5, Disconnect(ReasonCode.DisconnectWithWillMessage))
    assert evs == [ConnectionClosed(ReasonCode.DisconnectWithWillMessage, True)]


@BOTH
def test_eof_is_an_abnormal_close(version: int) -> None:
    conn = connected(version)
    conn.receive_data(b"", 1.0)
    assert events(conn) == [ConnectionClosed(ReasonCode.UnspecifiedError, True)]


@pytest.mark.parametrize(("version", "expected"), [(V3, b""), (V5, None)])
def test_server_disconnect(version: int, expected: bytes | None) -> None:
    conn = connected(version)
    out = conn.disconnect(ReasonCode.ServerShuttingDown)
    if version == V5:
        assert decode(V5, out) == [Disconnect(ReasonCode.ServerShuttingDown)]
    else:
        assert out == expected
    assert conn.state is State.CLOSED and conn.disconnect() == b""


# ----------------------------------------------------------------------------- protocol errors


@pytest.mark.parametrize("packet", [
    Connect("again"), ConnAck(), SubAck(1, (0,)), UnsubAck(1, (ReasonCode.Success,)), PingResp(),
    Auth(),
])
def test_packets_not_allowed_when_connected_v5(packet: object) -> None:
    conn = connected(V5)
    assert send(conn, V5, packet) == [ConnectionClosed(ReasonCode.ProtocolError, True)]
    assert decode(V5, conn.data_to_send()) == [Disconnect(ReasonCode.ProtocolError)]


@pytest.mark.parametrize("packet", [Connect("again"), ConnAck(), SubAck(1, (0,)), PingResp()])
def test_packets_not_allowed_when_connected_v311_just_close(packet: object) -> None:
    conn = connected(V3)
    assert send(conn, V3, packet) == [ConnectionClosed(ReasonCode.ProtocolError, True)]
    assert conn.data_to_send() == b""


@BOTH
@pytest.mark.parametrize("packet", [PingReq(), Publish("t", b""), Subscribe(1, (Subscription("a"),)),
                                    Disconnect()])
def test_anything_but_connect_first_closes_silently(version: int, packet: object) -> None:
    conn = ServerConnection()
    assert send(conn, version, packet) == [ConnectionClosed(ReasonCode.ProtocolError, True)]
    assert conn.data_to_send() == b""


def test_malformed_bytes_after_connack_v5_send_disconnect_0x81() -> None:
    conn = connected(V5)
    conn.receive_data(bytes([0xC1, 0x00]), 0.0)  # PINGREQ with reserved flags set
    assert events(conn) == [ConnectionClosed(ReasonCode.MalformedPacket, True)]
    assert decode(V5, conn.data_to_send()) == [Disconnect(ReasonCode.MalformedPacket)]


def test_packet_larger_than_our_maximum_v5() -> None:
    conn = connected(V5, max_packet_size=64)
    assert send(conn, V5, Publish("t", b"x" * 100)) == [ConnectionClosed(ReasonCode.PacketTooLarge, True)]
    assert decode(V5, conn.data_to_send()) == [Disconnect(ReasonCode.PacketTooLarge)]


def test_adapter_misuse_raises_connection_state_error() -> None:
    conn = ServerConnection()
    with pytest.raises(ConnectionStateError):
        conn.publish("t", b"")
    send(conn, V3, Connect("c"))
    with pytest.raises(ConnectionStateError):
        conn.ack_subscribe(1, [0])


# ----------------------------------------------------------------------------- outbound


@BOTH
def test_outbound_qos1(version: int) -> None:
    conn = connected(version)
    pid, data = conn.publish("t", b"m", 1)
    assert decode(version, data) == [Publish("t", b"m", 1, packet_id=pid)]
    assert send(conn, version, PubAck(pid)) == [PublishAcknowledged(pid)]
    assert send(conn, version, PubAck(pid)) == []  # late duplicate ignored


@BOTH
def test_outbound_qos2(version: int) -> None:
    conn = connected(version)
    pid, _ = conn.publish("t", b"m", 2)
    assert send(conn, version, PubRec(pid)) == []
    assert decode(version, conn.data_to_send()) == [PubRel(pid)]
    assert send(conn, version, PubRec(pid)) == []  # our PUBREL was lost
    assert decode(version, conn.data_to_send()) == [PubRel(pid)]
    assert send(conn, version, PubComp(pid)) == [PublishAcknowledged(pid)]


def test_outbound_qos2_refused_by_pubrec_v5() -> None:
    conn = connected(V5)
    pid, _ = conn.publish("t", b"m", 2)
    assert send(conn, V5, PubRec(pid, ReasonCode.QuotaExceeded)) == [
        PublishAcknowledged(pid, ReasonCode.QuotaExceeded)]
    assert conn.data_to_send() == b"" and conn.send_quota == 65_535


def test_qos0_outbound_has_no_packet_id() -> None:
    conn = connected(V3)
    assert conn.publish("t", b"m") == (None, encode(Publish("t", b"m"), V3))


def test_one_message_shared_by_connections_is_right_for_each() -> None:
    """A fan-out shares the message's encodings: each client still gets its own packet id,
    QoS, retain flag and version's layout."""
    shared: dict = {}
    payload = b"x" * 200  # a two-byte remaining length
    first, second, old = connected(V5), connected(V5), connected(V3)
    second.publish("t", b"", 1)  # so the ids differ
    sent = [(conn, version, conn.publish("dev/1", payload, qos, retain, encoded=shared))
            for conn, version, qos, retain in ((first, V5, 1, False), (second, V5, 1, False),
                                               (old, V3, 1, False), (first, V5, 0, True))]
    for conn, version, (pid, data) in sent:
        [packet] = decode(version, data)
        qos = 0 if pid is None else 1
        assert packet == Publish("dev/1", payload, qos, qos == 0, packet_id=pid)
    assert sent[0][2][0] != sent[1][2][0]
    assert len(shared) == 3  # QoS 1 in MQTT 5, in 3.1.1, and QoS 0 retained


def test_packet_ids_skip_in_flight_and_wrap() -> None:
    conn = connected(V3)
    first = [conn.publish("t", b"", 1)[0] for _ in range(3)]
    assert first == [1, 2, 3]
    send(conn, V3, PubAck(2))
    conn._next_packet_id = 0xFFFF  # jump to the end of the id space
    assert [conn.publish("t", b"", 1)[0] for _ in range(3)] == [0xFFFF, 2, 4]


def test_receive_maximum_window() -> None:
    conn = connected(V5, Connect("c", properties=Properties(receive_maximum=2)))
    assert conn.send_quota == 2
    conn.publish("t", b"", 1)
    pid2, _ = conn.publish("t", b"", 2)
    assert conn.send_quota == 0
    with pytest.raises(FlowControlFull):
        conn.publish("t", b"", 1)
    assert conn.publish("t", b"", 0)[0] is None  # QoS 0 is not counted
    send(conn, V5, PubRec(pid2), PubComp(pid2))
    assert conn.send_quota == 1
    conn.publish("t", b"", 1)


def test_publish_over_the_clients_maximum_packet_size_is_refused() -> None:
    conn = connected(V5, Connect("c", properties=Properties(maximum_packet_size=20)))
    with pytest.raises(ValueError):
        conn.publish("t", b"x" * 50, 1)
    assert conn.send_quota == 65_535


@BOTH
def test_pending_resend_sets_dup_and_resends_pubrel(version: int) -> None:
    conn = connected(version)
    p1, _ = conn.publish("a", b"1", 1)
    p2, _ = conn.publish("b", b"2", 2)
    p3, _ = conn.publish("c", b"3", 2)
    send(conn, version, PubRec(p3))
    resend = [decode(version, data)[0] for data in conn.pending_resend()]
    assert resend == [Publish("a", b"1", 1, dup=True, packet_id=p1),
                      Publish("b", b"2", 2, dup=True, packet_id=p2), PubRel(p3)]


@pytest.mark.parametrize("ack", [PubComp(1), PubRec(1)])
def test_wrong_ack_for_outbound_message_is_a_protocol_error(ack: object) -> None:
    conn = connected(V5)
    kind = 1 if isinstance(ack, PubRec) else 2  # PUBREC for QoS 1, PUBCOMP before PUBREC
    conn.publish("t", b"", kind)
    assert send(conn, V5, ack) == [ConnectionClosed(ReasonCode.ProtocolError, True)]


# ----------------------------------------------------------------------------- byte at a time


@BOTH
def test_one_byte_at_a_time_equals_whole(version: int) -> None:
    script = [Connect("c", keep_alive=5), Publish("a", b"1" * 200, 1, packet_id=1),
              Subscribe(2, (Subscription("x/#", 1),)), PingReq(), Publish("b", b"", 2, packet_id=3),
              Unsubscribe(4, ("x/#",)), Disconnect()]
    data = wire(version, *script)

    def run(chunks: list[bytes]) -> tuple[list[object], bytes]:
        conn, seen, out = ServerConnection(), [], b""
        for chunk in chunks:
            conn.receive_data(chunk, 0.0)
            while (e := conn.next_event()) is not None:
                seen.append(e)
                if isinstance(e, ConnectRequested):
                    out += conn.accept()
            out += conn.data_to_send()
        return seen, out

    whole = run([data])
    assert run([data[i:i + 1] for i in range(len(data))]) == whole
    assert [type(e).__name__ for e in whole[0]] == [
        "ConnectRequested", "MessagePublished", "SubscribeRequested", "MessagePublished",
        "UnsubscribeRequested", "ConnectionClosed"]


# ----------------------------------------------------------------------------- session resumption


@BOTH
def test_inflight_state_survives_a_reconnect(version: int) -> None:
    old = connected(version)
    p1, _ = old.publish("a", b"1", 1)
    p2, _ = old.publish("b", b"2", 2)
    send(old, version, PubRec(p2), Publish("in", b"q2", 2, packet_id=8))
    old.ack_publish(8)
    old.receive_data(b"", 1.0)  # connection lost
    state = old.inflight()

    new = ServerConnection()
    send(new, version, Connect("c1", clean_start=False))
    new.accept(session_present=True, resume=state)
    assert [decode(version, d)[0] for d in new.pending_resend()] == [
        Publish("a", b"1", 1, dup=True, packet_id=p1), PubRel(p2)]
    # The inbound QoS 2 message is not delivered twice; its PUBREL completes it.
    assert send(new, version, Publish("in", b"q2", 2, dup=True, packet_id=8), PubRel(8)) == []
    assert decode(version, new.data_to_send()) == [PubRec(8), PubComp(8)]
    assert send(new, version, PubAck(p1), PubComp(p2)) == [PublishAcknowledged(p1),
                                                          PublishAcknowledged(p2)]
    assert new.publish("c", b"3", 1)[0] == p2 + 1  # allocation continues where it stopped


# ----------------------------------------------------------------------------- CONNACK promises


@pytest.mark.parametrize(("accepted", "publish", "reason"), [
    (Properties(maximum_qos=1), Publish("t", b"", 2, packet_id=1), ReasonCode.QoSNotSupported),
    (Properties(retain_available=0), Publish("t", b"", retain=True), ReasonCode.RetainNotSupported),
])
def test_publish_breaking_what_connack_said_is_refused(accepted: Properties, publish: Publish,
                                                       reason: ReasonCode) -> None:
    conn = ServerConnection()
    send(conn, V5, Connect("c"))
    conn.accept(properties=accepted)
    assert send(conn, V5, publish) == [ConnectionClosed(reason, True)]
    assert decode(V5, conn.data_to_send()) == [Disconnect(reason)]


def test_disconnect_may_not_set_session_expiry_after_connect_said_zero() -> None:
    conn = connected(V5)
    evs = send(conn, V5, Disconnect(properties=Properties(session_expiry_interval=60)))
    assert evs == [ConnectionClosed(ReasonCode.ProtocolError, True)]


def test_disconnect_may_change_a_nonzero_session_expiry() -> None:
    conn = connected(V5, Connect("c", properties=Properties(session_expiry_interval=10)))
    evs = send(conn, V5, Disconnect(properties=Properties(session_expiry_interval=60)))
    assert evs == [ConnectionClosed(ReasonCode.NormalDisconnection, False, 60)]


def test_late_ack_after_close_is_kept_for_the_session() -> None:
    conn = connected(V5)
    send(conn, V5, Publish("t", b"", 2, packet_id=4))
    conn.receive_data(b"", 1.0)
    assert conn.ack_publish(4) == b""  # the store finished after the client went away
    assert conn.inflight().awaiting_pubrel == ((4, ReasonCode.Success),)


# ----------------------------------------------------------------------------- outbound aliases


def test_outbound_topic_aliases_up_to_the_clients_maximum() -> None:
    conn = connected(V5, Connect("c", properties=Properties(topic_alias_maximum=1)))
    wires = [decode(V5, conn.publish(t, b"", 1)[1])[0] for t in ("a/b", "a/b", "c")]
    assert [(p.topic, p.properties.topic_alias) for p in wires] == [  # type: ignore[attr-defined]
        ("a/b", 1), ("", 1), ("c", None)]
    # Resends go to a new connection, where aliases start over: they keep the full topic.
    assert {decode(V5, d)[0].topic for d in conn.pending_resend()} == {"a/b", "c"}  # type: ignore[attr-defined]


def test_no_outbound_aliases_unless_the_client_allows_them() -> None:
    conn = connected(V5)
    first, second = (decode(V5, conn.publish("a", b"")[1])[0] for _ in range(2))
    assert first == second == Publish("a", b"")


def test_an_alias_is_not_taken_by_a_publish_that_was_too_large() -> None:
    props = Properties(topic_alias_maximum=2, maximum_packet_size=40)
    conn = connected(V5, Connect("c", properties=props))
    with pytest.raises(ValueError):
        conn.publish("t", b"x" * 100)
    [p] = decode(V5, conn.publish("t", b"")[1])
    assert p == Publish("t", b"", properties=Properties(topic_alias=1))


# ----------------------------------------------------------------------------- adapter releases


@BOTH
def test_adapter_releases_outbound_qos2_only_after_persisting(version: int) -> None:
    conn = connected(version, adapter_releases=True)
    packet_id, _ = conn.publish("t", b"x", qos=2, packet_id=77)
    assert packet_id == 77
    assert send(conn, version, PubRec(77)) == [PublishReceived(77)]
    assert conn.data_to_send() == b""  # no PUBREL until the adapter says so
    assert decode(version, conn.release(77)) == [PubRel(77)]
    assert send(conn, version, PubComp(77)) == [PublishAcknowledged(77)]


@BOTH
def test_adapter_releases_inbound_qos2_only_after_persisting(version: int) -> None:
    conn = connected(version, adapter_releases=True)
    [published] = send(conn, version, Publish("t", b"x", 2, packet_id=9))
    conn.ack_publish(9)
    assert send(conn, version, PubRel(9)) == [ReleaseRequested(9)]
    assert conn.data_to_send() == b""
    assert decode(version, conn.complete(9)) == [PubComp(9)]
    assert conn.inflight().awaiting_pubrel == ()


def test_publish_with_a_chosen_packet_id_refuses_one_in_flight() -> None:
    conn = connected(V5)
    conn.publish("t", b"x", qos=1, packet_id=5)
    with pytest.raises(ConnectionStateError):
        conn.publish("t", b"y", qos=1, packet_id=5)
    _, data = conn.publish("t", b"z", qos=1, packet_id=6, dup=True)
    [packet] = decode(V5, data)
    assert packet.dup and packet.packet_id == 6


@given(topic=st.text(st.characters(blacklist_characters="\x00+#", blacklist_categories=("Cs",)),
                     min_size=1, max_size=300),
       payload=st.binary(max_size=300), qos=st.integers(0, 2), retain=st.booleans(),
       dup=st.booleans(), version=st.sampled_from([V3, V5]))
def test_fast_publish_encoding_equals_the_codec(topic: str, payload: bytes, qos: int, retain: bool,
                                                dup: bool, version: int) -> None:
    conn = connected(version)
    packet_id, data = conn.publish(topic, payload, qos, retain, dup=dup and qos > 0)
    assert data == encode(Publish(topic, payload, qos, retain, dup and qos > 0, packet_id), version)


def test_a_protocol_error_disconnect_says_what_was_wrong() -> None:
    conn = connected(V5)
    conn.receive_data(wire(V5, Publish("t", b"x", 1, packet_id=1,
                                       properties=Properties(topic_alias=99))), 0.0)
    [disconnect] = decode(V5, conn.data_to_send(), reason_strings=True)
    assert disconnect.reason_code == ReasonCode.TopicAliasInvalid
    assert "topic alias 99" in disconnect.properties.reason_string
