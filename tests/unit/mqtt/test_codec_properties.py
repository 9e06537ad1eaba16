"""Property tests (hypothesis) for the MQTT codec: every packet type round-trips in both
versions, feeding one byte at a time equals feeding everything at once, and arbitrary bytes
only ever raise MqttError."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from protocols.mqtt.codec import Decoder, encode
from protocols.mqtt.packets import (Auth, ConnAck, Connect, Disconnect, Packet, PingReq, PingResp,
                                    PubAck, PubComp, Publish, PubRec, PubRel, SubAck, Subscribe,
                                    Subscription, UnsubAck, Unsubscribe, Will)
from protocols.mqtt.properties import (MAX_VARINT, PROPERTIES, WILL, Context, DataType,
                                       Properties, Reader, decode_properties, encode_properties)
from protocols.mqtt.reason_codes import (REASON_CODES_BY_PACKET, ConnectReturnCode, MqttError,
                                         PacketType, SubAckReturnCode)

try:
    from paho.mqtt import properties as paho
    from paho.mqtt.packettypes import PacketTypes
except ImportError:  # paho-mqtt is in the test extra; without it the cross-checks skip
    paho = None

needs_paho = pytest.mark.skipif(paho is None, reason="paho-mqtt is not installed")
T = PacketType
text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
               max_size=12)
topic_names = text.filter(lambda t: t and "+" not in t and "#" not in t)
packet_ids = st.integers(1, 0xFFFF)
qos = st.integers(0, 2)

_VALUES: dict[DataType, st.SearchStrategy[Any]] = {
    DataType.BYTE: st.integers(0, 0xFF),
    DataType.TWO_BYTE_INT: st.integers(0, 0xFFFF),
    DataType.FOUR_BYTE_INT: st.integers(0, 2**32 - 1),
    DataType.VARINT: st.integers(0, MAX_VARINT),
    DataType.UTF8: text,
    DataType.BINARY: st.binary(max_size=12),
    DataType.STRING_PAIR: st.tuples(text, text),
}


def properties(context: Context) -> st.SearchStrategy[Properties]:
    """Any valid property block for `context`, drawn from the property table itself."""
    fields: dict[str, st.SearchStrategy[Any]] = {}
    for spec in PROPERTIES.values():
        if context not in spec.packets:
            continue
        value = st.sampled_from(spec.valid) if spec.valid else _VALUES[spec.type]
        if spec.name in ("user_properties", "subscription_identifiers"):
            most = 4 if context in spec.repeatable_in else 1
            fields[spec.name] = st.lists(value, max_size=most).map(tuple)
        else:
            fields[spec.name] = st.none() | value
    return st.fixed_dictionaries({}, optional=fields).map(lambda kw: Properties(**kw))


def reason(ptype: PacketType) -> st.SearchStrategy[int]:
    return st.sampled_from(sorted(REASON_CODES_BY_PACKET[ptype]))


@st.composite
def wills(draw: st.DrawFn, version: int) -> Will:
    props = draw(properties(WILL)) if version == 5 else Properties()
    return Will(draw(topic_names), draw(st.binary(max_size=20)), draw(qos), draw(st.booleans()),
                props)


@st.composite
def connects(draw: st.DrawFn, version: int) -> Connect:
    username = draw(st.none() | text)
    password = draw(st.none() | st.binary(max_size=12))
    if version == 4 and username is None:
        password = None
    return Connect(draw(text), draw(st.booleans()), draw(st.integers(0, 0xFFFF)), username,
                   password, draw(st.none() | wills(version)), draw(v5_props(version, T.CONNECT)))


def v5_props(version: int, context: Context) -> st.SearchStrategy[Properties]:
    return properties(context) if version == 5 else st.just(Properties())


@st.composite
def publishes(draw: st.DrawFn, version: int) -> Publish:
    level = draw(qos)
    return Publish(draw(topic_names), draw(st.binary(max_size=30)), level, draw(st.booleans()),
                   draw(st.booleans()) if level else False,
                   draw(packet_ids) if level else None, draw(v5_props(version, T.PUBLISH)))


def subscriptions(version: int) -> st.SearchStrategy[Subscription]:
    if version == 4:
        return st.builds(Subscription, text, qos)
    return st.builds(Subscription, text, qos, st.booleans(), st.booleans(), st.integers(0, 2))


def pub_acks(cls: type, version: int) -> st.SearchStrategy[Packet]:
    if version == 4:
        return st.builds(cls, packet_ids)
    return st.builds(cls, packet_ids, reason(cls.type), properties(cls.type))


def tails(cls: type, version: int) -> st.SearchStrategy[Packet]:
    if version == 4:
        return st.builds(cls)
    return st.builds(cls, reason(cls.type), properties(cls.type))


def packets(version: int) -> st.SearchStrategy[Packet]:
    """Any packet the version can express, from either direction."""
    filters = st.lists(text, min_size=1, max_size=4).map(tuple)
    connack_code = reason(T.CONNACK) if version == 5 else st.sampled_from(ConnectReturnCode)
    suback_code = reason(T.SUBACK) if version == 5 else st.sampled_from(SubAckReturnCode)
    unsuback_codes = (st.lists(reason(T.UNSUBACK), min_size=1, max_size=4).map(tuple)
                      if version == 5 else st.just(()))
    choices = [
        connects(version),
        st.builds(ConnAck, st.booleans(), connack_code, v5_props(version, T.CONNACK)),
        publishes(version),
        *(pub_acks(cls, version) for cls in (PubAck, PubRec, PubRel, PubComp)),
        st.builds(Subscribe, packet_ids,
                  st.lists(subscriptions(version), min_size=1, max_size=4).map(tuple),
                  v5_props(version, T.SUBSCRIBE)),
        st.builds(SubAck, packet_ids, st.lists(suback_code, min_size=1, max_size=4).map(tuple),
                  v5_props(version, T.SUBACK)),
        st.builds(Unsubscribe, packet_ids, filters, v5_props(version, T.UNSUBSCRIBE)),
        st.builds(UnsubAck, packet_ids, unsuback_codes, v5_props(version, T.UNSUBACK)),
        st.just(PingReq()), st.just(PingResp()), tails(Disconnect, version),
    ]
    if version == 5:
        choices.append(tails(Auth, version))
    return st.one_of(choices)


versions = st.sampled_from([4, 5])


def drain(decoder: Decoder) -> list[Packet]:
    out = []
    while (packet := decoder.next_packet()) is not None:
        out.append(packet)
    return out


@given(st.data(), versions)
def test_every_packet_round_trips(data: st.DataObject, version: int) -> None:
    packet = data.draw(packets(version))
    decoder = Decoder(version)
    decoder.feed(encode(packet, version))
    assert drain(decoder) == [packet]


@given(st.data(), versions)
def test_server_decoder_round_trips_a_connection(data: st.DataObject, version: int) -> None:
    stream = [data.draw(connects(version)), *data.draw(st.lists(packets(version), max_size=5))]
    decoder = Decoder()
    decoder.feed(b"".join(encode(p, version) for p in stream))
    assert drain(decoder) == stream
    assert decoder.version == version


@given(st.data(), versions)
def test_one_byte_at_a_time_equals_all_at_once(data: st.DataObject, version: int) -> None:
    stream = data.draw(st.lists(packets(version), max_size=5))
    wire = b"".join(encode(p, version) for p in stream)
    decoder = Decoder(version)
    got: list[Packet] = []
    for i in range(len(wire)):
        decoder.feed(wire[i : i + 1])
        got += drain(decoder)
    assert got == stream


def _outcome(chunks: list[bytes], version: int | None) -> tuple[list[Packet], object]:
    """Feed `chunks`; return the packets decoded and the error (type, reason) if any."""
    decoder, got = Decoder(version, max_packet_size=512), []
    try:
        for chunk in chunks:
            decoder.feed(chunk)
            while (packet := decoder.next_packet()) is not None:
                got.append(packet)
    except MqttError as exc:
        return got, (type(exc), exc.reason_code)
    return got, None


@settings(max_examples=300)
@given(st.binary(max_size=300), st.sampled_from([None, 4, 5]))
def test_arbitrary_bytes_raise_only_mqtt_errors_and_chunking_does_not_matter(
        wire: bytes, version: int | None) -> None:
    whole = _outcome([wire], version)
    assert whole == _outcome([wire[i : i + 1] for i in range(len(wire))], version)


@settings(max_examples=300)
@given(st.data(), versions, st.integers(0, 2**16), st.integers(0, 255))
def test_corrupted_valid_streams_raise_only_mqtt_errors(
        data: st.DataObject, version: int, where: int, byte: int) -> None:
    stream = data.draw(st.lists(packets(version), min_size=1, max_size=3))
    wire = bytearray(b"".join(encode(p, version) for p in stream))
    wire[where % len(wire)] = byte
    whole = _outcome([bytes(wire)], version)
    assert whole == _outcome([bytes(wire[i : i + 1]) for i in range(len(wire))], version)


CONTEXTS: list[Context] = [*(t for t in PacketType if t not in (T.PINGREQ, T.PINGRESP)), WILL]
_PAHO_TYPES = {DataType.BYTE: "Byte", DataType.TWO_BYTE_INT: "Two Byte Integer",
               DataType.FOUR_BYTE_INT: "Four Byte Integer",
               DataType.VARINT: "Variable Byte Integer", DataType.BINARY: "Binary Data",
               DataType.UTF8: "UTF-8 Encoded String", DataType.STRING_PAIR: "UTF-8 String Pair"}


def _paho_context(context: Context) -> int:
    return PacketTypes.WILLMESSAGE if context == WILL else int(context)


@needs_paho
def test_property_table_matches_paho() -> None:
    ref = paho.Properties(PacketTypes.PUBLISH)
    ours = {i: (_PAHO_TYPES[s.type], sorted(_paho_context(c) for c in s.packets))
            for i, s in PROPERTIES.items()}
    assert ours == {i: (ref.types[t], sorted(where)) for i, (t, where) in ref.properties.items()}


@needs_paho
@given(st.data(), st.sampled_from(CONTEXTS))
def test_property_blocks_agree_with_paho(data: st.DataObject, context: Context) -> None:
    props = data.draw(properties(context))
    # paho refuses a Maximum Packet Size beyond the largest packet (the spec allows any
    # four-byte value but 0): compare only what both accept
    assume(props.maximum_packet_size is None or props.maximum_packet_size <= MAX_VARINT)
    ref = paho.Properties(_paho_context(context))
    names = {i: name.replace(" ", "") for name, i in ref.names.items()}
    for spec in PROPERTIES.values():
        value = getattr(props, spec.name)
        repeated = spec.name in ("user_properties", "subscription_identifiers")
        for item in value if repeated else () if value is None else (value,):
            setattr(ref, names[spec.identifier], item)  # paho appends repeated properties
    assert decode_properties(Reader(ref.pack()), context) == props
    theirs = paho.Properties(_paho_context(context))
    theirs.unpack(encode_properties(props, context))
    assert theirs.json() == ref.json()
