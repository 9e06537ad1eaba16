"""Incremental AMQP 0-9-1 decoder: `feed(bytes)`, then `next_frame()` until None.

It reads the protocol header first, then frames (layout in `frames.py`). From a frame's 7-byte
header it knows the payload size, refuses a frame above frame_max before buffering it, and
hands pamqp only whole frames, so "wait for more bytes" (None) is never confused with garbage
(an `AmqpError` with its reply code). It reads no socket and keeps no state beyond the buffer.
"""

from __future__ import annotations

from typing import Final

from pamqp import commands, frame
from pamqp.body import ContentBody
from pamqp.exceptions import UnmarshalingException
from pamqp.frame import FrameTypes
from pamqp.header import ContentHeader, ProtocolHeader
from pamqp.heartbeat import Heartbeat

from .frames import (BODY, FRAME_END, FRAME_MIN_SIZE, FRAME_OVERHEAD, FRAME_TYPES, HEADER,
                     HEADER_SIZE, HEARTBEAT, METHOD, PROTOCOL_HEADER, frame_header)
from .reason_codes import AmqpError, BadProtocolHeader, FrameError, ReplyCode

__all__ = ["Decoder", "Received"]

Received = tuple[int, FrameTypes]
"""(channel, frame): a pamqp method, ContentHeader, ContentBody, Heartbeat or ProtocolHeader."""

ACCEPTED_HEADERS: Final = frozenset({PROTOCOL_HEADER, b"AMQP\x01\x01\x00\x09"})
"""0-9-1, and 0-9's header, which RabbitMQ also serves as 0-9-1."""
_DECODE_ERRORS = (UnmarshalingException, RecursionError)
"""pamqp wraps its struct and value errors; a field table nested a few thousand deep (8 bytes a
level, well inside a negotiated frame_max) overflows its recursive decoder instead."""


class Decoder:
    """Turns a client's byte stream into frames. ``frame_max`` is the largest frame accepted;
    the connection raises it from 4096 to the negotiated value after tune-ok."""

    def __init__(self, frame_max: int = FRAME_MIN_SIZE) -> None:
        self.frame_max = frame_max
        self._buffer = bytearray()
        self._header_read = False

    @property
    def buffered(self) -> int:
        """Bytes fed and not yet returned as frames."""
        return len(self._buffer)

    def feed(self, data: bytes) -> None:
        """Append bytes read from the peer."""
        self._buffer += data

    def next_frame(self) -> Received | None:
        """The next whole frame, or None until more bytes arrive. Raises BadProtocolHeader for
        a wrong first 8 bytes, AmqpError (FrameError when framing is lost) for a bad frame."""
        if not self._header_read:
            return self._protocol_header()
        if len(self._buffer) < HEADER_SIZE:
            return None
        kind, channel, size = frame_header(self._buffer)
        # RabbitMQ lets a payload reach frame_max itself: clients are often 8 bytes off.
        if size > self.frame_max:
            raise FrameError(f"frame of {size} bytes exceeds frame_max {self.frame_max}")
        end = size + FRAME_OVERHEAD
        if len(self._buffer) < end:
            return None
        if self._buffer[end - 1] != FRAME_END:
            raise FrameError(f"invalid frame end octet {self._buffer[end - 1]:#04x}")
        if kind not in FRAME_TYPES:
            raise FrameError(f"unknown frame type {kind}")
        data = bytes(self._buffer[:end])
        del self._buffer[:end]
        return channel, _PARSERS[kind](data, size)

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
    if index not in commands.INDEX_MAPPING:
        raise AmqpError(ReplyCode.NOT_IMPLEMENTED,
                        f"unknown method {index >> 16}.{index & 0xFFFF}", index >> 16,
                        index & 0xFFFF)
    try:
        return frame.unmarshal(data)[2]
    except _DECODE_ERRORS as exc:
        # RabbitMQ's "cannot decode": a frame whose fields do not parse is a frame error.
        raise AmqpError(ReplyCode.FRAME_ERROR, f"cannot decode {commands.INDEX_MAPPING[index].name}"
                        f" ({exc.__class__.__name__})", index >> 16, index & 0xFFFF) from None


def _header(data: bytes, size: int) -> FrameTypes:
    try:
        result = frame.unmarshal(data)[2]
    except _DECODE_ERRORS as exc:
        raise AmqpError(ReplyCode.SYNTAX_ERROR,
                        f"cannot decode content header ({exc.__class__.__name__})") from None
    assert isinstance(result, ContentHeader)
    return result


def _body(data: bytes, size: int) -> FrameTypes:
    return ContentBody(data[HEADER_SIZE:HEADER_SIZE + size])


def _heartbeat(data: bytes, size: int) -> FrameTypes:
    if size:
        raise FrameError(f"heartbeat frame with a {size}-byte payload")
    return Heartbeat()


_PARSERS = {METHOD: _method, HEADER: _header, BODY: _body, HEARTBEAT: _heartbeat}
