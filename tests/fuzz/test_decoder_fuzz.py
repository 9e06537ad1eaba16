"""Hypothesis against every decoder of protocols/mqtt and protocols/amqp, with the limits a broker runs with: any
bytes give packets (frames), "need more" or the protocol's error (`MqttError`, `AmqpError`), never
another exception;
the result does not depend on how the bytes are split; the cost is linear in the input.

Inputs are arbitrary bytes and valid streams mutated the way the live fuzzer mutates them
(`tests/fuzz/mutations.py`: bit flips, truncations, length-field lies, splices, huge counts).
"""
from __future__ import annotations

import functools
import time
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from pamqp.commands import Basic, Channel, Confirm, Connection, Exchange, Queue

from protocols.amqp.codec import Decoder as AmqpDecoder
from protocols.amqp.connection import Options as AmqpOptions
from protocols.amqp.connection import ServerConnection as AmqpConnection
from protocols.amqp.events import ConnectionClosed as AmqpClosed
from protocols.amqp.events import ChannelClosed, CloseRequested, LoginRequested, VhostRequested
from protocols.amqp.frames import HEARTBEAT_FRAME, PROTOCOL_HEADER, encode_content, encode_method
from protocols.amqp.reason_codes import AmqpError, BadProtocolHeader
from protocols.mqtt.codec import Decoder, encode
from protocols.mqtt.connection import ServerConnection
from protocols.mqtt.events import ConnectRequested
from protocols.mqtt.limits import Limits
from protocols.mqtt.packets import Publish, Subscribe, Subscription, Unsubscribe
from protocols.mqtt.properties import WILL, Properties, Reader, decode_properties, varint
from protocols.mqtt.reason_codes import MqttError, PacketType
from protocols.mqtt.websocket import origin_allowed, parse_origins
from tests.fuzz.mutations import CORPUS, mutate
from tests.unit.mqtt.test_codec_properties import packets

LIMITS = Limits(max_connect_packet_size=4096, connect_timeout=10.0, max_client_id_length=64,
                max_topic_length=256, max_topic_levels=16, max_user_properties=32)
CONTEXTS = [*(t for t in PacketType if t not in (PacketType.PINGREQ, PacketType.PINGRESP)), WILL]
seeds = st.integers(0, 2**32 - 1)


def decode_all(chunks: list[bytes], version: int | None) -> tuple[list[object], object]:
    """Packets decoded from ``chunks`` and the error that ended them (type, reason), if any."""
    decoder = Decoder(version, max_packet_size=1 << 16, max_user_properties=32)
    got: list[object] = []
    try:
        for chunk in chunks:
            decoder.feed(chunk)
            while (packet := decoder.next_packet()) is not None:
                got.append(packet)
    except MqttError as error:
        return got, (type(error), error.reason_code)
    return got, None


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    """``data`` in pieces cut at ``cuts`` (modulo its length); no piece is empty (an empty read
    means end of stream)."""
    points = sorted({c % (len(data) + 1) for c in cuts})
    pieces = [data[a:b] for a, b in zip([0, *points], [*points, len(data)])]
    return [piece for piece in pieces if piece]


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(seeds, st.sampled_from([None, 4, 5]), st.lists(st.integers(0, 1 << 20), max_size=8))
def test_mutated_streams_give_packets_or_mqtt_errors_however_they_are_split(seed, version, cuts):
    data = mutate(seed, version)
    whole = decode_all([data], version)
    assert decode_all(split(data, cuts), version) == whole
    assert decode_all([data[i:i + 1] for i in range(min(len(data), 4096))], version)[0] \
        == decode_all([data[:4096]], version)[0]


@settings(max_examples=200, deadline=None)
@given(st.data(), st.sampled_from([4, 5]), seeds)
def test_valid_packets_with_mutations_anywhere_in_a_stream(data, version, seed):
    stream = data.draw(st.lists(packets(version), min_size=1, max_size=4))
    wire = b"".join(encode(p, version) for p in stream)
    mutated = mutate(seed, version, base=wire)
    assert decode_all(split(mutated, [seed, seed >> 7]), version) == decode_all([mutated], version)


@settings(max_examples=300)
@given(st.binary(max_size=400), st.sampled_from(CONTEXTS))
def test_property_blocks_of_any_bytes_decode_or_raise_mqtt_errors(block, context):
    reader = Reader(block, max_user_properties=8)
    try:
        props = decode_properties(reader, context)
    except MqttError:
        return
    assert isinstance(props, Properties) and len(props.user_properties) <= 8


def run_connection(chunks: list[bytes]) -> tuple[list[object], bytes]:
    """A server connection with broker limits fed ``chunks``; CONNECT is accepted. Returns
    the events (without the text of errors) and everything it wrote."""
    conn = ServerConnection(limits=LIMITS, max_packet_size=1 << 16, receive_maximum=8)
    events, written = [], bytearray()
    for now, chunk in enumerate(chunks):
        conn.receive_data(chunk, float(now))
        while (event := conn.next_event()) is not None:
            events.append(type(event).__name__)
            if isinstance(event, ConnectRequested):
                written += conn.accept()
        written += conn.data_to_send()
    return events, bytes(written)


@settings(max_examples=300, deadline=None)
@given(seeds, st.sampled_from([None, 4, 5]), st.lists(st.integers(0, 1 << 20), max_size=6))
def test_a_server_connection_never_raises_on_mutated_input(seed, version, cuts):
    """Events and answers are the same however the bytes arrive, and nothing but events and
    bytes come out (ConnectionStateError or any other exception fails the test)."""
    data = mutate(seed, version)
    assert run_connection(split(data, cuts)) == run_connection(split(data, []))


@settings(max_examples=300)
@given(st.one_of(st.none(), st.text(max_size=80)), st.one_of(st.none(), st.text(max_size=80)),
       st.booleans(), st.text(max_size=80))
def test_origin_checks_never_raise(origin, host, secure, allowed):
    assert origin_allowed(origin, host, secure, parse_origins(allowed)) in (True, False)


# ----------------------------------------------------------------------------- AMQP 0-9-1

AMQP_STREAM = b"".join([
    PROTOCOL_HEADER,
    encode_method(0, Connection.StartOk({"capabilities": {"connection.blocked": True}}, "PLAIN",
                                        "\0guest\0guest")),
    encode_method(0, Connection.TuneOk(16, 4096, 10)),
    encode_method(0, Connection.Open("/")),
    encode_method(1, Channel.Open()),
    encode_method(1, Exchange.Declare(exchange="x", exchange_type="topic", arguments={"a": [1]})),
    encode_method(1, Queue.Declare(queue="q", arguments={"x-max-length": 10})),
    encode_method(1, Confirm.Select()),
    encode_content(1, Basic.Publish(exchange="x", routing_key="a.b"),
                   Basic.Properties(headers={"h": "v"}, delivery_mode=2), b"m" * 9000, 4096),
    HEARTBEAT_FRAME,
    encode_method(1, Basic.Ack(1, True)),
    encode_method(1, Channel.Close(200, "", 0, 0)),
    encode_method(0, Connection.Close(200, "", 0, 0)),
])
"""A client's whole session: handshake, declares, a publish over three body frames, closes."""


def amqp_frames(chunks: list[bytes]) -> tuple[list[str], object]:
    """Frames decoded from ``chunks`` (by type name) and the error that ended them."""
    decoder, got = AmqpDecoder(1 << 16), []
    try:
        for chunk in chunks:
            decoder.feed(chunk)
            while (received := decoder.next_frame()) is not None:
                got.append(f"{received[0]}:{type(received[1]).__name__}")
    except AmqpError as error:
        return got, error.code
    except BadProtocolHeader:
        return got, "header"
    return got, None


def lie_about_a_size(data: bytes, seed: int) -> bytes:
    """``data`` with one frame's 4-byte payload size rewritten."""
    offsets, i = [], len(PROTOCOL_HEADER)
    while i + 7 <= len(data):
        offsets.append(i)
        i += int.from_bytes(data[i + 3:i + 7], "big") + 8
    at = offsets[seed % len(offsets)] + 3 if offsets else 0
    return data[:at] + (seed % (1 << 32)).to_bytes(4, "big") + data[at + 4:]


@settings(max_examples=400, deadline=None)
@given(seeds, st.booleans(), st.lists(st.integers(0, 1 << 20), max_size=8))
def test_amqp_mutated_streams_give_frames_or_amqp_errors_however_split(seed, lie, cuts):
    data = mutate(seed, base=AMQP_STREAM)
    data = lie_about_a_size(data, seed) if lie else data
    whole = amqp_frames([data])
    assert amqp_frames(split(data, cuts)) == whole
    assert amqp_frames([data[i:i + 1] for i in range(len(data))]) == whole


def run_amqp_connection(chunks: list[bytes]) -> tuple[list[object], bytes]:
    """An AMQP server connection that accepts every login and vhost, fed ``chunks``, and
    finishes closes once everything was read (as an adapter still carrying out what came before
    them: what is read meanwhile then does not depend on how the bytes were split)."""
    conn = AmqpConnection(AmqpOptions(frame_max=1 << 16, channel_max=16, heartbeat=10,
                                      max_message_size=1 << 15))
    events, written = [], bytearray()
    closes: list[Callable[[], None]] = []

    def drain() -> None:
        while (event := conn.next_event()) is not None:
            events.append(type(event).__name__)
            if isinstance(event, LoginRequested):
                conn.accept_login()
            elif isinstance(event, VhostRequested):
                conn.open_vhost()
            elif isinstance(event, ChannelClosed):
                closes.append(functools.partial(conn.finish_channel_close, event.channel))
            elif isinstance(event, CloseRequested):
                closes.append(conn.finish_close)
            elif isinstance(event, AmqpClosed):
                assert isinstance(event.reply_code, int) and event.reply_code

    for now, chunk in enumerate(chunks):
        conn.receive_data(chunk, float(now))
        conn.check_timeouts(float(now))
        drain()
        written += conn.data_to_send()
    while closes:
        closes.pop(0)()
        drain()
        written += conn.data_to_send()
    return events, bytes(written)


@settings(max_examples=300, deadline=None)
@given(seeds, st.booleans(), st.lists(st.integers(0, 1 << 20), max_size=6))
@example(56781, False, [320082])  # a method after channel.close, read before or after close-ok
def test_an_amqp_server_connection_never_raises_on_mutated_input(seed, lie, cuts):
    """It keeps going or closes with a reply code; nothing else comes out, and what it
    says does not depend on how the bytes arrive."""
    data = mutate(seed, base=AMQP_STREAM)
    data = lie_about_a_size(data, seed) if lie else data
    events, written = run_amqp_connection(split(data, cuts))
    assert (events, written) == run_amqp_connection(split(data, []))
    assert events.count("ConnectionClosed") <= 1


@settings(max_examples=300)
@given(st.binary(max_size=600))
def test_amqp_random_bytes_after_the_header(noise):
    assert amqp_frames([PROTOCOL_HEADER + noise])[1] in (None, *AMQP_CODES)


AMQP_CODES = (501, 502, 503, 504, 505, 530, 540)


def test_the_amqp_stream_is_valid():
    assert amqp_frames([AMQP_STREAM])[1] is None
    events, _ = run_amqp_connection([AMQP_STREAM])
    assert events[:2] == ["LoginRequested", "VhostRequested"]
    assert events[-1] == "ConnectionClosed" and "PublishReceived" in events


# ----------------------------------------------------------------------------- linear cost


def _many_user_properties(n: int) -> bytes:
    body = b"\x26\x00\x01k\x00\x01v" * n
    block = varint(len(body)) + body
    payload = b"\x00\x03a/b" + block
    return b"\x30" + varint(len(payload)) + payload


def _many_filters(n: int) -> bytes:
    return encode(Subscribe(1, tuple(Subscription(f"f/{i}", 1) for i in range(n))), 5)


def _many_unsubscribe_filters(n: int) -> bytes:
    return encode(Unsubscribe(1, tuple(f"f/{i}" for i in range(n))), 5)


def _many_small_packets(n: int) -> bytes:
    return encode(Publish("a/b", b"x"), 5) * n


SHAPES: dict[str, Callable[[int], bytes]] = {
    "user properties": _many_user_properties,
    "SUBSCRIBE filters": _many_filters,
    "UNSUBSCRIBE filters": _many_unsubscribe_filters,
    "packets in one read": _many_small_packets,
}


def _decode_seconds(data: bytes, byte_at_a_time: bool = False) -> float:
    best = float("inf")
    for _ in range(3):
        decoder = Decoder(5, max_packet_size=1 << 24)
        began = time.perf_counter()
        if byte_at_a_time:
            for i in range(len(data)):
                decoder.feed(data[i:i + 1])
                decoder.next_packet()
        else:
            decoder.feed(data)
            while decoder.next_packet() is not None:
                pass
        best = min(best, time.perf_counter() - began)
    return best


@pytest.mark.parametrize("shape", SHAPES)
def test_decoding_cost_is_linear(shape):
    """Ten times the input costs about ten times as long (a ratio under 30 leaves room for
    noise on a shared machine; a quadratic decoder shows 100)."""
    make = SHAPES[shape]
    small, large = _decode_seconds(make(2_000)), _decode_seconds(make(20_000))
    assert large / small < 30, f"{shape}: 2,000 took {small:.4f} s, 20,000 took {large:.4f} s"


def test_a_packet_arriving_one_byte_at_a_time_costs_linear_time():
    packet = encode(Publish("a/b", b"x" * 20_000), 5)
    small, large = _decode_seconds(packet[:2_000] + b"", True), _decode_seconds(packet, True)
    assert large / small < 30, f"2,000 bytes: {small:.4f} s, 20,000 bytes: {large:.4f} s"


def test_the_corpus_is_valid_mqtt():
    """The live fuzzer mutates these: unmutated, each decodes as the packets it was built from."""
    for version, data in CORPUS:
        assert decode_all([data], version)[1] is None, (version, data[:40])
