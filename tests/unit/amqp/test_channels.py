"""Channels of a ServerConnection: open and close both ways, flow, methods passed up, content
assembled across body frames, and soft and hard errors with their reply codes."""

from __future__ import annotations

import pytest
from pamqp import frame
from pamqp.body import ContentBody
from pamqp.commands import Basic, Channel, Confirm, Connection, Queue
from pamqp.header import ContentHeader

from protocols.amqp.connection import ConnectionStateError, Options
from protocols.amqp.events import (ChannelClosed, ChannelOpened, FlowChanged, MethodReceived,
                                   PublishReceived)
from protocols.amqp.frames import encode_method
from protocols.amqp.reason_codes import ReplyCode
from protocols.amqp.state_table import ChannelState, State
from tests.unit.amqp.client import close_of, decode, events, feed, method, names, opened, publish


def test_open_and_client_close() -> None:
    conn = opened(channels=())
    assert feed(conn, method(1, Channel.Open())) == [ChannelOpened(1)]
    assert names(conn.data_to_send()) == ["Channel.OpenOk"]
    assert feed(conn, method(1, Channel.Close(200, "bye", 0, 0))) == [
        ChannelClosed(1, 200, "bye", True)]
    assert conn.channel_state(1) is ChannelState.CLOSE_RECEIVED
    conn.finish_channel_close(1)
    assert names(conn.data_to_send()) == ["Channel.CloseOk"]
    assert conn.channel_state(1) is ChannelState.CLOSED
    assert feed(conn, method(1, Channel.Open())) == [ChannelOpened(1)]  # a number is reusable


def test_a_client_close_is_answered_once_the_adapter_carried_out_what_came_before() -> None:
    """close-ok waits for `finish_channel_close`; the publish read before the close is still
    to be carried out (`accepts`), and nothing the client sends after its close is read."""
    conn = opened(channels=(1, 2))
    got = feed(conn, publish(1, b"before") + method(1, Channel.Close(200, "bye", 0, 0))
               + publish(1, b"after") + publish(2, b"other channel"))
    assert [(type(e), getattr(e, "body", None)) for e in got] == [
        (PublishReceived, b"before"), (ChannelClosed, None), (PublishReceived, b"other channel")]
    assert conn.data_to_send() == b"" and conn.accepts(1) and conn.open_channels == 2
    assert conn.send_method(1, Queue.DeclareOk("q")) is False  # the client discards answers
    conn.finish_channel_close(1)
    assert [(c, f.name) for c, f in decode(conn.data_to_send())] == [(1, "Channel.CloseOk")]
    assert conn.open_channels == 1


def test_our_close_ignores_everything_until_close_ok() -> None:
    conn = opened()
    conn.close_channel(1, ReplyCode.NOT_FOUND, "NOT_FOUND - no queue 'q'", 50, 10)
    [(channel, close)] = decode(conn.data_to_send())
    assert channel == 1 and (close.reply_code, close.class_id, close.method_id) == (404, 50, 10)
    assert not conn.accepts(1)  # what was read on it before the close is discarded too
    assert feed(conn, method(1, Queue.Declare(queue="q")) + publish(1, b"late")) == []
    assert conn.send_method(1, Queue.DeclareOk("q")) is False
    assert feed(conn, method(1, Channel.CloseOk())) == [
        ChannelClosed(1, 404, "NOT_FOUND - no queue 'q'", False)]
    assert conn.data_to_send() == b"" and conn.state is State.OPEN
    assert not conn.accepts(1)  # until the adapter carried out the ChannelClosed
    conn.finish_channel_close(1)
    assert conn.accepts(1) and conn.data_to_send() == b""


def test_a_close_crossing_ours_gets_close_ok() -> None:
    conn = opened()
    conn.close_channel(1, 406, "PRECONDITION_FAILED - x")
    conn.data_to_send()
    assert feed(conn, method(1, Channel.Close(200, "bye", 0, 0))) == []
    assert names(conn.data_to_send()) == ["Channel.CloseOk"]
    assert [type(e) for e in feed(conn, method(1, Channel.CloseOk()))] == [ChannelClosed]


def test_flow() -> None:
    conn = opened()
    assert feed(conn, method(1, Channel.Flow(active=False))) == [FlowChanged(1, False)]
    [(channel, ok)] = decode(conn.data_to_send())
    assert channel == 1 and isinstance(ok, Channel.FlowOk) and ok.active is False


def test_methods_are_passed_up_and_answered() -> None:
    conn = opened(channels=(1, 2))
    [ev] = feed(conn, method(2, Queue.Declare(queue="q", durable=True)))
    assert isinstance(ev, MethodReceived) and ev.channel == 2 and ev.method.queue == "q"
    [ev] = feed(conn, method(1, Confirm.Select()))
    assert isinstance(ev.method, Confirm.Select)
    assert conn.send_method(2, Queue.DeclareOk("q", 0, 0))
    assert decode(conn.data_to_send())[0][0] == 2


@pytest.mark.parametrize("one_byte", [False, True])
def test_content_is_assembled_across_body_frames(one_byte: bool) -> None:
    conn = opened()
    body = bytes(range(256)) * 40
    props = Basic.Properties(content_type="application/json", delivery_mode=2,
                             headers={"h": "v"})
    [ev] = feed(conn, publish(1, body, 4096, properties=props), one_byte=one_byte)
    assert isinstance(ev, PublishReceived) and ev.body == body and ev.channel == 1
    assert ev.method.routing_key == "k" and ev.properties == props
    assert conn.channel_state(1) is ChannelState.OPEN


@pytest.mark.parametrize("one_byte", [False, True])
def test_a_run_of_small_publishes_reads_as_one_publish_after_another(one_byte: bool) -> None:
    """Most publishes arrive whole (publish, header, one body frame) and are read in one step;
    the events are those of reading them frame by frame."""
    conn = opened(channels=(1, 2))
    props = Basic.Properties(delivery_mode=2, message_id="m1", priority=3)
    data = b"".join(publish(channel, bytes([n]) * 1000, properties=props, routing_key=f"k{n}")
                    for n, channel in enumerate((1, 2, 1)))
    evs = feed(conn, data, one_byte=one_byte)
    assert [(e.channel, e.method.routing_key, e.body, e.properties) for e in evs] == [
        (1, "k0", b"\0" * 1000, props), (2, "k1", b"\1" * 1000, props),
        (1, "k2", b"\2" * 1000, props)]
    assert conn.channel_state(1) is conn.channel_state(2) is ChannelState.OPEN


def test_an_empty_body_completes_with_the_header() -> None:
    conn = opened()
    [ev] = feed(conn, publish(1, b""))
    assert isinstance(ev, PublishReceived) and ev.body == b""


def test_publishes_interleave_across_channels() -> None:
    conn = opened(channels=(1, 2))
    one, two = publish(1, b"a" * 5000), publish(2, b"b" * 10)
    method_frame = len(method(1, Basic.Publish(exchange="x", routing_key="k")))
    evs = feed(conn, one[:method_frame] + two + one[method_frame:])
    assert [(e.channel, len(e.body)) for e in evs] == [(2, 10), (1, 5000)]


def test_send_content_splits_by_negotiated_frame_max() -> None:
    conn = opened()
    assert conn.send_content(1, Basic.Deliver("ctag", 1, False, "x", "k"), Basic.Properties(),
                             b"z" * 9000)
    assert [type(v).__name__ for _, v in decode(conn.data_to_send())] == [
        "Deliver", "ContentHeader", "ContentBody", "ContentBody", "ContentBody"]


def test_a_message_above_max_message_size_is_406_on_the_channel() -> None:
    """RabbitMQ 4 refuses it with a channel-level PRECONDITION_FAILED; the header's body size
    is enough to tell, so the body is never buffered."""
    conn = opened(Options(frame_max=4096, channel_max=16, heartbeat=0, max_message_size=100))
    assert feed(conn, publish(1, b"x" * 5000)) == []
    assert close_of(conn.data_to_send()) == (1, ReplyCode.PRECONDITION_FAILED)
    assert conn.state is State.OPEN and conn.channel_state(1) is ChannelState.CLOSING


def test_a_whole_message_above_max_message_size_in_one_body_frame_is_406_too() -> None:
    conn = opened(Options(frame_max=4096, channel_max=16, heartbeat=0, max_message_size=100))
    assert feed(conn, publish(1, b"x" * 101)) == []
    assert close_of(conn.data_to_send()) == (1, ReplyCode.PRECONDITION_FAILED)


@pytest.mark.parametrize(("frames", "code"), [
    (method(1, Channel.Open()), ReplyCode.CHANNEL_ERROR),  # re-opening an open channel
    (method(5, Queue.Declare(queue="q")), ReplyCode.CHANNEL_ERROR),  # never opened
    (publish(5, b"x"), ReplyCode.CHANNEL_ERROR),  # a whole publish on a channel never opened
    (method(1, Basic.Publish()) + b"\x02\x00\x01\x00\x00\x00\x05\x00\x3c\x00\x00\x00\xce",
     ReplyCode.SYNTAX_ERROR),  # a content header too short to decode, nothing after it
    (method(1, Basic.Publish()) + b"\x02\x00\x01\x00\x00\x00\x05\x00\x3c\x00\x00\x00\xce"
     + publish(1, b"x"), ReplyCode.SYNTAX_ERROR),  # the same, a whole publish after it
    (method(1, Basic.Deliver("c", 1, False, "x", "k")), ReplyCode.COMMAND_INVALID),
    (method(1, Channel.CloseOk()), ReplyCode.COMMAND_INVALID),  # no close of ours pending
    (method(1, Basic.Publish()) + method(1, Queue.Declare(queue="q")),
     ReplyCode.UNEXPECTED_FRAME),
    (encode_method(1, Basic.Publish()) + publish(1, b"x")[-9:], ReplyCode.UNEXPECTED_FRAME),
    (publish(1, b"abc")[-11:], ReplyCode.UNEXPECTED_FRAME),  # a body with no publish
    (method(0, Queue.Declare(queue="q")), ReplyCode.CHANNEL_ERROR),  # a channel method on 0
    (method(0, Connection.Open("/")), ReplyCode.CHANNEL_ERROR),  # second connection.open
])
def test_hard_errors_close_the_connection(frames: bytes, code: int) -> None:
    conn = opened()
    assert feed(conn, frames) == []
    assert close_of(conn.data_to_send()) == (0, code) and conn.state is State.CLOSING
    [closed] = feed(conn, method(0, Connection.CloseOk()))
    assert closed.reply_code == code and not closed.by_client


def test_channel_max_counts_open_channels_as_rabbitmq_does() -> None:
    """A channel numbered above channel_max (16) opens while fewer are open; one more than
    channel_max open is 530 NOT_ALLOWED, the connection closed, in RabbitMQ's words."""
    conn = opened()
    for channel in [*range(2, 16), 300]:
        assert feed(conn, method(channel, Channel.Open())) == [ChannelOpened(channel)]
    conn.data_to_send()
    assert conn.open_channels == 16
    assert feed(conn, method(17, Channel.Open())) == []
    [(channel, close)] = decode(conn.data_to_send())
    assert (channel, close.reply_code, close.reply_text) == (0, 530, (
        "NOT_ALLOWED - number of channels opened (16) has reached the negotiated channel_max "
        "(16)"))


def test_a_body_longer_than_its_header_says_is_505() -> None:
    conn = opened()
    feed(conn, method(1, Basic.Publish()) + frame.marshal(ContentHeader(0, 3), 1)
         + frame.marshal(ContentBody(b"toolong"), 1))
    assert close_of(conn.data_to_send()) == (0, ReplyCode.UNEXPECTED_FRAME)


def test_a_connection_error_discards_what_was_read_on_its_channel_only() -> None:
    conn = opened(channels=(1, 2))
    conn.close_connection(530, "NOT_ALLOWED - attempt to reuse consumer tag 'c'", 60, 20,
                          channel=1)
    assert close_of(conn.data_to_send()) == (0, 530)
    assert not conn.accepts(1) and conn.accepts(2)
    conn.close_connection(541, "INTERNAL_ERROR - a second error")  # closing already: nothing
    assert conn.data_to_send() == b"" and conn.state is State.CLOSING


def test_adapter_may_not_close_a_channel_that_is_not_open() -> None:
    conn = opened()
    with pytest.raises(ConnectionStateError):
        conn.close_channel(9, 404, "x")
    with pytest.raises(ValueError):
        conn.close_channel(1, 504, "a hard error")
    assert events(conn) == []
