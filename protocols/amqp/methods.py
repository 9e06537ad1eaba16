"""What the handshake says: the server's connection.start and the client's SASL response.

Server properties announce the capabilities RabbitMQ announces, so clients switch on the same
features (confirms, consumer cancel notifications, connection.blocked, ...). PLAIN's response
is ``\\0user\\0password``; AMQPLAIN's is a field table, without its length prefix, holding
LOGIN and PASSWORD. EXTERNAL (offered on a TLS connection whose client certificate names a
user) carries nothing the broker reads: the certificate is the credential.
"""

from __future__ import annotations

import platform
import struct
from typing import Final

from pamqp import commands, common
from pamqp.base import Frame

from .properties import FieldError, FieldReader
from .reason_codes import AmqpError, ReplyCode

__all__ = ["EXTERNAL", "MECHANISMS", "credentials", "ids", "start"]

MECHANISMS: Final = ("PLAIN", "AMQPLAIN")
EXTERNAL: Final = "EXTERNAL"
CAPABILITIES: Final[common.FieldTable] = {
    "publisher_confirms": True,
    "exchange_exchange_bindings": True,
    "basic.nack": True,
    "consumer_cancel_notify": True,
    "connection.blocked": True,
    "authentication_failure_close": True,
    "per_consumer_qos": True,
    "direct_reply_to": True,
    "consumer_priorities": True,
}


def start(product: str, version: str,
          mechanisms: tuple[str, ...] = MECHANISMS) -> commands.Connection.Start:
    """The connection.start the server opens with, offering ``mechanisms``."""
    properties: common.FieldTable = {
        "capabilities": CAPABILITIES,
        "product": product,
        "version": version,
        "platform": f"Python {platform.python_version()}",
        "information": "Sluice: AMQP 0-9-1 over a commit log",
    }
    return commands.Connection.Start(0, 9, properties, " ".join(mechanisms), "en_US")


def ids(method: Frame) -> tuple[int, int]:
    """(class id, method id) of a pamqp method, as a close names them."""
    return method.index >> 16, method.index & 0xFFFF


def credentials(mechanism: str, response: str | bytes,
                offered: tuple[str, ...] = MECHANISMS) -> tuple[str, str]:
    """(user, password) from a start-ok response; ("", "") for EXTERNAL. Raises AmqpError: 503
    COMMAND_INVALID for a mechanism not ``offered``, 502 SYNTAX_ERROR for a response that does
    not parse (the codes RabbitMQ answers with)."""
    raw = response.encode() if isinstance(response, str) else bytes(response)
    if mechanism in offered:
        if mechanism == EXTERNAL:
            return "", ""
        if mechanism == "PLAIN":
            return _plain(raw)
        if mechanism == "AMQPLAIN":
            return _amqplain(raw)
    raise AmqpError(ReplyCode.COMMAND_INVALID, f"unknown authentication mechanism {mechanism[:64]!r}",
                    *ids(commands.Connection.StartOk()))


def _plain(raw: bytes) -> tuple[str, str]:
    parts = raw.split(b"\x00")
    if len(parts) != 3:
        raise _syntax("PLAIN response is not \\0user\\0password")
    try:
        return parts[1].decode(), parts[2].decode()
    except UnicodeDecodeError:
        raise _syntax("PLAIN user or password is not UTF-8") from None


def _amqplain(raw: bytes) -> tuple[str, str]:
    packed = struct.pack(">I", len(raw)) + raw
    try:
        table, _ = FieldReader(packed).table(0, len(packed))
    except FieldError:
        raise _syntax("AMQPLAIN response is not a field table") from None
    user, password = table.get("LOGIN"), table.get("PASSWORD")
    if not isinstance(user, (str, bytes)) or not isinstance(password, (str, bytes)):
        raise _syntax("AMQPLAIN response lacks LOGIN or PASSWORD")
    try:
        return _text(user), _text(password)
    except UnicodeDecodeError:
        raise _syntax("AMQPLAIN LOGIN or PASSWORD is not UTF-8") from None


def _text(value: str | bytes) -> str:
    return value if isinstance(value, str) else value.decode()


def _syntax(text: str) -> AmqpError:
    return AmqpError(ReplyCode.SYNTAX_ERROR, text, *ids(commands.Connection.StartOk()))
