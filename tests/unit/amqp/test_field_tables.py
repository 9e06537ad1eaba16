"""Field tables, method fields and content headers decode in linear time, exactly as pamqp
decodes every valid one, and anything malformed or beyond the bounds is a FieldError that the
codec answers with the frame's error code (501 for a method, 502 for a content header).

Work is counted, not timed: the bytes the decoder copies out of its buffer (``CountingBytes``)
and the calls it makes (``tests.unit.work``). pamqp's own decoder copied the rest of the buffer
for every value, about N times the table's size for N entries.
"""
from __future__ import annotations

import math
import struct
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import decode, encode, frame
from pamqp.commands import Basic, Connection, Exchange, Queue
from pamqp.header import ContentHeader

from protocols.amqp.codec import Decoder
from protocols.amqp.frames import PROTOCOL_HEADER, encode_method
from protocols.amqp.properties import (MAX_DEPTH, MAX_ENTRIES, FieldError, FieldReader,
                                       content_header, method_arguments)
from protocols.amqp.reason_codes import AmqpError, ReplyCode
from tests.unit.work import count_calls

U32 = struct.Struct(">I")


def sized(payload: bytes) -> bytes:
    return U32.pack(len(payload)) + payload


def fixed(letter: str, code: str, values: st.SearchStrategy[Any]) -> st.SearchStrategy[bytes]:
    return values.map(lambda v: letter.encode() + struct.pack(">" + code, v))


SCALARS = st.one_of(
    st.booleans().map(lambda v: b"t" + bytes((v,))),
    st.integers(0, 255).map(lambda v: b"t" + bytes((v,))),
    fixed("b", "b", st.integers(-128, 127)), fixed("B", "B", st.integers(0, 255)),
    fixed("s", "h", st.integers(-(1 << 15), (1 << 15) - 1)), fixed("u", "H", st.integers(0, 65535)),
    fixed("I", "l", st.integers(-(1 << 31), (1 << 31) - 1)),
    fixed("i", "L", st.integers(0, (1 << 32) - 1)),
    fixed("l", "q", st.integers(-(1 << 63), (1 << 63) - 1)),
    fixed("L", "q", st.integers(-(1 << 63), (1 << 63) - 1)),
    fixed("f", "f", st.floats(width=32)), fixed("d", "d", st.floats()),
    st.tuples(st.integers(0, 255), st.integers(-(1 << 31), (1 << 31) - 1)).map(
        lambda v: b"D" + struct.pack(">Bi", *v)),
    st.binary(max_size=12).map(lambda v: b"S" + sized(v)),
    st.text(max_size=12).map(lambda v: b"S" + sized(v.encode())),
    st.binary(max_size=12).map(lambda v: b"x" + sized(v)),
    fixed("T", "Q", st.one_of(st.integers(0, 0xFFFFFFFF),
                              st.integers(0x100000000, 253402300799999))),
    st.sampled_from([b"V", b"\x00"]))
KEYS = st.text(max_size=8).map(lambda k: k.encode()[:255]).filter(
    lambda k: k == k.decode(errors="ignore").encode())


def table_of(values: st.SearchStrategy[bytes]) -> st.SearchStrategy[bytes]:
    return st.lists(st.tuples(KEYS, values), max_size=5).map(
        lambda entries: sized(b"".join(bytes((len(k),)) + k + v for k, v in entries)))


VALUES = st.recursive(SCALARS, lambda inner: st.one_of(
    table_of(inner).map(lambda t: b"F" + t),
    st.lists(inner, max_size=5).map(lambda items: b"A" + sized(b"".join(items)))),
    max_leaves=12)
TABLES = table_of(VALUES)


def same(a: Any, b: Any) -> bool:
    """Equal values of equal types, NaN equal to itself."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    if isinstance(a, Decimal):
        return a.as_tuple() == b.as_tuple()
    return a == b


@settings(max_examples=200, deadline=None)
@given(TABLES)
def test_a_valid_table_decodes_as_pamqp_decodes_it(raw):
    ours, end = FieldReader(raw).table(0, len(raw))
    consumed, theirs = decode.field_table(raw)
    assert end == consumed == len(raw)
    assert same(ours, theirs)


@settings(max_examples=200, deadline=None)
@given(TABLES, st.data())
def test_a_damaged_table_is_a_field_error_or_what_pamqp_reads(raw, data):
    """Truncated or overwritten anywhere: FieldError, never another exception; a table both
    accept decodes alike."""
    cut = data.draw(st.integers(0, len(raw)))
    spot = data.draw(st.integers(0, max(0, len(raw) - 1)))
    damaged = bytearray(raw[:cut] if data.draw(st.booleans()) else raw)
    if damaged and spot < len(damaged):
        damaged[spot] = data.draw(st.integers(0, 255))
    damaged = bytes(damaged)
    try:
        ours, end = FieldReader(damaged).table(0, len(damaged))
    except FieldError:
        return
    consumed, theirs = decode.field_table(damaged)
    assert end == consumed and same(ours, theirs)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=64))
def test_arbitrary_bytes_are_a_table_or_a_field_error(raw):
    try:
        FieldReader(raw).table(0, len(raw))
    except FieldError:
        pass


class CountingBytes(bytes):
    """Bytes that count what slicing copies out of them."""

    copied = 0

    def __getitem__(self, key):  # type: ignore[override]
        part = super().__getitem__(key)
        if isinstance(key, slice):
            CountingBytes.copied += len(part)
        return part


def headers_table(entries: int) -> bytes:
    return encode.field_table({f"header-{i}": f"value-{i}" for i in range(entries)})


@pytest.mark.parametrize("entries", [100, 4_000])
def test_decoding_a_table_copies_each_byte_at_most_once(entries):
    raw = CountingBytes(headers_table(entries))
    CountingBytes.copied = 0
    table, _ = FieldReader(raw).table(0, len(raw))
    assert len(table) == entries
    assert CountingBytes.copied <= len(raw)


def test_decoding_a_table_makes_calls_linear_in_its_entries():
    small, large = 100, 4_000
    few = count_calls(lambda: FieldReader(raw := headers_table(small)).table(0, len(raw)))[0]
    raw = headers_table(large)
    budget = few * (large // small) * 2
    many = count_calls(lambda: FieldReader(raw).table(0, len(raw)), budget)[0]
    assert many <= budget


def test_the_codec_decodes_tables_without_pamqps_decoder(monkeypatch):
    """The frames a client sends with tables (connection.start-ok, declares, binds, consume,
    content headers) never reach pamqp's quadratic ``embedded_value``."""
    def refuse(value):
        raise AssertionError("pamqp's field decoder was used")
    monkeypatch.setattr(decode, "embedded_value", refuse)
    headers = {f"h{i}": i for i in range(3_000)}
    frames = [
        encode_method(0, Connection.StartOk({"product": "x", "n": [1, {"a": 2}]}, "PLAIN", "\0u\0p")),
        encode_method(1, Queue.Declare(queue="q", arguments={"x-max-length": 10})),
        encode_method(1, Exchange.Bind(destination="d", source="s", arguments={"k": "v"})),
        encode_method(1, Basic.Consume(queue="q", arguments={"x-priority": 3})),
        frame.marshal(ContentHeader(0, 5, Basic.Properties(headers=headers)), 1)]
    decoder = Decoder(1 << 17)
    decoder.feed(PROTOCOL_HEADER + b"".join(frames))
    decoder.next_frame()
    got = [decoder.next_frame()[1] for _ in frames]
    assert got[0].client_properties == {"product": "x", "n": [1, {"a": 2}]}
    assert got[1].arguments == {"x-max-length": 10}
    assert got[4].properties.headers == headers


PROPERTIES = st.fixed_dictionaries({}, optional={
    "content_type": st.text(max_size=8), "content_encoding": st.text(max_size=8),
    "headers": st.dictionaries(st.text(max_size=5), st.one_of(
        st.integers(-(1 << 62), 1 << 62), st.text(max_size=5), st.booleans(), st.none(),
        st.lists(st.integers(0, 9), max_size=3)), max_size=4),
    "delivery_mode": st.sampled_from([1, 2]), "priority": st.integers(0, 9),
    "correlation_id": st.text(max_size=8), "reply_to": st.text(max_size=8),
    "expiration": st.from_regex(r"[0-9]{1,6}", fullmatch=True),
    "message_id": st.text(max_size=8),
    "timestamp": st.datetimes(timezones=st.just(__import__("datetime").UTC)).map(
        lambda d: d.replace(microsecond=0)).filter(lambda d: d.year >= 1970),
    "message_type": st.text(max_size=8), "user_id": st.text(max_size=8),
    "app_id": st.text(max_size=8)})


@settings(max_examples=200, deadline=None)
@given(PROPERTIES, st.integers(0, 1 << 40))
def test_a_content_header_decodes_as_pamqp_decodes_it(fields, body_size):
    raw = ContentHeader(0, body_size, Basic.Properties(**fields)).marshal()
    ours = content_header(raw, 0, len(raw))
    theirs = ContentHeader()
    theirs.unmarshal(raw)
    assert (ours.class_id, ours.weight, ours.body_size) == (
        theirs.class_id, theirs.weight, theirs.body_size)
    for name in Basic.Properties.__slots__:
        assert same(getattr(ours.properties, name), getattr(theirs.properties, name)), name


CLIENT_METHODS = [
    Connection.StartOk({"product": "p", "capabilities": {"basic.nack": True}}, "PLAIN", "\0u\0p"),
    Connection.TuneOk(2047, 131072, 60), Connection.Open("/"),
    Queue.Declare(0, "q", False, True, False, True, True, {"x-max-length": 5}),
    Queue.Bind(0, "q", "ex", "a.*", True, {"x-match": "any", "k": None}),
    Queue.Unbind(0, "q", "ex", "a.*", {"k": "v"}), Queue.Delete(0, "q", True, False, True),
    Exchange.Declare(0, "ex", "topic", False, True, True, False, True, {"alternate-exchange": "b"}),
    Exchange.Bind(0, "d", "s", "k", True, {"n": [1, 2]}),
    Basic.Consume(0, "q", "tag", False, True, True, False, {"x-priority": 5}),
    Basic.Qos(0, 100, True), Basic.Nack(2**40, True, False), Basic.Reject(7, True)]


@pytest.mark.parametrize("method", CLIENT_METHODS, ids=lambda m: m.name)
def test_client_methods_decode_as_pamqp_decodes_them(method):
    raw = encode_method(1, method)
    ours = method_arguments(type(method)(), raw, 11, len(raw) - 1)
    theirs = frame.unmarshal(raw)[2]
    assert {n: getattr(ours, n) for n in method.__slots__} == \
        {n: getattr(theirs, n) for n in method.__slots__}


def nested(levels: int) -> bytes:
    table = b""
    for _ in range(levels):
        table = b"\x01kF" + sized(table)
    return sized(table)


def test_tables_nest_at_most_max_depth_levels():
    inside = nested(MAX_DEPTH)
    assert FieldReader(inside).table(0, len(inside))[1] == len(inside)
    deeper = nested(MAX_DEPTH + 1)
    with pytest.raises(FieldError, match=f"deeper than {MAX_DEPTH}"):
        FieldReader(deeper).table(0, len(deeper))


def test_a_frame_holds_at_most_max_entries_entries_and_items():
    array = b"\x01aA" + sized(b"V" * (MAX_ENTRIES - 1))
    raw = sized(array)
    assert len(FieldReader(raw).table(0, len(raw))[0]["a"]) == MAX_ENTRIES - 1
    over = sized(array + b"\x01bV")
    with pytest.raises(FieldError, match=f"more than {MAX_ENTRIES}"):
        FieldReader(over).table(0, len(over))


@pytest.mark.parametrize(("raw", "reason"), [
    (sized(b"\x01kS" + U32.pack(10) + b"abc"), "runs past"),
    (sized(b"\x01k"), "runs past its table"),  # a key with no value
    (sized(b"\x01k?"), "unknown field value type"),
    (sized(b"\x02\xff\xfeV"), "not UTF-8"),
    (sized(b"\x01kT" + struct.pack(">Q", (1 << 64) - 1)), "timestamp"),
    (sized(b"\x01kA" + U32.pack(3) + b"I\x00\x00"), "runs past"),  # an item beyond its array
    (U32.pack(50) + b"\x01kV", "runs past"),
])
def test_malformed_tables_say_why(raw, reason):
    with pytest.raises(FieldError, match=reason):
        FieldReader(raw).table(0, len(raw))


def frame_of(kind: int, payload: bytes) -> bytes:
    return struct.pack(">BHI", kind, 1, len(payload)) + payload + b"\xce"


def decode_one(data: bytes) -> object:
    decoder = Decoder(1 << 17)
    decoder.feed(PROTOCOL_HEADER + data)
    decoder.next_frame()
    return decoder.next_frame()


def test_the_codec_answers_a_bad_table_with_the_frames_error_code():
    declare = struct.pack(">IH", Queue.Declare.index, 0) + b"\x01q\x00" + nested(MAX_DEPTH + 1)
    with pytest.raises(AmqpError) as caught:
        decode_one(frame_of(1, declare))
    assert caught.value.code == ReplyCode.FRAME_ERROR
    assert "deeper than" in caught.value.text and "Queue.Declare" in caught.value.text
    header = struct.pack(">HHQH", 60, 0, 1, 0x2000) + sized(b"\x01kS" + U32.pack(99))
    with pytest.raises(AmqpError) as caught:
        decode_one(frame_of(2, header))
    assert caught.value.code == ReplyCode.SYNTAX_ERROR
    assert "cannot decode content header" in caught.value.text
