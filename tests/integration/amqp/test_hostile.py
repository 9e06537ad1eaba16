"""Malformed frames against a real `sluice serve`: each closes only its own connection, with
connection.close 501 (FRAME_ERROR) or 502 (SYNTAX_ERROR) as RabbitMQ answers (field tables
nested or filled beyond the decoder's bounds too), and one log line
naming the peer and the code (beside the usual disconnect line); a pika connection open
meanwhile goes on undisturbed. (tests/fuzz/live_fuzz.py sends random and mutated AMQP frames
for minutes.)"""
from __future__ import annotations

import socket

from pamqp import frame as amqp_frame
from pamqp.commands import Basic, Channel, Connection, Queue
from pamqp.header import ContentHeader

from protocols.amqp.frames import encode_method
from protocols.amqp.properties import MAX_DEPTH, MAX_ENTRIES
from tests.fuzz.amqp_frames import handshake
from tests.integration.amqp.conftest import connect

WAIT_S = 10


def nested(levels: int) -> dict:
    table: dict = {}
    for _ in range(levels):
        table = {"k": table}
    return table


QUEUE_DECLARE = encode_method(1, Queue.Declare(queue="q"))
CONTENT_HEADER = b"\x02\x00\x01\x00\x00\x00\x05\x00\x3c\x00\x00\x00\xce"
"""A content header frame whose payload (class 60, then nothing) cannot be decoded."""

MALFORMED = {
    "bad frame end": (QUEUE_DECLARE[:-1] + b"\x00", 501, "FRAME_ERROR"),
    "unknown frame type": (b"\x07" + QUEUE_DECLARE[1:], 501, "FRAME_ERROR"),
    "undecodable method": (b"\x01\x00\x01\x00\x00\x00\x06\x00\x32\x00\x0a\x00\x00\xce", 501,
                           "FRAME_ERROR"),
    "undecodable content header": (encode_method(1, Basic.Publish(exchange="", routing_key="q"))
                                   + CONTENT_HEADER, 502, "SYNTAX_ERROR"),
    "arguments nested too deep": (encode_method(1, Queue.Declare(queue="q", arguments=nested(
        MAX_DEPTH + 1))), 501, "FRAME_ERROR"),
    "headers of too many entries": (encode_method(1, Basic.Publish(exchange="", routing_key="q"))
                                    + amqp_frame.marshal(ContentHeader(0, 1, Basic.Properties(
                                        headers={str(i): i for i in range(MAX_ENTRIES + 1)})), 1),
                                    502, "SYNTAX_ERROR"),
}


def close_for(address: str, data: bytes) -> tuple[str, Connection.Close]:
    """Open a connection, send ``data`` after channel.open; (our peer name, the close read)."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=WAIT_S) as sock:
        peer = "%s:%d" % sock.getsockname()
        sock.sendall(handshake() + encode_method(1, Channel.Open()) + data)
        buffer, close = b"", None
        while close is None:
            chunk = sock.recv(65_536)
            assert chunk, "closed without connection.close"
            buffer += chunk
            while len(buffer) >= 8 and len(buffer) >= int.from_bytes(buffer[3:7], "big") + 8:
                used, _, value = amqp_frame.unmarshal(buffer)
                buffer = buffer[used:]
                if isinstance(value, Connection.Close):
                    close = value
        try:  # after a framing error the broker closes at once: close-ok may meet a reset
            sock.sendall(encode_method(0, Connection.CloseOk()))
            assert sock.recv(65_536) == b"", "the connection stayed open after its close"
        except ConnectionResetError:
            pass
        return peer, close


def test_malformed_frames_close_only_their_connection_with_one_log_line(sluice_server,
                                                                        tmp_path):
    server = sluice_server(tmp_path / "data")
    server.wait_ready()
    healthy = connect(server)
    channel = healthy.channel()
    channel.confirm_delivery()
    channel.queue_declare("healthy")
    peers = {}
    for case, (data, code, name) in MALFORMED.items():
        peer, close = close_for(server.amqp, data)
        assert (close.reply_code, close.reply_text.split(" ")[0]) == (code, name), case
        peers[case] = (peer, name)
        channel.basic_publish("", "healthy", case.encode())  # confirmed, or it raises
        assert channel.basic_get("healthy", auto_ack=True)[2] == case.encode()
    healthy.close()
    assert server.stop() == 0
    log = server.log()
    assert "Traceback" not in log and " ERROR " not in log, log[-3000:]
    for case, (peer, name) in peers.items():
        lines = [line for line in log.splitlines() if peer in line and f"closed: {name}" in line]
        assert len(lines) == 1, (case, lines)
