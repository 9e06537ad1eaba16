"""The AMQP Decoder with plain bytes: whole frames only, "need more" told apart from garbage,
and every malformed frame answered with the reply code RabbitMQ uses."""

from __future__ import annotations

import struct

import pytest
from pamqp import commands
from pamqp.body import ContentBody
from pamqp.commands import Basic, Queue
from pamqp.header import ContentHeader, ProtocolHeader
from pamqp.heartbeat import Heartbeat

from protocols.amqp.codec import Decoder
from protocols.amqp.frames import (FRAME_END, HEARTBEAT_FRAME, PROTOCOL_HEADER, encode_content,
                                   encode_method)
from protocols.amqp.reason_codes import AmqpError, BadProtocolHeader, FrameError, ReplyCode
from tests.unit.amqp.client import decode

STREAM = (PROTOCOL_HEADER + encode_method(1, Queue.Declare(queue="q", durable=True))
          + encode_content(1, Basic.Publish(routing_key="k"),
                           Basic.Properties(content_type="text/plain", headers={"a": 1}),
                           b"x" * 10_000, 4096)
          + HEARTBEAT_FRAME)


def frames(chunks: list[bytes], frame_max: int = 4096) -> list[tuple[int, str]]:
    decoder = Decoder(frame_max)
    out = []
    for chunk in chunks:
        decoder.feed(chunk)
        while (got := decoder.next_frame()) is not None:
            out.append((got[0], type(got[1]).__name__))
    return out


def test_a_stream_decodes_the_same_whole_and_byte_by_byte() -> None:
    whole = frames([STREAM])
    assert whole == [(0, "ProtocolHeader"), (1, "Declare"), (1, "Publish"),
                     (1, "ContentHeader"), (1, "ContentBody"), (1, "ContentBody"),
                     (1, "ContentBody"), (0, "Heartbeat")]
    assert frames([STREAM[i:i + 1] for i in range(len(STREAM))]) == whole


def test_content_is_split_at_frame_max_minus_8() -> None:
    data = encode_content(3, Basic.Publish(), Basic.Properties(), b"y" * 10_000, 4096)
    decoded = decode(data)
    bodies = [v for _, v in decoded if isinstance(v, ContentBody)]
    assert [len(b) for b in bodies] == [4088, 4088, 1824]
    assert isinstance(decoded[1][1], ContentHeader) and decoded[1][1].body_size == 10_000
    assert all(len(f) <= 4096 for f in _raw_frames(data))


def _raw_frames(data: bytes) -> list[bytes]:
    out, i = [], 0
    while i < len(data):
        size = struct.unpack_from(">I", data, i + 3)[0]
        out.append(data[i:i + size + 8])
        i += size + 8
    return out


def test_an_incomplete_frame_is_none_not_an_error() -> None:
    decoder = Decoder()
    decoder.feed(PROTOCOL_HEADER[:5])
    assert decoder.next_frame() is None
    decoder.feed(PROTOCOL_HEADER[5:] + encode_method(0, commands.Connection.TuneOk())[:-1])
    assert isinstance(decoder.next_frame()[1], ProtocolHeader)
    assert decoder.next_frame() is None and decoder.buffered > 0


def _decode_one(frame: bytes, frame_max: int = 4096) -> object:
    decoder = Decoder(frame_max)
    decoder.feed(PROTOCOL_HEADER + frame)
    decoder.next_frame()
    return decoder.next_frame()


def _frame(kind: int, channel: int, payload: bytes, end: int = FRAME_END) -> bytes:
    return struct.pack(">BHI", kind, channel, len(payload)) + payload + bytes([end])


@pytest.mark.parametrize(("data", "code", "lost_sync"), [
    (_frame(1, 0, b"\x00" * 5000), ReplyCode.FRAME_ERROR, True),  # above frame_max
    (_frame(1, 0, b"\x00\x0a\x00\x0b", end=0xCD), ReplyCode.FRAME_ERROR, True),
    (_frame(9, 0, b""), ReplyCode.FRAME_ERROR, True),  # unknown frame type
    (_frame(8, 0, b"xx"), ReplyCode.FRAME_ERROR, True),  # a heartbeat with a payload
    (_frame(1, 0, b"\x00"), ReplyCode.FRAME_ERROR, True),  # no method id
    (_frame(1, 1, b"\x00\x63\x00\x01"), ReplyCode.NOT_IMPLEMENTED, False),  # class 99
    (_frame(1, 1, b"\x00\x32\x00\x0a\x00"), ReplyCode.FRAME_ERROR, False),  # short declare
    (_frame(2, 1, b"\x00\x3c"), ReplyCode.SYNTAX_ERROR, False),  # short content header
])
def test_malformed_frames_raise_their_reply_code(data: bytes, code: int,
                                                 lost_sync: bool) -> None:
    with pytest.raises(AmqpError) as caught:
        _decode_one(data)
    assert caught.value.code == code and isinstance(caught.value, FrameError) is lost_sync


def test_a_deeply_nested_field_table_is_a_frame_error() -> None:
    """pamqp decodes tables recursively: 3,000 levels (24 KB) overflow its stack."""
    table = b""
    for _ in range(3000):
        table = b"\x01kF" + struct.pack(">I", len(table)) + table
    fields = b"\x00\x00\x01q\x00" + struct.pack(">I", len(table)) + table
    with pytest.raises(AmqpError) as caught:
        _decode_one(_frame(1, 1, struct.pack(">I", Queue.Declare.index) + fields), 1 << 16)
    assert caught.value.code == ReplyCode.FRAME_ERROR


def test_a_frame_of_exactly_frame_max_is_accepted() -> None:
    """RabbitMQ lets a payload reach frame_max (clients are often 8 bytes off)."""
    got = _decode_one(_frame(3, 1, b"z" * 4096))
    assert isinstance(got[1], ContentBody) and len(got[1].value) == 4096


def test_an_oversized_frame_is_refused_from_its_header_alone() -> None:
    decoder = Decoder()
    decoder.feed(PROTOCOL_HEADER + struct.pack(">BHI", 3, 1, 1 << 30))
    decoder.next_frame()
    with pytest.raises(FrameError):
        decoder.next_frame()


@pytest.mark.parametrize("header", [b"HTTP", b"AMQP\x00\x01\x00\x00", b"AMQP\x00\x00\x09\x00"])
def test_wrong_protocol_headers(header: bytes) -> None:
    decoder = Decoder()
    decoder.feed(header + b"\x00" * 4)
    with pytest.raises(BadProtocolHeader):
        decoder.next_frame()


def test_a_non_amqp_header_is_refused_before_eight_bytes() -> None:
    decoder = Decoder()
    decoder.feed(b"GE")
    with pytest.raises(BadProtocolHeader):
        decoder.next_frame()


def test_the_0_9_header_is_served_as_0_9_1() -> None:
    decoder = Decoder()
    decoder.feed(b"AMQP\x01\x01\x00\x09")
    assert isinstance(decoder.next_frame()[1], ProtocolHeader)


def test_heartbeat_frame() -> None:
    assert isinstance(_decode_one(HEARTBEAT_FRAME)[1], Heartbeat)
