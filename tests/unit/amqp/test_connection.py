"""ServerConnection driven with plain bytes: the handshake, login, tune, vhosts, heartbeats and
closes, fed whole and one byte at a time; what it writes is decoded with pamqp."""

from __future__ import annotations

import pytest
from pamqp.commands import Channel, Connection

from protocols.amqp.connection import ConnectionStateError, Options, ServerConnection
from protocols.amqp.events import (CloseRequested, ConnectionClosed, LoginRequested,
                                   PublishReceived, VhostRequested)
from protocols.amqp.frames import HEARTBEAT_FRAME, PROTOCOL_HEADER
from protocols.amqp.reason_codes import ReplyCode
from protocols.amqp.state_table import State
from tests.unit.amqp.client import (CAPABILITIES, amqplain_start_ok, close_of, decode, events,
                                    feed, handshake, method, names, opened, plain_start_ok,
                                    publish)

OPTIONS = Options(frame_max=4096, channel_max=16, heartbeat=0)


def only(data: bytes) -> object:
    """The one frame in ``data``, which must be on channel 0."""
    [(channel, value)] = decode(data)
    assert channel == 0
    return value


@pytest.mark.parametrize("one_byte", [False, True])
def test_the_whole_handshake(one_byte: bool) -> None:
    conn = ServerConnection(Options(frame_max=8192, channel_max=32, heartbeat=30))
    got = feed(conn, handshake(frame_max=8192, heartbeat=10, channel_max=32), one_byte=one_byte)
    assert got == [LoginRequested("PLAIN", "guest", "guest",
                                  {"product": "test", "capabilities": CAPABILITIES})]
    start = only(conn.data_to_send())
    caps = start.server_properties["capabilities"]
    assert start.mechanisms == "PLAIN AMQPLAIN" and start.locales == "en_US"
    assert all(caps[name] is True for name in (
        "publisher_confirms", "exchange_exchange_bindings", "basic.nack", "consumer_cancel_notify",
        "connection.blocked", "authentication_failure_close", "per_consumer_qos",
        "direct_reply_to", "consumer_priorities"))
    assert {"product", "version", "platform"} <= set(start.server_properties)
    assert conn.state is State.LOGIN_REQUESTED
    conn.accept_login()
    tune = only(conn.data_to_send())
    assert (tune.channel_max, tune.frame_max, tune.heartbeat) == (32, 8192, 30)
    assert events(conn) == [VhostRequested("/")]
    assert (conn.frame_max, conn.channel_max, conn.heartbeat) == (8192, 32, 10)
    conn.open_vhost()
    assert names(conn.data_to_send()) == ["Connection.OpenOk"] and conn.state is State.OPEN


def test_amqplain_login() -> None:
    conn = ServerConnection(OPTIONS)
    [ev] = feed(conn, PROTOCOL_HEADER + amqplain_start_ok("alice", "sécret"))
    assert ev == LoginRequested("AMQPLAIN", "alice", "sécret", {})


@pytest.mark.parametrize(("start_ok", "code"), [
    (method(0, Connection.StartOk({}, "EXTERNAL", "")), ReplyCode.COMMAND_INVALID),
    (method(0, Connection.StartOk({}, "PLAIN", "no-nulls")), ReplyCode.SYNTAX_ERROR),
    (method(0, Connection.StartOk({}, "AMQPLAIN", "\x01garbage")), ReplyCode.SYNTAX_ERROR),
])
def test_bad_mechanisms_and_responses_close_the_connection(start_ok: bytes, code: int) -> None:
    conn = ServerConnection(OPTIONS)
    assert feed(conn, PROTOCOL_HEADER + start_ok) == []
    assert close_of(conn.data_to_send()) == (0, code) and conn.state is State.CLOSING


def test_refused_login_is_403_then_closed_by_close_ok() -> None:
    conn = ServerConnection(OPTIONS)
    feed(conn, handshake())
    conn.data_to_send()
    conn.refuse_login()
    close = only(conn.data_to_send())
    assert close.reply_code == ReplyCode.ACCESS_REFUSED and "PLAIN" in close.reply_text
    assert feed(conn, method(0, Connection.TuneOk(16, 4096, 0))) == []  # ignored while closing
    [closed] = feed(conn, method(0, Connection.CloseOk()))
    assert closed == ConnectionClosed(ReplyCode.ACCESS_REFUSED, close.reply_text, False)


@pytest.mark.parametrize(("channel_max", "frame_max"), [
    (16, 4095), (16, 8192), (16, 0), (17, 4096), (0, 4096)])
def test_tune_ok_outside_our_offer_is_530(channel_max: int, frame_max: int) -> None:
    conn = ServerConnection(OPTIONS)
    feed(conn, PROTOCOL_HEADER + plain_start_ok())
    conn.accept_login()
    conn.data_to_send()
    feed(conn, method(0, Connection.TuneOk(channel_max, frame_max, 0)))
    assert close_of(conn.data_to_send()) == (0, ReplyCode.NOT_ALLOWED)


def test_tune_ok_may_lower_every_value() -> None:
    conn = ServerConnection(Options(frame_max=65536, channel_max=100, heartbeat=60))
    feed(conn, PROTOCOL_HEADER + plain_start_ok())
    conn.accept_login()
    feed(conn, method(0, Connection.TuneOk(5, 4096, 0)))
    assert (conn.channel_max, conn.frame_max, conn.heartbeat) == (5, 4096, 0)
    assert conn.state is State.AWAITING_OPEN


def test_vhost_refusal_is_530() -> None:
    conn = ServerConnection(OPTIONS)
    feed(conn, handshake(vhost="nope"))
    conn.accept_login()
    assert events(conn) == [VhostRequested("nope")]
    conn.data_to_send()
    conn.refuse_vhost("vhost nope not found")
    assert close_of(conn.data_to_send()) == (0, ReplyCode.NOT_ALLOWED)


@pytest.mark.parametrize("header", [b"AMQP\x00\x01\x00\x00", b"AMQP\x01\x01\x00\x0a",
                                    b"GET / HTTP/1.1\r\n\r\n", b"AMQP\x03\x01\x00\x00"])
def test_a_wrong_protocol_header_gets_ours_and_a_close(header: bytes) -> None:
    conn = ServerConnection(OPTIONS)
    [closed] = feed(conn, header)
    assert isinstance(closed, ConnectionClosed) and conn.state is State.CLOSED
    assert conn.data_to_send() == PROTOCOL_HEADER


def test_frames_wait_for_the_adapter() -> None:
    conn = ServerConnection(OPTIONS)
    assert [type(e) for e in feed(conn, handshake())] == [LoginRequested]
    conn.data_to_send()
    conn.accept_login()
    assert names(conn.data_to_send()) == ["Connection.Tune"]
    assert events(conn) == [VhostRequested("/")]


def test_adapter_misuse_raises() -> None:
    conn = ServerConnection(OPTIONS)
    with pytest.raises(ConnectionStateError):
        conn.accept_login()
    with pytest.raises(ConnectionStateError):
        conn.open_vhost()
    with pytest.raises(ConnectionStateError):
        opened().send_method(0, Connection.Blocked())


# ----------------------------------------------------------------------------- heartbeats


def test_heartbeats_both_ways() -> None:
    conn = ServerConnection(Options(frame_max=4096, channel_max=16, heartbeat=10))
    feed(conn, handshake(heartbeat=10), now=0.0)
    conn.accept_login()
    events(conn)
    conn.open_vhost()
    conn.data_to_send()
    conn.check_timeouts(9.0)
    assert not conn.heartbeat_due(9.0) and conn.data_to_send() == b""
    assert conn.heartbeat_due(10.0)
    conn.check_timeouts(10.0)
    assert conn.data_to_send() == HEARTBEAT_FRAME and not conn.heartbeat_due(15.0)
    assert feed(conn, HEARTBEAT_FRAME, now=15.0) == []
    conn.check_timeouts(34.9)
    assert conn.state is State.OPEN
    conn.check_timeouts(35.0)
    [closed] = events(conn)
    assert closed.reply_code == ReplyCode.CONNECTION_FORCED and "heartbeat" in closed.reply_text


def test_no_heartbeats_when_the_client_turns_them_off() -> None:
    conn = opened(Options(frame_max=4096, channel_max=16, heartbeat=10), heartbeat=0)
    conn.check_timeouts(1000.0)
    assert conn.state is State.OPEN and conn.data_to_send() == b""


def test_a_slow_handshake_times_out() -> None:
    conn = ServerConnection(Options(handshake_timeout=5.0), opened_at=100.0)
    feed(conn, PROTOCOL_HEADER, now=100.0)
    conn.check_timeouts(104.9)
    assert conn.state is State.AWAITING_START_OK
    conn.check_timeouts(105.0)
    assert conn.state is State.CLOSED and events(conn)[-1].reply_text == "handshake timeout"


def test_a_heartbeat_on_a_channel_is_505() -> None:
    conn = opened()
    feed(conn, HEARTBEAT_FRAME[:1] + b"\x00\x01" + HEARTBEAT_FRAME[3:])
    assert close_of(conn.data_to_send()) == (0, ReplyCode.UNEXPECTED_FRAME)


# ----------------------------------------------------------------------------- closing


def test_client_close_is_answered_once_what_came_before_is_carried_out() -> None:
    conn = opened()
    got = feed(conn, publish(1, b"before") + method(0, Connection.Close(200, "bye", 0, 0))
               + publish(1, b"after"))
    assert [type(e) for e in got] == [PublishReceived, CloseRequested]
    assert got[1] == CloseRequested(200, "bye") and conn.state is State.CLOSE_RECEIVED
    assert conn.data_to_send() == b"" and not conn.can_send(1) and conn.accepts(1)
    assert feed(conn, method(1, Channel.Open())) == []  # nothing after the close is read
    conn.finish_close()
    assert events(conn) == [ConnectionClosed(200, "bye", True)]
    assert names(conn.data_to_send()) == ["Connection.CloseOk"] and conn.state is State.CLOSED


def test_client_close_during_the_handshake_is_answered_at_once() -> None:
    conn = ServerConnection(OPTIONS)
    feed(conn, PROTOCOL_HEADER + plain_start_ok())
    conn.accept_login()
    conn.data_to_send()
    assert feed(conn, method(0, Connection.Close(200, "bye", 0, 0))) == [
        ConnectionClosed(200, "bye", True)]
    assert names(conn.data_to_send()) == ["Connection.CloseOk"]


def test_eof_after_a_client_close_ends_the_connection_without_close_ok() -> None:
    conn = opened()
    feed(conn, method(0, Connection.Close(200, "bye", 0, 0)))
    assert feed(conn, b"") == [ConnectionClosed(200, "bye", True)]
    conn.finish_close()  # the adapter carried out what came before: nothing left to answer
    assert conn.data_to_send() == b"" and conn.state is State.CLOSED


def test_a_close_of_ours_after_the_clients_does_nothing() -> None:
    conn = opened()
    feed(conn, method(0, Connection.Close(200, "bye", 0, 0)))
    conn.close_connection(541, "INTERNAL_ERROR - a method read before the close failed")
    assert conn.data_to_send() == b"" and conn.state is State.CLOSE_RECEIVED


def test_our_close_waits_for_close_ok_then_times_out() -> None:
    conn = opened(Options(frame_max=4096, channel_max=16, heartbeat=0, close_timeout=3.0))
    conn.close_connection(320, "shutdown")
    assert close_of(conn.data_to_send()) == (0, 320) and conn.state is State.CLOSING
    assert conn.send_method(1, Channel.Flow()) is False
    conn.check_timeouts(2.9)
    assert conn.state is State.CLOSING
    conn.check_timeouts(3.0)
    assert events(conn) == [ConnectionClosed(320, "shutdown", False)]


def test_close_crossing_ours_is_answered() -> None:
    conn = opened()
    conn.close_connection(320, "shutdown")
    conn.data_to_send()
    assert feed(conn, method(0, Connection.Close(200, "bye", 0, 0))) == [
        ConnectionClosed(320, "shutdown", False)]
    assert names(conn.data_to_send()) == ["Connection.CloseOk"]


def test_eof_closes() -> None:
    conn = opened()
    [closed] = feed(conn, b"")
    assert closed.by_client and conn.state is State.CLOSED


def test_blocked_and_unblocked_go_to_clients_that_understand_them() -> None:
    conn = opened()
    assert conn.block("low on disk") and conn.unblock()
    assert names(conn.data_to_send()) == ["Connection.Blocked", "Connection.Unblocked"]
    plain = ServerConnection(OPTIONS)
    feed(plain, PROTOCOL_HEADER + method(0, Connection.StartOk({}, "PLAIN", "\0u\0p")))
    assert plain.block("low on disk") is False



def test_silence_while_reading_is_paused_is_not_a_missed_heartbeat() -> None:
    conn = opened(Options(frame_max=4096, channel_max=16, heartbeat=10), heartbeat=10)
    conn.reading_paused(True, 0.0)  # a resource alarm: the broker does not read
    conn.check_timeouts(100.0)
    assert conn.state is State.OPEN and conn.data_to_send() == HEARTBEAT_FRAME
    conn.reading_paused(False, 100.0)
    conn.check_timeouts(119.0)
    assert conn.state is State.OPEN, "the silence is counted from the resume on"
    conn.check_timeouts(120.0)
    assert conn.state is State.CLOSED


def test_external_is_taken_only_where_it_is_offered():
    from protocols.amqp.methods import EXTERNAL, MECHANISMS, credentials
    from protocols.amqp.reason_codes import AmqpError

    assert credentials(EXTERNAL, b"", (*MECHANISMS, EXTERNAL)) == ("", "")
    with pytest.raises(AmqpError, match="unknown authentication mechanism 'EXTERNAL'"):
        credentials(EXTERNAL, b"")
    assert credentials("PLAIN", b"\x00u\x00p", (*MECHANISMS, EXTERNAL)) == ("u", "p")
