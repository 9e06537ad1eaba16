"""Flow over AMQP against a real `sluice serve`: channel.flow stops and resumes a channel's
deliveries, and a no_ack consumer (or a client sending basic.get) that reads slowly is held
back by its socket instead of the broker buffering the queue for it."""
from __future__ import annotations

import socket
import time
import uuid

import pika
from pamqp import frame as amqp_frame
from pamqp.commands import Basic, Channel, Connection

from protocols.amqp.frames import PROTOCOL_HEADER, encode_method
from tests.integration.amqp.conftest import connect

WAIT_S = 20


def name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def ready(channel, queue: str) -> int:
    return channel.queue_declare(queue, passive=True).method.message_count


def test_channel_flow_off_holds_deliveries_and_on_resumes_them(amqp_server):
    connection = connect(amqp_server)
    consuming, publishing = connection.channel(), connection.channel()
    publishing.confirm_delivery()
    queue = name("flow")
    consuming.queue_declare(queue)
    got: list[bytes] = []
    consuming.basic_consume(queue, lambda ch, m, p, body: got.append(body), auto_ack=True)
    assert consuming.flow(False) is False  # flow-ok(active=false)
    for n in range(3):
        publishing.basic_publish("", queue, b"%d" % n)
    connection.process_data_events(0)
    assert got == [] and ready(publishing, queue) == 3, "deliveries went out with flow off"
    assert consuming.flow(True) is True
    deadline = time.monotonic() + WAIT_S
    while len(got) < 3 and time.monotonic() < deadline:
        connection.process_data_events(0.2)
    assert got == [b"0", b"1", b"2"]
    connection.close()


class RawConsumer:
    """A client on a plain socket with a small receive buffer that consumes with no_ack (unless
    ``consume`` is False) and then reads only when told to."""

    def __init__(self, address: str, queue: str, consume: bool = True) -> None:
        host, port = address.rsplit(":", 1)
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 << 10)
        self.sock.connect((host, int(port)))
        self.sock.settimeout(WAIT_S)
        self.buffer = b""
        self.sock.sendall(PROTOCOL_HEADER)
        self.expect(Connection.Start)
        self.sock.sendall(encode_method(0, Connection.StartOk({}, "PLAIN", "\0guest\0guest")))
        tune = self.expect(Connection.Tune)
        self.sock.sendall(encode_method(0, Connection.TuneOk(tune.channel_max, tune.frame_max, 0))
                          + encode_method(0, Connection.Open("/")))
        self.expect(Connection.OpenOk)
        self.sock.sendall(encode_method(1, Channel.Open()))
        self.expect(Channel.OpenOk)
        if consume:
            self.sock.sendall(encode_method(1, Basic.Consume(queue=queue, consumer_tag="slow",
                                                             no_ack=True)))
            self.expect(Basic.ConsumeOk)

    def next_frame(self):
        while True:
            if len(self.buffer) >= 7:
                size = int.from_bytes(self.buffer[3:7], "big") + 8
                if len(self.buffer) >= size:
                    _, _, value = amqp_frame.unmarshal(self.buffer[:size])
                    self.buffer = self.buffer[size:]
                    return value
            data = self.sock.recv(1 << 16)
            assert data, "the broker closed the connection"
            self.buffer += data

    def expect(self, kind):
        value = self.next_frame()
        assert isinstance(value, kind), value
        return value

    def deliveries(self, count: int) -> list[int]:
        """Read until ``count`` deliveries came; their delivery tags."""
        tags = []
        while len(tags) < count:
            value = self.next_frame()
            if isinstance(value, Basic.Deliver):
                tags.append(value.delivery_tag)
        return tags


def test_a_slow_no_ack_consumer_is_throttled_by_its_socket_and_gets_everything(amqp_server):
    count, size = 2000, 16 << 10
    connection = connect(amqp_server)
    channel = connection.channel()
    channel.confirm_delivery()
    queue = name("slow")
    channel.queue_declare(queue)
    for n in range(count):
        channel.basic_publish("", queue, b"%06d" % n + b"x" * (size - 6))
    slow = RawConsumer(amqp_server.amqp, queue)
    try:
        left, previous = ready(channel, queue), None
        while left != previous:  # the broker sends until the socket and its buffer are full
            previous = left
            connection.process_data_events(0.5)
            left = ready(channel, queue)
        # unthrottled, the broker would pop every message and buffer 32 MB for this client
        assert left >= count // 2, f"only {left} of {count} messages still wait in the queue"
        assert slow.deliveries(count) == list(range(1, count + 1))
        assert ready(channel, queue) == 0
    finally:
        slow.sock.close()
        connection.close()


def test_a_client_that_asks_but_does_not_read_is_not_read_either(amqp_server):
    count, size = 2000, 16 << 10
    connection = connect(amqp_server)
    channel = connection.channel()
    channel.confirm_delivery()
    queue = name("gets")
    channel.queue_declare(queue)
    for n in range(count):
        channel.basic_publish("", queue, b"%06d" % n + b"x" * (size - 6))
    slow = RawConsumer(amqp_server.amqp, queue, consume=False)
    try:
        slow.sock.sendall(encode_method(1, Basic.Get(queue=queue, no_ack=True)) * count)
        left, previous = ready(channel, queue), None
        while left != previous:  # the broker answers until the socket and its buffer are full
            previous = left
            connection.process_data_events(0.5)
            left = ready(channel, queue)
        assert left >= count // 2, f"only {left} of {count} messages still wait in the queue"
        got = 0
        while got < count:
            if isinstance(slow.next_frame(), Basic.GetOk):
                got += 1
        assert ready(channel, queue) == 0
    finally:
        slow.sock.close()
        connection.close()
