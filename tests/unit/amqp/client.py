"""A scripted AMQP 0-9-1 client for the sans-IO tests: frames built with pamqp, and what the
server writes decoded back into (channel, frame) pairs."""

from __future__ import annotations

from typing import Any

from pamqp import commands, encode, frame
from pamqp.base import Frame
from pamqp.commands import Basic, Channel, Connection

from protocols.amqp.connection import Options, ServerConnection
from protocols.amqp.events import Event
from protocols.amqp.frames import PROTOCOL_HEADER, encode_content, encode_method

CAPABILITIES = {"connection.blocked": True, "authentication_failure_close": True,
                "consumer_cancel_notify": True}


def method(channel: int, m: Frame) -> bytes:
    return encode_method(channel, m)


def publish(channel: int, body: bytes, frame_max: int = 4096, routing_key: str = "k",
            properties: Basic.Properties | None = None) -> bytes:
    return encode_content(channel, Basic.Publish(exchange="x", routing_key=routing_key),
                          properties or Basic.Properties(), body, frame_max)


def plain_start_ok(user: str = "guest", password: str = "guest") -> bytes:
    return method(0, Connection.StartOk({"product": "test", "capabilities": CAPABILITIES},
                                        "PLAIN", f"\0{user}\0{password}"))


def amqplain_start_ok(user: str, password: str) -> bytes:
    table = encode.field_table({"LOGIN": user, "PASSWORD": password})[4:]
    return method(0, Connection.StartOk({}, "AMQPLAIN", table.decode()))


def handshake(frame_max: int = 4096, heartbeat: int = 0, channel_max: int = 16,
              vhost: str = "/") -> bytes:
    """Everything a client sends up to connection.open, pipelined."""
    return (PROTOCOL_HEADER + plain_start_ok()
            + method(0, Connection.TuneOk(channel_max, frame_max, heartbeat))
            + method(0, Connection.Open(vhost)))


def decode(data: bytes) -> list[tuple[int, Any]]:
    """(channel, pamqp frame) for every frame in ``data``."""
    out, offset = [], 0
    while offset < len(data):
        used, channel, value = frame.unmarshal(data[offset:])
        out.append((channel, value))
        offset += used
    return out


def names(data: bytes) -> list[str]:
    return [value.name for _, value in decode(data)]


def events(conn: ServerConnection) -> list[Event]:
    out = []
    while (e := conn.next_event()) is not None:
        out.append(e)
    return out


def feed(conn: ServerConnection, data: bytes, now: float = 0.0,
         one_byte: bool = False) -> list[Event]:
    """Feed ``data`` (whole or a byte at a time) and return the events it caused."""
    got: list[Event] = []
    for chunk in ([data[i:i + 1] for i in range(len(data))] if one_byte else [data]):
        conn.receive_data(chunk, now)
        got += events(conn)
    return got


def opened(options: Options = Options(frame_max=4096, channel_max=16, heartbeat=0),
           heartbeat: int = 0, channels: tuple[int, ...] = (1,)) -> ServerConnection:
    """A connection through the handshake with ``channels`` open; its output drained."""
    conn = ServerConnection(options)
    feed(conn, handshake(options.frame_max, heartbeat, options.channel_max))
    conn.accept_login()
    events(conn)
    conn.open_vhost()
    for channel in channels:
        feed(conn, method(channel, Channel.Open()))
    conn.data_to_send()
    return conn


def close_of(data: bytes) -> tuple[int, int] | None:
    """(channel, reply code) of the first connection or channel close in ``data``."""
    for channel, value in decode(data):
        if isinstance(value, (commands.Connection.Close, commands.Channel.Close)):
            return channel, value.reply_code
    return None
