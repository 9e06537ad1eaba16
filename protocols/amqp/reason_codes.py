"""AMQP 0-9-1 reply codes and the errors that carry them (pamqp `exceptions.py` style).

AMQP calls these reply codes; the module is named like MQTT's so the sans-IO import rule covers
it. A soft error closes one channel (channel.close), a hard error the connection
(connection.close); which codes are which is the spec's, and the codes chosen for each kind of
bad input follow what RabbitMQ 4 answers.
"""

from __future__ import annotations

from enum import IntEnum


class ReplyCode(IntEnum):
    """Reply codes of the AMQP 0-9-1 spec."""

    REPLY_SUCCESS = 200
    CONTENT_TOO_LARGE = 311
    NO_ROUTE = 312
    NO_CONSUMERS = 313
    CONNECTION_FORCED = 320
    INVALID_PATH = 402
    ACCESS_REFUSED = 403
    NOT_FOUND = 404
    RESOURCE_LOCKED = 405
    PRECONDITION_FAILED = 406
    FRAME_ERROR = 501
    SYNTAX_ERROR = 502
    COMMAND_INVALID = 503
    CHANNEL_ERROR = 504
    UNEXPECTED_FRAME = 505
    RESOURCE_ERROR = 506
    NOT_ALLOWED = 530
    NOT_IMPLEMENTED = 540
    INTERNAL_ERROR = 541

    @property
    def hard(self) -> bool:
        """Whether the error closes the connection rather than a channel."""
        return self in HARD_ERRORS


SOFT_ERRORS = frozenset({ReplyCode.ACCESS_REFUSED, ReplyCode.NOT_FOUND,
                         ReplyCode.RESOURCE_LOCKED, ReplyCode.PRECONDITION_FAILED,
                         ReplyCode.CONTENT_TOO_LARGE, ReplyCode.NO_ROUTE,
                         ReplyCode.NO_CONSUMERS})
HARD_ERRORS = frozenset(ReplyCode) - SOFT_ERRORS - {ReplyCode.REPLY_SUCCESS}


class AmqpError(Exception):
    """Bad input from the client, with the reply code that answers it. ``class_id`` and
    ``method_id`` name the method that caused it (0 when it was no method)."""

    def __init__(self, code: ReplyCode, text: str, class_id: int = 0,
                 method_id: int = 0) -> None:
        super().__init__(text)
        self.code = code
        self.text = text
        self.class_id = class_id
        self.method_id = method_id

    @property
    def reply_text(self) -> str:
        """The text a close carries: the code's name, then what was wrong (RabbitMQ's form)."""
        return f"{self.code.name} - {self.text}"


class FrameError(AmqpError):
    """The byte stream lost its framing (a frame too large, a bad frame-end octet, an unknown
    frame type): nothing after it can be read, so the connection closes without waiting for
    the client's close-ok."""

    def __init__(self, text: str) -> None:
        super().__init__(ReplyCode.FRAME_ERROR, text)


class BadProtocolHeader(Exception):
    """The client opened with something other than the AMQP 0-9-1 protocol header."""
