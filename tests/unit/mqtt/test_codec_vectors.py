"""MQTT codec against known byte vectors (spec examples and what paho-mqtt sends) and against
every malformed case the codec must refuse, each with its reason code."""

from __future__ import annotations

import pytest

from protocols.mqtt.codec import Decoder, encode
from protocols.mqtt.packets import (Auth, ConnAck, Connect, Disconnect, PingReq, PubAck, PubRec,
                                    PubRel, Publish, SubAck, Subscribe, Subscription, UnsubAck, Will)
from protocols.mqtt.properties import Properties, Reader, varint
from protocols.mqtt.reason_codes import (ConnectReturnCode, MalformedPacket, MqttError,
                                         ReasonCode, UnsupportedProtocolVersion)

CONNECT_311 = bytes.fromhex("101000044d5154540402003c000474657374")  # paho: id "test", keepalive 60
CONNECT_5 = bytes.fromhex("100d00044d5154540502003c000000")  # empty id, no properties


def decode_all(data: bytes, version: int | None) -> list[object]:
    decoder = Decoder(version)
    decoder.feed(data)
    packets = []
    while (packet := decoder.next_packet()) is not None:
        packets.append(packet)
    return packets


@pytest.mark.parametrize(("value", "wire"), [
    (0, "00"), (127, "7f"), (128, "8001"), (321, "c102"), (16_383, "ff7f"), (16_384, "808001"),
    (2_097_151, "ffff7f"), (2_097_152, "80808001"), (268_435_455, "ffffff7f"),
])
def test_variable_byte_integer_matches_the_spec_table(value: int, wire: str) -> None:
    assert varint(value).hex() == wire
    assert Reader(bytes.fromhex(wire)).varint() == value


@pytest.mark.parametrize(("version", "wire", "packet"), [
    (None, CONNECT_311, Connect("test", clean_start=True, keep_alive=60)),
    (None, CONNECT_5, Connect("", clean_start=True, keep_alive=60)),
    (4, "20020000", ConnAck(False, ConnectReturnCode.Accepted)),
    (4, "20020105", ConnAck(True, ConnectReturnCode.NotAuthorized)),
    (5, "2003000000", ConnAck(False, ReasonCode.Success)),
    (5, "20080087051100000000", ConnAck(False, ReasonCode.NotAuthorized,
                                      Properties(session_expiry_interval=0))),
    (4, "320c0003612f62000168656c6c6f", Publish("a/b", b"hello", qos=1, packet_id=1)),
    (5, "310800000323000a6869", Publish("", b"hi", retain=True, properties=Properties(topic_alias=10))),
    (4, "40020001", PubAck(1)),
    (5, "5003000510", PubRec(5, ReasonCode.NoMatchingSubscribers)),
    (5, "62020007", PubRel(7)),
    (4, "8206000a000161" + "01", Subscribe(10, (Subscription("a", 1),))),
    (5, "8207000a0000016126", Subscribe(10, (Subscription("a", 2, no_local=True,
                                                          retain_handling=2),))),
    (4, "9004000a0180", SubAck(10, (1, 0x80))),
    (5, "b005000a00118f", UnsubAck(10, (ReasonCode.NoSubscriptionExisted,
                                        ReasonCode.TopicFilterInvalid))),
    (4, "c000", PingReq()),
    (4, "e000", Disconnect()),
    (5, "e0018e", Disconnect(ReasonCode.SessionTakenOver)),
    (5, "f00118", Auth(ReasonCode.ContinueAuthentication)),
])
def test_known_bytes_decode_exactly(version: int | None, wire: str | bytes,
                                    packet: object) -> None:
    data = bytes.fromhex(wire) if isinstance(wire, str) else wire
    decoder = Decoder(version)
    decoder.feed(data)
    decoded = decoder.next_packet()
    assert decoded == packet
    assert decoder.version is not None and encode(decoded, decoder.version) == data
    assert decoder.next_packet() is None


@pytest.mark.parametrize(("wire", "packet"), [
    ("f0021800", Auth(ReasonCode.ContinueAuthentication)),
    ("e0020000", Disconnect()),
    ("4004000100" + "00", PubAck(1)),
])
def test_explicit_defaults_decode_like_omitted_ones(wire: str, packet: object) -> None:
    assert decode_all(bytes.fromhex(wire), 5) == [packet]


def test_connect_with_will_username_and_password_decodes() -> None:
    packet = Connect("c", clean_start=False, keep_alive=5, username="u", password=b"p",
                     will=Will("w/t", b"bye", qos=2, retain=True))
    assert decode_all(encode(packet, 4), None) == [packet]


def test_server_decoder_learns_the_version_from_connect() -> None:
    decoder = Decoder()
    decoder.feed(CONNECT_5 + bytes.fromhex("e0018e"))
    decoder.next_packet()
    assert decoder.version == 5
    assert decoder.next_packet() == Disconnect(ReasonCode.SessionTakenOver)


def test_a_second_connect_is_decoded_and_left_to_the_session() -> None:
    assert len(decode_all(CONNECT_311 + CONNECT_311, None)) == 2


def _with_length(first: int, body: str) -> str:
    return f"{first:02x}{len(bytes.fromhex(body)):02x}{body}"


MALFORMED = {
    "remaining length of 5 bytes": (5, "30ffffffff01", ReasonCode.MalformedPacket),
    "PUBLISH QoS 3": (4, "36050001610001", ReasonCode.MalformedPacket),
    "DUP on QoS 0": (4, "3803000161", ReasonCode.MalformedPacket),
    "SUBSCRIBE flags 0": (4, "8006000a00016101", ReasonCode.MalformedPacket),
    "UNSUBSCRIBE flags 0": (4, "a005000a000161", ReasonCode.MalformedPacket),
    "PUBREL flags 0": (4, "60020001", ReasonCode.MalformedPacket),
    "PUBACK flags 1": (4, "41020001", ReasonCode.MalformedPacket),
    "packet type 0": (4, "0000", ReasonCode.MalformedPacket),
    "AUTH in 3.1.1": (4, "f000", ReasonCode.MalformedPacket),
    "invalid UTF-8 topic": (4, "300400 02c328".replace(" ", ""), ReasonCode.MalformedPacket),
    "U+0000 in topic": (4, "3004000261" + "00", ReasonCode.MalformedPacket),
    "surrogate in topic": (4, "30050003eda080", ReasonCode.MalformedPacket),
    "wildcard + in topic": (4, "3005000361" + "2b62", ReasonCode.TopicNameInvalid),
    "wildcard # in topic": (4, "30030001" + "23", ReasonCode.TopicNameInvalid),
    "empty topic without alias": (5, "3003000000", ReasonCode.ProtocolError),
    "empty topic in 3.1.1": (4, "30020000", ReasonCode.ProtocolError),
    "PUBLISH packet id 0": (4, "32050001610000", ReasonCode.ProtocolError),
    "PUBACK packet id 0": (4, "40020000", ReasonCode.ProtocolError),
    "SUBSCRIBE packet id 0": (4, "82060000000161" + "00", ReasonCode.ProtocolError),
    "SUBSCRIBE without filters": (4, "8202000a", ReasonCode.ProtocolError),
    "UNSUBSCRIBE without filters": (5, "a203000a00", ReasonCode.ProtocolError),
    "SUBSCRIBE QoS 3": (4, "8206000a00016103", ReasonCode.MalformedPacket),
    "SUBSCRIBE 3.1.1 reserved option bit": (4, "8206000a00016104", ReasonCode.MalformedPacket),
    "SUBSCRIBE 5 reserved option bit": (5, "8207000a0000016140", ReasonCode.MalformedPacket),
    "SUBSCRIBE retain handling 3": (5, "8207000a0000016130", ReasonCode.ProtocolError),
    "bytes after PINGREQ": (4, "c00100", ReasonCode.MalformedPacket),
    "bytes after PUBACK in 3.1.1": (4, "4003000100", ReasonCode.MalformedPacket),
    "bytes after DISCONNECT properties": (5, "e003000000", ReasonCode.MalformedPacket),
    "packet ends inside a field": (4, "3003000561", ReasonCode.MalformedPacket),
    "PUBACK reason code not for PUBACK": (5, "400300018e", ReasonCode.ProtocolError),
    "unknown reason code": (5, "e00103", ReasonCode.ProtocolError),
    "CONNACK reserved flag": (4, "20020200", ReasonCode.MalformedPacket),
    "CONNACK 3.1.1 return code 6": (4, "20020006", ReasonCode.ProtocolError),
    "SUBACK 3.1.1 return code 3": (4, "9003000a03", ReasonCode.ProtocolError),
    "unknown property": (5, "e00200" + "0100", ReasonCode.MalformedPacket),
    "property not allowed in packet": (5, "e0040002" + "2301", ReasonCode.MalformedPacket),
    "duplicate property": (5, _with_length(0xE0, "000a" + "1100000001" + "1100000002"),
                           ReasonCode.ProtocolError),
    "subscription identifier twice in SUBSCRIBE": (
        5, _with_length(0x82, "000a04" + "0b01" + "0b02" + "000161" + "00"),
        ReasonCode.ProtocolError),
    "subscription identifier 0": (5, _with_length(0x30, "00016102" + "0b00"),
                                  ReasonCode.ProtocolError),
    "receive maximum 0": (5, _with_length(0x20, "000003" + "210000"), ReasonCode.ProtocolError),
    "property block longer than packet": (5, "e002" + "0005", ReasonCode.MalformedPacket),
    "invalid UTF-8 in user property": (5, _with_length(0xE0, "0007" + "260001ff000161"),
                                       ReasonCode.MalformedPacket),
}

CONNECT_MALFORMED = {
    # flags byte is the 8th byte of the CONNECT body (after "MQTT" and the level)
    "reserved flag": ("01", 4, ReasonCode.MalformedPacket),
    "will QoS without will flag": ("08", 4, ReasonCode.MalformedPacket),
    "will retain without will flag": ("20", 4, ReasonCode.MalformedPacket),
    "will QoS 3": ("1c", 4, ReasonCode.MalformedPacket),
    "password without user name in 3.1.1": ("40", 4, ReasonCode.MalformedPacket),
}


@pytest.mark.parametrize("case", MALFORMED, ids=list(MALFORMED))
def test_malformed_input_raises_with_its_reason_code(case: str) -> None:
    version, wire, reason = MALFORMED[case]
    with pytest.raises(MqttError) as info:
        decode_all(bytes.fromhex(wire), version)
    assert info.value.reason_code == reason


@pytest.mark.parametrize("case", CONNECT_MALFORMED, ids=list(CONNECT_MALFORMED))
def test_malformed_connect_flags_raise(case: str) -> None:
    flags, level, reason = CONNECT_MALFORMED[case]
    body = f"00044d515454{level:02x}{flags}003c000161"
    with pytest.raises(MqttError) as info:
        decode_all(bytes.fromhex(_with_length(0x10, body)), None)
    assert info.value.reason_code == reason
    assert info.value.v311_return_code is None  # MQTT 3.1.1 just closes


def test_password_without_user_name_is_fine_in_mqtt_5() -> None:
    packet = Connect("a", password=b"secret")
    assert decode_all(encode(packet, 5), None) == [packet]
    with pytest.raises(ValueError):
        encode(packet, 4)


@pytest.mark.parametrize(("name", "level"), [("MQIsdp", 3), ("MQTT", 3), ("MQTT", 6)])
def test_unsupported_protocol_levels_are_refused(name: str, level: int) -> None:
    name_hex = name.encode().hex()
    body = f"{len(name):04x}{name_hex}{level:02x}02003c0000"
    with pytest.raises(UnsupportedProtocolVersion) as info:
        decode_all(bytes.fromhex(_with_length(0x10, body)), None)
    assert info.value.reason_code == ReasonCode.UnsupportedProtocolVersion
    assert info.value.v311_return_code == ConnectReturnCode.UnacceptableProtocolVersion


def test_unknown_protocol_name_is_malformed() -> None:
    with pytest.raises(MalformedPacket):
        decode_all(bytes.fromhex(_with_length(0x10, "0004585858580402003c0000")), None)


def test_server_decoder_expects_connect_first() -> None:
    with pytest.raises(MqttError) as info:
        decode_all(bytes.fromhex("c000"), None)
    assert info.value.reason_code == ReasonCode.ProtocolError


def test_packet_larger_than_the_maximum_is_refused_before_it_arrives() -> None:
    decoder = Decoder(4, max_packet_size=100)
    decoder.feed(bytes.fromhex("30e807"))  # announces 1,000 bytes, sends none of them
    with pytest.raises(MqttError) as info:
        decoder.next_packet()
    assert info.value.reason_code == ReasonCode.PacketTooLarge
    with pytest.raises(MqttError):  # the error is final
        decoder.next_packet()


def test_packet_of_exactly_the_maximum_size_is_accepted() -> None:
    wire = encode(Publish("t", b"x" * 10), 4)
    assert decode_all(wire, 4) == [Publish("t", b"x" * 10)]
    decoder = Decoder(4, max_packet_size=len(wire))
    decoder.feed(wire)
    assert decoder.next_packet() == Publish("t", b"x" * 10)


def test_incomplete_input_needs_more_data() -> None:
    decoder = Decoder(4)
    for chunk in (b"\x32", b"\x0c", bytes.fromhex("0003612f62000168656c6c")):
        decoder.feed(chunk)
        assert decoder.next_packet() is None
    decoder.feed(b"o")
    assert decoder.next_packet() == Publish("a/b", b"hello", qos=1, packet_id=1)
    assert decoder.next_packet() is None


def test_decoder_accepts_memoryview() -> None:
    decoder = Decoder(4)
    decoder.feed(memoryview(bytes.fromhex("40020001")))
    assert decoder.next_packet() == PubAck(1)


@pytest.mark.parametrize("packet", [
    Publish("a", qos=1), Publish("a", packet_id=3), Auth(), Disconnect(ReasonCode.ServerBusy),
    PubAck(1, ReasonCode.QuotaExceeded), UnsubAck(1, (ReasonCode.Success,)),
    Publish("a", properties=Properties(content_type="x")),
])
def test_encode_refuses_what_mqtt_311_cannot_express(packet: object) -> None:
    with pytest.raises(ValueError):
        encode(packet, 4)  # type: ignore[arg-type]


@pytest.mark.parametrize("props", [
    Properties(session_expiry_interval=1), Properties(subscription_identifiers=(1, 2)),
])
def test_encode_refuses_properties_outside_their_packets(props: Properties) -> None:
    with pytest.raises(ValueError):
        encode(Subscribe(1, (Subscription("a"),), props), 5)
