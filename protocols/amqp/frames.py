"""AMQP 0-9-1 frame layout and the encoders for what the server sends, marshalled by pamqp.

Frame layout (spec 2.3.5 / 4.2.3):

    byte 0      frame type: 1 method, 2 content header, 3 content body, 8 heartbeat
    bytes 1-2   channel number (0 for the connection itself and for heartbeats)
    bytes 3-6   payload size N, big-endian
    bytes 7..   the payload, N bytes
    byte 7+N    frame-end octet 0xCE

A connection opens with the 8-byte protocol header ``AMQP\\x00\\x00\\x09\\x01`` instead. A
message is a method frame (basic.publish / deliver / get-ok / return), one content header
frame (class, body size, properties) and body frames of at most frame_max - 8 bytes each.
"""

from __future__ import annotations

import struct
from typing import Final, TypeVar

from pamqp import commands, frame
from pamqp.base import Frame
from pamqp.heartbeat import Heartbeat

from .field_values import field_table

PROTOCOL_HEADER: Final = b"AMQP\x00\x00\x09\x01"
"""What an AMQP 0-9-1 client sends first, and what a client with another header gets back."""
HEADER_SIZE: Final = 7
"""Type, channel and payload size."""
FRAME_OVERHEAD: Final = HEADER_SIZE + 1
"""Header plus the frame-end octet: a body frame carries at most frame_max - 8 bytes."""
FRAME_END: Final = 0xCE
FRAME_MIN_SIZE: Final = 4096
"""The smallest frame_max a peer may negotiate, and the limit before tune-ok (spec 4.2.3)."""
METHOD, HEADER, BODY, HEARTBEAT = 1, 2, 3, 8
FRAME_TYPES: Final = frozenset({METHOD, HEADER, BODY, HEARTBEAT})
HEARTBEAT_FRAME: Final = Heartbeat.marshal()

_HEAD = struct.Struct(">BHI")
_CONTENT_HEAD = struct.Struct(">HxxQ")
"""A content header's class id, weight (0) and body size; its property flags and values follow."""
_END = bytes((FRAME_END,))
_DELIVER_ID = struct.pack(">I", commands.Basic.Deliver.index)
_TAG_BIT = struct.Struct(">qB")
"""basic.deliver's delivery tag (pamqp's long-long is signed) and its one bit, redelivered."""

_F = TypeVar("_F", bound=type[Frame])


def _any_name(method: _F) -> _F:
    """``method`` without pamqp's check of queue and exchange names against
    ``[a-zA-Z0-9-_.:@#,/+ ]*``: RabbitMQ takes any short string, so a queue named ``a.*``
    or ``café`` is declared and must be answered (its declare-ok, and deliveries naming its
    exchange). The decoder has already bounded them to 255 bytes."""
    return type(method.__name__, (method,), {"validate": lambda self: None,
                                             "__doc__": method.__doc__})


DeclareOk = _any_name(commands.Queue.DeclareOk)
GetOk = _any_name(commands.Basic.GetOk)
Deliver = _any_name(commands.Basic.Deliver)
Return = _any_name(commands.Basic.Return)


def frame_header(data: bytes | bytearray, offset: int = 0) -> tuple[int, int, int]:
    """(type, channel, payload size) of the frame starting at ``data[offset]`` (7 bytes needed)."""
    return _HEAD.unpack_from(data, offset)


def content_header(data: bytes | bytearray, offset: int) -> tuple[int, int]:
    """(class id, body size) of the content header payload starting at ``data[offset]``."""
    return _CONTENT_HEAD.unpack_from(data, offset)


def encode_method(channel: int, method: Frame) -> bytes:
    """One method frame."""
    return frame.marshal(method, channel)


def encode_content(channel: int, method: Frame, properties: commands.Basic.Properties,
                   body: bytes, frame_max: int) -> bytes:
    """A content-carrying method (basic.deliver, get-ok, return, publish), its header and
    its body cut into frames of at most ``frame_max - 8`` bytes."""
    fast = _deliver_payload(method) if isinstance(method, commands.Basic.Deliver) else None
    method_frame = frame.marshal(method, channel) if fast is None else _framed(METHOD, channel, fast)
    return b"".join(content_frames(channel, method_frame, marshal_properties(properties), body,
                                   frame_max))


def marshal_properties(properties: commands.Basic.Properties) -> bytes:
    """``properties`` as a content header's property flags and values. Properties read from a
    publisher go back out as they came (basic.return, direct reply-to), but headers pamqp
    decodes and cannot encode (a long string that is not UTF-8 goes back as a byte array, a
    double past single precision is dropped) never fail the answer."""
    try:
        return properties.marshal()
    except (TypeError, ValueError, OverflowError, struct.error):
        kept = dict(properties)
        kept["headers"] = field_table(kept.get("headers") or {}) or None
        return commands.Basic.Properties(**kept).marshal()


def encode_delivery(channel: int, consumer_tag: str, delivery_tag: int, redelivered: bool,
                    exchange: str, routing_key: str, properties: bytes, body: bytes,
                    frame_max: int) -> list[bytes]:
    """basic.deliver with its content, as `encode_content` encodes it, from the fields and the
    marshalled ``properties``; in pieces, so the body is copied only once they are joined."""
    payload = _deliver_fields(consumer_tag, delivery_tag, redelivered, exchange, routing_key)
    if payload is None:  # pamqp says why
        method_frame = frame.marshal(Deliver(consumer_tag, delivery_tag, redelivered, exchange,
                                             routing_key), channel)
    else:
        method_frame = _framed(METHOD, channel, payload)
    return content_frames(channel, method_frame, properties, body, frame_max)


def content_frames(channel: int, method_frame: bytes, properties: bytes, body: bytes,
                   frame_max: int) -> list[bytes]:
    """The pieces of a method frame, its content header (marshalled ``properties``) and its
    body frames of at most ``frame_max - 8`` bytes each."""
    step = frame_max - FRAME_OVERHEAD
    if step <= 0:
        raise ValueError(f"frame_max {frame_max} leaves no room for a body")
    parts = [method_frame, _HEAD.pack(HEADER, channel, 12 + len(properties)),
             _CONTENT_HEAD.pack(commands.Basic.frame_id, len(body)), properties, _END]
    if len(body) <= step:  # the usual case: one body frame, the body itself not sliced
        if body:
            parts += (_HEAD.pack(BODY, channel, len(body)), body, _END)
        return parts
    for i in range(0, len(body), step):
        chunk = body[i:i + step]
        parts += (_HEAD.pack(BODY, channel, len(chunk)), chunk, _END)
    return parts


def _framed(kind: int, channel: int, payload: bytes) -> bytes:
    return b"".join((_HEAD.pack(kind, channel, len(payload)), payload, _END))


def _deliver_payload(method: commands.Basic.Deliver) -> bytes | None:
    """basic.deliver's method payload, packed directly: the one method every delivery
    carries. None when a field is not a short string (pamqp then says why)."""
    return _deliver_fields(method.consumer_tag, method.delivery_tag, method.redelivered,
                           method.exchange, method.routing_key)


def _deliver_fields(consumer_tag: str, delivery_tag: int, redelivered: bool, exchange: str,
                    routing_key: str) -> bytes | None:
    strings = (consumer_tag, exchange, routing_key)
    if not all(type(value) is str for value in strings):
        return None
    tag, name, key = (value.encode() for value in strings)
    if max(len(tag), len(name), len(key)) > 255:
        return None
    return b"".join((_DELIVER_ID, bytes((len(tag),)), tag,
                     _TAG_BIT.pack(delivery_tag, bool(redelivered)),
                     bytes((len(name),)), name, bytes((len(key),)), key))
