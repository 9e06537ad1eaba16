"""Valid AMQP 0-9-1 client streams for the live fuzzer to mutate: a pipelined handshake (header,
start-ok as guest, tune-ok, open) and the frames a logged-in client sends on a channel, built
with pamqp through the adapter's own frame encoders."""
from __future__ import annotations

from pamqp.commands import Basic, Channel, Confirm, Connection, Exchange, Queue, Tx

from protocols.amqp.frames import HEARTBEAT_FRAME, PROTOCOL_HEADER, encode_content, encode_method

CAPABILITIES = {"connection.blocked": True, "consumer_cancel_notify": True,
                "publisher_confirms": True, "basic.nack": True}


def handshake(user: str = "guest", password: str = "guest", vhost: str = "/") -> bytes:
    """Everything a client sends up to connection.open, pipelined."""
    return (PROTOCOL_HEADER
            + encode_method(0, Connection.StartOk({"product": "fuzz",
                                                   "capabilities": CAPABILITIES},
                                                  "PLAIN", f"\0{user}\0{password}"))
            + encode_method(0, Connection.TuneOk(2047, 131_072, 0))
            + encode_method(0, Connection.Open(vhost)))


def session_frames(name: str = "fuzz") -> list[bytes]:
    """One frame (or publish) of each kind a client sends on channel 1 once connected; the
    first opens the channel."""
    properties = Basic.Properties(content_type="text/plain", delivery_mode=2,
                                  headers={"k": "v", "n": 1, "t": {"a": [1, "b"]}},
                                  priority=3, expiration="60000", message_id="m1")
    return [
        encode_method(1, Channel.Open()),
        encode_method(1, Exchange.Declare(exchange=name, exchange_type="topic")),
        encode_method(1, Queue.Declare(queue=name, arguments={"x-max-length": 100})),
        encode_method(1, Queue.Bind(queue=name, exchange=name, routing_key="a.*")),
        encode_method(1, Confirm.Select()),
        encode_content(1, Basic.Publish(exchange=name, routing_key="a.b", mandatory=True),
                       properties, b"payload", 131_072),
        encode_content(1, Basic.Publish(exchange="", routing_key=name), Basic.Properties(),
                       b"x" * 5000, 4096),
        encode_method(1, Basic.Qos(prefetch_count=10)),
        encode_method(1, Basic.Consume(queue=name, consumer_tag="c1")),
        encode_method(1, Basic.Get(queue=name)),
        encode_method(1, Basic.Ack(delivery_tag=1, multiple=True)),
        encode_method(1, Basic.Nack(delivery_tag=2, requeue=True)),
        encode_method(1, Basic.Reject(delivery_tag=3)),
        encode_method(1, Basic.Recover(requeue=True)),
        encode_method(1, Channel.Flow(active=False)),
        encode_method(1, Channel.Flow(active=True)),
        encode_method(1, Tx.Select()),
        encode_method(1, Tx.Commit()),
        encode_method(1, Tx.Rollback()),
        encode_method(1, Basic.Cancel(consumer_tag="c1")),
        encode_method(1, Queue.Unbind(queue=name, exchange=name, routing_key="a.*")),
        HEARTBEAT_FRAME,
        encode_method(1, Channel.Close(200, "bye", 0, 0)),
        encode_method(0, Connection.Close(200, "bye", 0, 0)),
    ]
