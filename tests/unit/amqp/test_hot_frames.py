"""The frames every message carries (basic.publish and basic.ack in, basic.deliver out) are
packed and parsed directly; the result must be exactly what pamqp's generic path gives, and
anything unusual must still go pamqp's way."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pamqp import frame
from pamqp.body import ContentBody
from pamqp.commands import Basic
from pamqp.header import ContentHeader

from protocols.amqp.codec import Decoder
from protocols.amqp.frames import PROTOCOL_HEADER, Deliver, encode_content, encode_method
from protocols.amqp.reason_codes import AmqpError

short = st.text(max_size=40)
exchange_name = st.from_regex(r"[a-zA-Z0-9_.:-]{0,40}", fullmatch=True)
"""What pamqp accepts as an exchange name when building a method."""
signed_long_long = st.integers(-(1 << 63), (1 << 63) - 1)


def decoded(data: bytes) -> list:
    decoder = Decoder(1 << 20)
    decoder.feed(PROTOCOL_HEADER + data)
    out = []
    while (received := decoder.next_frame()) is not None:
        out.append(received[1])
    return out[1:]


def fields(method) -> tuple:
    return type(method), tuple(getattr(method, name) for name in method.__slots__)


@given(st.integers(-(1 << 15), (1 << 15) - 1), exchange_name, short, st.booleans(), st.booleans())
def test_a_publish_decodes_as_pamqp_decodes_it(ticket, exchange, key, mandatory, immediate):
    raw = encode_method(3, Basic.Publish(0, exchange, key, mandatory, immediate))
    raw = raw[:11] + ticket.to_bytes(2, "big", signed=True) + raw[13:]
    (method,) = decoded(raw)
    assert fields(method) == fields(frame.unmarshal(raw)[2])


@given(signed_long_long, st.booleans())
def test_an_ack_decodes_as_pamqp_decodes_it(tag, multiple):
    raw = encode_method(1, Basic.Ack(tag, multiple))
    (method,) = decoded(raw)
    assert fields(method) == fields(frame.unmarshal(raw)[2])


def test_a_publish_with_trailing_bytes_or_bad_utf8_goes_the_generic_way():
    raw = encode_method(1, Basic.Publish(0, "ex", "key"))
    longer = raw[:3] + (int.from_bytes(raw[3:7], "big") + 2).to_bytes(4, "big") + raw[7:-1] \
        + b"\x00\x00\xce"
    (method,) = decoded(longer)  # pamqp ignores what follows the last field
    assert (method.exchange, method.routing_key) == ("ex", "key")
    bad = raw.replace(b"\x02ex", b"\x02\xff\xfe")
    with pytest.raises(AmqpError):
        decoded(bad)


def pamqp_content(channel: int, method, properties: Basic.Properties, body: bytes,
                  frame_max: int) -> bytes:
    step = frame_max - 8
    return b"".join([frame.marshal(method, channel),
                     frame.marshal(ContentHeader(0, len(body), properties), channel),
                     *(frame.marshal(ContentBody(body[i:i + step]), channel)
                       for i in range(0, len(body), step))])


@given(short, signed_long_long, st.booleans(), short, short, st.binary(max_size=9000),
       st.sampled_from([4096, 131072]))
def test_a_delivery_encodes_as_pamqp_encodes_it(tag, delivery_tag, redelivered, exchange, key,
                                                body, frame_max):
    method = Deliver(tag, delivery_tag, redelivered, exchange, key)
    properties = Basic.Properties(delivery_mode=2, headers={"a": 1}, message_id="m")
    assert encode_content(5, method, properties, body, frame_max) \
        == pamqp_content(5, method, properties, body, frame_max)


def test_a_consumer_tag_longer_than_a_short_string_is_refused_as_pamqp_refuses_it():
    with pytest.raises(TypeError, match="255 bytes"):
        encode_content(1, Deliver("t" * 256, 1, False, "", "key"), Basic.Properties(), b"", 4096)


short_text = st.text(max_size=20)
properties_fields = st.fixed_dictionaries({}, optional={
    "content_type": short_text, "content_encoding": short_text,
    "headers": st.dictionaries(st.text(max_size=5), st.integers(0, 9), max_size=2),
    "delivery_mode": st.sampled_from([1, 2]), "priority": st.integers(0, 9),
    "correlation_id": short_text, "reply_to": short_text, "expiration": st.from_regex(r"[0-9]{1,6}", fullmatch=True),
    "message_id": short_text, "message_type": short_text, "user_id": short_text,
    "app_id": short_text})


@given(st.integers(1, 3), exchange_name, short, properties_fields, st.binary(min_size=1, max_size=5000),
       st.sampled_from([4096, 131072]))
def test_a_publish_read_in_one_step_is_what_its_frames_read_one_by_one_give(
        channel, exchange, key, fields_, body, frame_max):
    data = encode_content(channel, Basic.Publish(0, exchange, key), Basic.Properties(**fields_),
                          body, frame_max)
    decoder = Decoder(frame_max)
    decoder.feed(PROTOCOL_HEADER + data)
    decoder.next_frame()  # the protocol header
    message = decoder.next_message()
    method, header, *bodies = decoded(data)
    if message is None:  # a table (headers) or more than one body frame: frame by frame
        assert "headers" in fields_ or len(bodies) > 1
        return
    assert len(bodies) == 1
    on, publish, properties, payload, end = message
    assert (on, fields(publish), properties, payload, end) == (
        channel, fields(method), header.properties, bodies[0].value, len(data))
    assert all(getattr(properties, name) == getattr(header.properties, name)
               for name in Basic.Properties.__slots__)


@pytest.mark.parametrize("cut", range(1, 40))
def test_a_publish_cut_anywhere_is_not_read_in_one_step(cut):
    data = encode_content(1, Basic.Publish(0, "ex", "key"), Basic.Properties(delivery_mode=2),
                          b"body", 4096)
    decoder = Decoder(4096)
    decoder.feed(PROTOCOL_HEADER + data[:-cut] if cut < len(data) else PROTOCOL_HEADER)
    decoder.next_frame()
    assert decoder.next_message() is None
