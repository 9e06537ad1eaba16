"""Incremental AMQP 0-9-1 decoder: `feed(bytes)`, then `next_frame()` until None.

It reads the protocol header first, then frames (layout in `frames.py`). From a frame's 7-byte
header it knows the payload size, refuses a frame above frame_max before buffering it, and
decodes only whole frames, so "wait for more bytes" (None) is never confused with garbage
(an `AmqpError` with its reply code). Method fields and content headers are decoded in linear
time by `properties.py` into pamqp's objects. It reads no socket and keeps no state beyond the
buffer.
"""

from __future__ import annotations

from typing import Final

from pamqp import commands
from pamqp.body import ContentBody
from pamqp.frame import FrameTypes
from pamqp.header import ProtocolHeader
from pamqp.heartbeat import Heartbeat

from .frames import (BODY, FRAME_END, FRAME_MIN_SIZE, FRAME_OVERHEAD, FRAME_TYPES, HEADER,
                     HEADER_SIZE, HEARTBEAT, METHOD, PROTOCOL_HEADER, content_header,
                     frame_header)
from .properties import FieldError, method_arguments
from .properties import content_header as decode_content_header
from .properties import properties as decode_properties
from .reason_codes import AmqpError, BadProtocolHeader, FrameError, ReplyCode

__all__ = ["Decoder", "Message", "Received"]

Received = tuple[int, FrameTypes]
"""(channel, frame): a pamqp method, ContentHeader, ContentBody, Heartbeat or ProtocolHeader."""
Message = tuple[int, commands.Basic.Publish, commands.Basic.Properties, bytes, int]
"""(channel, publish, properties, body, where its last frame ends): a whole publish."""

ACCEPTED_HEADERS: Final = frozenset({PROTOCOL_HEADER, b"AMQP\x01\x01\x00\x09"})
"""0-9-1, and 0-9's header, which RabbitMQ also serves as 0-9-1."""


class Decoder:
    """Turns a client's byte stream into frames. ``frame_max`` is the largest frame accepted;
    the connection raises it from 4096 to the negotiated value after tune-ok."""

    def __init__(self, frame_max: int = FRAME_MIN_SIZE) -> None:
        self.frame_max = frame_max
        self._buffer = bytearray()
        self._start = 0
        """Where the next frame starts in ``_buffer``: frames returned are cut off at the next
        ``feed``, once per read rather than once per frame."""
        self._header_read = False

    @property
    def buffered(self) -> int:
        """Bytes fed and not yet returned as frames."""
        return len(self._buffer) - self._start

    def feed(self, data: bytes) -> None:
        """Append bytes read from the peer."""
        if self._start:
            del self._buffer[:self._start]
            self._start = 0
        self._buffer += data

    def next_frame(self) -> Received | None:
        """The next whole frame, or None until more bytes arrive. Raises BadProtocolHeader for
        a wrong first 8 bytes, AmqpError (FrameError when framing is lost) for a bad frame."""
        if not self._header_read:
            return self._protocol_header()
        buffer, start = self._buffer, self._start
        if len(buffer) - start < HEADER_SIZE:
            return None
        kind, channel, size = frame_header(buffer, start)
        # RabbitMQ lets a payload reach frame_max itself: clients are often 8 bytes off.
        if size > self.frame_max:
            raise FrameError(f"frame of {size} bytes exceeds frame_max {self.frame_max}")
        end = start + size + FRAME_OVERHEAD
        if len(buffer) < end:
            return None
        if buffer[end - 1] != FRAME_END:
            raise FrameError(f"invalid frame end octet {buffer[end - 1]:#04x}")
        if kind not in FRAME_TYPES:
            raise FrameError(f"unknown frame type {kind}")
        self._start = end
        if kind == BODY:  # the body's bytes, copied once
            return channel, ContentBody(bytes(buffer[start + HEADER_SIZE:end - 1]))
        return channel, _PARSERS[kind](bytes(buffer[start:end]), size)

    def next_message(self) -> Message | None:
        """Peek at a whole publish as most clients send it: basic.publish, its content header
        and one body frame, all buffered, on one channel, well-formed and within frame_max,
        decoded in one go. Nothing is consumed (``skip`` does, once the connection's state
        allows it). None for anything else, which ``next_frame`` then reads frame by frame
        (and refuses as it always did)."""
        if not self._header_read:
            return None
        buffer, start, frame_max = self._buffer, self._start, self.frame_max
        found = _frame_at(buffer, start, METHOD, frame_max)
        if found is None or buffer[start + HEADER_SIZE:start + HEADER_SIZE + 4] != _PUBLISH_ID:
            return None
        channel, method_end = found
        found = _frame_at(buffer, method_end, HEADER, frame_max, channel)
        if found is None:
            return None
        header_end = found[1]
        if header_end - method_end < FRAME_OVERHEAD + 14:  # class, weight, size, flags
            return None
        class_id, body_size = content_header(buffer, method_end + HEADER_SIZE)
        found = _frame_at(buffer, header_end, BODY, frame_max, channel)
        if found is None or class_id != commands.Basic.frame_id or not body_size \
                or found[1] - header_end - FRAME_OVERHEAD != body_size:
            return None
        method = _publish(buffer, start + HEADER_SIZE + 4, method_end - 1)
        if method is None:
            return None
        header = bytes(buffer[method_end + HEADER_SIZE:header_end - 1])
        try:
            properties = decode_properties(header, 12, len(header))
        except FieldError:  # ``next_frame`` refuses it
            return None
        end = found[1]
        return channel, method, properties, bytes(buffer[header_end + HEADER_SIZE:end - 1]), end

    def skip(self, end: int) -> None:
        """Consume what ``next_message`` peeked at, up to ``end``."""
        self._start = end

    def _protocol_header(self) -> Received | None:
        got = bytes(self._buffer[:len(PROTOCOL_HEADER)])
        if not PROTOCOL_HEADER.startswith(got[:4]):
            raise BadProtocolHeader(f"not AMQP: {got!r}")
        if len(got) < len(PROTOCOL_HEADER):
            return None
        if got not in ACCEPTED_HEADERS:
            raise BadProtocolHeader(f"unsupported protocol version {got[4:]!r}")
        del self._buffer[:len(PROTOCOL_HEADER)]
        self._header_read = True
        return 0, ProtocolHeader()


def _method(data: bytes, size: int) -> FrameTypes:
    if size < 4:
        raise FrameError(f"method frame of {size} bytes has no method id")
    index = int.from_bytes(data[HEADER_SIZE:HEADER_SIZE + 4], "big")
    fast = _FAST_METHODS.get(index)
    if fast is not None and (method := fast(data, HEADER_SIZE + 4, HEADER_SIZE + size)) is not None:
        return method
    kind = commands.INDEX_MAPPING.get(index)
    if kind is None:
        raise AmqpError(ReplyCode.NOT_IMPLEMENTED,
                        f"unknown method {index >> 16}.{index & 0xFFFF}", index >> 16,
                        index & 0xFFFF)
    try:
        return method_arguments(kind(), data, HEADER_SIZE + 4, HEADER_SIZE + size)
    except FieldError as exc:
        # RabbitMQ's "cannot decode": a frame whose fields do not parse is a frame error.
        raise AmqpError(ReplyCode.FRAME_ERROR, f"cannot decode {kind.name}: {exc}",
                        index >> 16, index & 0xFFFF) from None


# The methods every message carries, decoded without pamqp's generic field walk. Each returns
# what pamqp's ``frame.unmarshal`` would (an instance built with defaults, then its fields set,
# not validated), or None for anything but a well-formed payload of exactly its length, which
# then goes the generic way and fails there as it always did.

def _publish(data: bytes, start: int, end: int) -> FrameTypes | None:
    try:
        exchange_end = start + 3 + data[start + 2]
        key_end = exchange_end + 1 + data[exchange_end]
        if key_end + 1 != end:
            return None
        method = _new_publish(_PUBLISH)
        method.ticket = int.from_bytes(data[start:start + 2], "big")
        method.exchange = data[start + 3:exchange_end].decode()
        method.routing_key = data[exchange_end + 1:key_end].decode()
    except (IndexError, UnicodeDecodeError):
        return None
    bits = data[key_end]
    method.mandatory = bool(bits & 1)
    method.immediate = bool(bits & 2)
    return method


def _ack(data: bytes, start: int, end: int) -> FrameTypes | None:
    if start + 9 != end:
        return None
    method = _new_ack(_ACK)
    method.delivery_tag = int.from_bytes(data[start:start + 8], "big", signed=True)
    method.multiple = bool(data[start + 8] & 1)
    return method


_PUBLISH, _ACK = commands.Basic.Publish, commands.Basic.Ack
_new_publish = _new_ack = object.__new__
_FAST_METHODS = {_PUBLISH.index: _publish, _ACK.index: _ack}
_PUBLISH_ID = _PUBLISH.index.to_bytes(4, "big")


def _frame_at(buffer: bytearray, start: int, kind: int, frame_max: int,
              channel: int | None = None) -> tuple[int, int] | None:
    """(channel, end) of the whole frame of ``kind`` (on ``channel``, if given) at ``start``;
    None if it is not all buffered or is anything else."""
    if len(buffer) - start < HEADER_SIZE:
        return None
    found, on, size = frame_header(buffer, start)
    end = start + size + FRAME_OVERHEAD
    if found != kind or size > frame_max or len(buffer) < end or buffer[end - 1] != FRAME_END \
            or (channel is not None and on != channel):
        return None
    return on, end


def _header(data: bytes, size: int) -> FrameTypes:
    try:
        return decode_content_header(data, HEADER_SIZE, HEADER_SIZE + size)
    except FieldError as exc:
        raise AmqpError(ReplyCode.SYNTAX_ERROR, f"cannot decode content header: {exc}") from None


def _heartbeat(data: bytes, size: int) -> FrameTypes:
    if size:
        raise FrameError(f"heartbeat frame with a {size}-byte payload")
    return Heartbeat()


_PARSERS = {METHOD: _method, HEADER: _header, HEARTBEAT: _heartbeat}
