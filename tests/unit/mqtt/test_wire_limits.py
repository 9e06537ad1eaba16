"""What a hostile peer can make one MQTT connection parse or hold: linear property decoding, the
user property cap, the packet size before CONNACK, the CONNECT timeout, client id and topic
caps, and answers to packets read just before the connection closed. Plain bytes in, decoded
packets and events out; no sockets."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from protocols.mqtt.codec import Decoder, encode
from protocols.mqtt.connection import ServerConnection
from protocols.mqtt.events import ConnectionClosed, ConnectRequested, SubscribeRequested
from protocols.mqtt.limits import Limits, connection_limit
from protocols.mqtt.packets import (ConnAck, Connect, Disconnect, Publish, Subscribe,
                                    Subscription, Will)
from protocols.mqtt.properties import Properties, Reader, TooManyProperties, decode_properties, varint
from protocols.mqtt.reason_codes import PacketTooLarge, PacketType, ReasonCode
from protocols.mqtt.state_table import State

V3, V5 = 4, 5
LIMITS = Limits(max_connect_packet_size=64 << 10, connect_timeout=10.0, max_client_id_length=23,
                max_topic_length=32, max_topic_levels=4, max_user_properties=8)


def empty_user_properties(count: int) -> bytes:
    """A property block of ``count`` user properties with empty name and value (5 bytes each)."""
    body = b"\x26\x00\x00\x00\x00" * count
    return varint(len(body)) + body


def decode_seconds(count: int, cap: int | None = None) -> float:
    """Best of three: seconds to decode a block of ``count`` empty user properties."""
    block = empty_user_properties(count)
    best = float("inf")
    for _ in range(3):
        began = time.perf_counter()
        decode_properties(Reader(block, cap), PacketType.PUBLISH)
        best = min(best, time.perf_counter() - began)
    return best


def test_property_decoding_is_linear_in_the_number_of_properties() -> None:
    """Ten times the user properties cost about ten times as long, not a hundred (the list
    was once grown by tuple concatenation: 790,000 properties blocked the loop for minutes)."""
    small, large = decode_seconds(4_000), decode_seconds(40_000)
    assert large / small < 30, f"4,000 properties: {small:.4f} s, 40,000: {large:.4f} s"


def test_the_user_property_cap_stops_reading_at_the_cap() -> None:
    """790,000 user properties under a cap of 128: refused with 0x97 after reading 129 of them,
    in about the time 129 take."""
    block = empty_user_properties(790_000)
    began = time.perf_counter()
    with pytest.raises(TooManyProperties) as refused:
        decode_properties(Reader(block, 128), PacketType.CONNECT)
    assert time.perf_counter() - began < 0.05
    assert refused.value.reason_code == ReasonCode.QuotaExceeded
    assert len(decode_properties(Reader(empty_user_properties(128), 128),
                                 PacketType.CONNECT).user_properties) == 128


def events(conn: ServerConnection) -> list[object]:
    out = []
    while (event := conn.next_event()) is not None:
        out.append(event)
    return out


def answers(version: int, data: bytes) -> list[object]:
    """The packets in what the server wrote, reason strings dropped (tests compare codes)."""
    decoder = Decoder(version)
    decoder.feed(data)
    out = []
    while (packet := decoder.next_packet()) is not None:
        if isinstance(packet, (ConnAck, Disconnect)):
            packet = replace(packet, properties=replace(packet.properties, reason_string=None))
        out.append(packet)
    return out


def opened(**kw: object) -> ServerConnection:
    return ServerConnection(limits=LIMITS, max_packet_size=1 << 20, **kw)  # type: ignore[arg-type]


def connected(version: int) -> ServerConnection:
    conn = opened()
    conn.receive_data(encode(Connect("c1"), version), 0.0)
    assert isinstance(events(conn)[0], ConnectRequested)
    conn.accept()
    return conn


def closed_with(conn: ServerConnection, reason: ReasonCode) -> bool:
    evs = events(conn)
    return conn.state is State.CLOSED and len(evs) == 1 and \
        isinstance(evs[0], ConnectionClosed) and evs[0].reason_code == reason


def test_a_connect_with_too_many_user_properties_is_refused_with_connack_0x97() -> None:
    """Only MQTT 5 packets carry properties: CONNACK 0x97 Quota exceeded, then close."""
    conn = opened()
    props = Properties(user_properties=tuple((f"k{i}", "v") for i in range(9)))
    conn.receive_data(encode(Connect("c1", properties=props), V5), 0.0)
    assert closed_with(conn, ReasonCode.QuotaExceeded)
    assert answers(V5, conn.data_to_send()) == [ConnAck(False, ReasonCode.QuotaExceeded)]


def test_a_publish_with_too_many_user_properties_gets_disconnect_0x97() -> None:
    conn = connected(V5)
    props = Properties(user_properties=tuple(("k", "v") for _ in range(9)))
    conn.receive_data(encode(Publish("a/b", b"x", 1, packet_id=1, properties=props), V5), 1.0)
    assert closed_with(conn, ReasonCode.QuotaExceeded)
    assert answers(V5, conn.data_to_send()) == [Disconnect(ReasonCode.QuotaExceeded)]


@pytest.mark.parametrize("version", [V3, V5])
def test_a_connect_larger_than_the_pre_auth_limit_is_refused_from_its_fixed_header(version) -> None:
    """The fixed header and protocol name of a 4 MB CONNECT are enough: the connection closes
    (MQTT 5: CONNACK 0x95 Packet too large) before the rest is buffered, and what arrives
    afterwards is not kept."""
    body_length = 4 << 20
    header = bytes([0x10]) + varint(body_length) + b"\x00\x04MQTT" + bytes([version])
    conn = opened()
    conn.receive_data(header, 0.0)
    assert closed_with(conn, ReasonCode.PacketTooLarge)
    expected = [ConnAck(False, ReasonCode.PacketTooLarge)] if version == V5 else []
    assert answers(version, conn.data_to_send()) == expected
    conn.receive_data(b"\x00" * (1 << 20), 0.1)
    assert events(conn) == [] and len(conn._decoder._buffer) == 0


def test_the_packet_size_limit_rises_to_max_packet_size_once_accepted() -> None:
    conn = connected(V5)
    conn.receive_data(encode(Publish("a/b", b"x" * (200 << 10)), V5), 1.0)
    [published] = events(conn)
    assert len(published.payload) == 200 << 10 and conn.state is State.CONNECTED


def test_a_connection_without_a_whole_connect_is_closed_after_the_timeout() -> None:
    """A silent connection, and one that sent half a CONNECT, are closed once
    ``connect_timeout`` has passed since they opened; nothing is sent to them."""
    silent = ServerConnection(limits=LIMITS, opened_at=100.0)
    partial = ServerConnection(limits=LIMITS, opened_at=100.0)
    partial.receive_data(encode(Connect("c1"), V5)[:7], 100.5)
    for conn in (silent, partial):
        conn.check_timeouts(109.9)
        assert events(conn) == [] and conn.state is State.CONNECTING
        conn.check_timeouts(110.0)
        assert closed_with(conn, ReasonCode.MaximumConnectTime)
        assert conn.data_to_send() == b""


def test_the_connect_timeout_does_not_apply_once_connect_arrived() -> None:
    conn = ServerConnection(limits=LIMITS, opened_at=0.0)
    conn.receive_data(encode(Connect("c1"), V5), 1.0)
    assert isinstance(events(conn)[0], ConnectRequested)
    conn.check_timeouts(60.0)
    assert events(conn) == [] and conn.state is State.CONNECT_RECEIVED


@pytest.mark.parametrize("version, connack", [(V5, ConnAck(False, ReasonCode.ClientIdentifierNotValid)),
                                              (V3, ConnAck(False, 2))])
def test_a_client_id_over_the_limit_is_refused(version, connack) -> None:
    """24 UTF-8 bytes > 23: MQTT 5 CONNACK 0x85, MQTT 3.1.1 return code 2 (identifier
    rejected). The limit counts bytes: 12 two-byte characters are 24 bytes."""
    for client_id in ("x" * 24, "é" * 12):
        conn = opened()
        conn.receive_data(encode(Connect(client_id), version), 0.0)
        assert closed_with(conn, ReasonCode.ClientIdentifierNotValid)
        assert answers(version, conn.data_to_send()) == [connack]
    ok = opened()
    ok.receive_data(encode(Connect("x" * 23), version), 0.0)
    assert isinstance(events(ok)[0], ConnectRequested)


@pytest.mark.parametrize("topic", ["t" * 33, "a/b/c/d/e"], ids=["33-bytes", "5-levels"])
@pytest.mark.parametrize("version, disconnect", [(V5, [Disconnect(ReasonCode.TopicNameInvalid)]),
                                                 (V3, [])])
def test_a_publish_topic_over_the_limits_closes_the_connection(topic, version, disconnect) -> None:
    conn = connected(version)
    conn.receive_data(encode(Publish(topic, b"x"), version), 1.0)
    assert closed_with(conn, ReasonCode.TopicNameInvalid)
    assert answers(version, conn.data_to_send()) == disconnect


def test_a_will_topic_over_the_limits_is_refused_with_connack_0x90() -> None:
    conn = opened()
    conn.receive_data(encode(Connect("c1", will=Will("a/b/c/d/e")), V5), 0.0)
    assert closed_with(conn, ReasonCode.TopicNameInvalid)
    assert answers(V5, conn.data_to_send()) == [ConnAck(False, ReasonCode.TopicNameInvalid)]


def test_topics_within_the_limits_pass() -> None:
    conn = connected(V5)
    conn.receive_data(encode(Publish("a/b/c/" + "d" * 26, b"x"), V5), 1.0)
    [published] = events(conn)
    assert published.topic == "a/b/c/" + "d" * 26


def test_filter_limits_count_bytes_and_levels() -> None:
    assert LIMITS.topic_problem("a/+/#") is None
    assert LIMITS.topic_problem("é" * 16) is None
    assert "max_topic_length" in LIMITS.topic_problem("é" * 17)
    assert "max_topic_levels" in LIMITS.topic_problem("+/+/+/+/#")


def test_a_publish_from_a_client_with_a_subscription_identifier_is_a_protocol_error() -> None:
    conn = connected(V5)
    props = Properties(subscription_identifiers=tuple(range(1, 1000)))
    conn.receive_data(encode(Publish("a/b", b"x", properties=props), V5), 1.0)
    assert closed_with(conn, ReasonCode.ProtocolError)


@pytest.mark.parametrize("version", [V3, V5])
def test_packets_read_just_before_a_close_can_still_be_answered(version) -> None:
    """A SUBSCRIBE followed by garbage in one read: the adapter sees SubscribeRequested, then
    ConnectionClosed; answering the SUBSCRIBE then sends nothing and raises nothing."""
    conn = connected(version)
    conn.receive_data(encode(Subscribe(1, (Subscription("a/#", 1),)), version) + b"\x00\x00", 1.0)
    subscribe, closed = events(conn)
    assert isinstance(subscribe, SubscribeRequested) and isinstance(closed, ConnectionClosed)
    assert conn.ack_subscribe(1, [1]) == b""
    assert conn.ack_unsubscribe(1) == b""
    assert conn.complete(1) == b""


def test_the_automatic_connection_limit_leaves_descriptors_for_the_store() -> None:
    import resource
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert connection_limit(250) == 250
    assert 16 <= connection_limit(0) <= soft - min(512, soft // 2)


def test_a_decoder_error_drops_what_was_buffered() -> None:
    decoder = Decoder(V5, max_packet_size=100)
    decoder.feed(bytes([0x30]) + varint(1000) + b"x" * 50)
    with pytest.raises(PacketTooLarge):
        decoder.next_packet()
    assert len(decoder._buffer) == 0
