"""ServerConnection as a state machine (h2 `test_state_machines` style): every channel state ×
every client method agrees with the table in `state_table.py`, and random runs of client
frames, garbage, EOF, time and adapter actions (the closes it finishes included) never raise and
close at most once."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import commands
from pamqp.base import Frame
from pamqp.commands import Basic, Channel, Connection, Queue

from protocols.amqp.connection import Options, ServerConnection
from protocols.amqp.events import (ChannelClosed, CloseRequested, ConnectionClosed,
                                   LoginRequested, VhostRequested)
from protocols.amqp.frames import HEARTBEAT_FRAME
from protocols.amqp.state_table import CHANNEL_TRANSITIONS, ChannelState, State, refusal
from tests.unit.amqp.client import close_of, decode, events, feed, handshake, method, opened, publish

CLIENT_SENDABLE = sorted((cls for cls in commands.INDEX_MAPPING.values()
                          if cls.__module__ == "pamqp.commands"
                          and not cls.name.startswith("Connection.")),
                         key=lambda cls: cls.name)
"""Every channel-level method pamqp knows, sent by the client in turn."""
pytestmark = pytest.mark.filterwarnings("ignore:This command is deprecated:DeprecationWarning")


_FILL = {"shortstr": "x", "longstr": "", "table": {}, "bit": False}


def _sample(cls: type[Frame]) -> Frame:
    """An instance that marshals: pamqp's defaults, fields without one filled in by type."""
    sample = cls()
    for name in cls.__slots__:
        if getattr(sample, name) is None:
            setattr(sample, name, _FILL.get(cls.amqp_type(name), 1))
    return sample


@pytest.mark.parametrize("cls", CLIENT_SENDABLE, ids=lambda cls: cls.name)
@pytest.mark.parametrize("state", [ChannelState.CLOSED, ChannelState.OPEN, ChannelState.CLOSING,
                                   ChannelState.CLOSE_RECEIVED])
def test_every_channel_state_and_method_agrees_with_the_table(state: ChannelState,
                                                              cls: type[Frame]) -> None:
    conn = opened(channels=() if state is ChannelState.CLOSED else (1,))
    if state is ChannelState.CLOSING:
        conn.close_channel(1, 406, "x")
        conn.data_to_send()
    elif state is ChannelState.CLOSE_RECEIVED:
        feed(conn, method(1, Channel.Close(200, "bye", 0, 0)))
    feed(conn, method(1, _sample(cls)))
    after = CHANNEL_TRANSITIONS.get((state, cls))
    if after is not None:
        assert conn.state is State.OPEN and conn.channel_state(1) is after
    elif (code := refusal(state, cls)) is None:
        assert conn.state is State.OPEN and conn.data_to_send() == b""
    else:
        assert close_of(conn.data_to_send()) == (0, code)


# ----------------------------------------------------------------------------- random runs

_METHODS = [Channel.Open(), Channel.Close(200, "", 0, 0), Channel.CloseOk(), Channel.Flow(False),
            Queue.Declare(queue="q"), Basic.Ack(1), Basic.Deliver("c", 1, False, "x", "k"),
            Connection.Close(200, "", 0, 0), Connection.CloseOk(), Connection.TuneOk(8, 4096, 5)]


def _frames() -> st.SearchStrategy[bytes]:
    channel = st.integers(0, 3)
    return st.one_of(
        st.builds(lambda c, m: method(c, m), channel, st.sampled_from(_METHODS)),
        st.builds(lambda c, n: publish(c, b"b" * n), channel, st.integers(0, 9000)),
        st.just(HEARTBEAT_FRAME),
        st.binary(min_size=1, max_size=12),
    )


def steps() -> st.SearchStrategy[list[tuple[str, Any]]]:
    step = st.one_of(
        _frames().map(lambda data: ("bytes", data)),
        st.tuples(st.just("tick"), st.floats(0, 20)),
        st.tuples(st.just("send"), st.integers(1, 3)),
        st.tuples(st.just("close_channel"), st.integers(1, 3)),
        st.just(("close", None)), st.just(("block", None)), st.just(("eof", None)),
        st.just(("finish", None)),
    )
    return st.lists(step, max_size=30)


class Driver:
    """Plays the adapter: accepts the login and the vhost, finishes the client's closes when
    told to (as if what came before were carried out), checks every output decodes."""

    def __init__(self, one_byte: bool, refuse: bool) -> None:
        self.conn = ServerConnection(Options(frame_max=4096, channel_max=8, heartbeat=5,
                                             max_message_size=8000))
        self.one_byte, self.refuse = one_byte, refuse
        self.now = 0.0
        self.closed = 0
        self.closing: list[ChannelClosed | CloseRequested] = []
        """The client's closes reported and not finished yet, in order."""

    def feed(self, data: bytes) -> None:
        for chunk in [data[i:i + 1] for i in range(len(data))] if self.one_byte else [data]:
            self.conn.receive_data(chunk, self.now)
            self.drain()

    def drain(self) -> None:
        while (e := self.conn.next_event()) is not None:
            assert self.closed == 0, f"event {e} after ConnectionClosed"
            if isinstance(e, ConnectionClosed):
                self.closed += 1
                assert isinstance(e.reply_code, int)
            elif isinstance(e, LoginRequested):
                self.conn.refuse_login() if self.refuse else self.conn.accept_login()
            elif isinstance(e, VhostRequested):
                self.conn.open_vhost()
            elif isinstance(e, (ChannelClosed, CloseRequested)):
                self.closing.append(e)
        decode(self.conn.data_to_send())  # whatever the server writes, a client can read

    def step(self, kind: str, arg: Any) -> None:
        conn = self.conn
        if kind == "bytes":
            self.feed(arg)
        elif kind == "eof":
            self.feed(b"")
        elif kind == "tick":
            self.now += arg
            conn.check_timeouts(self.now)
        elif kind == "send":
            conn.send_content(arg, Basic.Deliver("c", 1, False, "x", "k"), Basic.Properties(),
                              b"d" * 5000)
        elif kind == "close_channel" and conn.can_send(arg):
            conn.close_channel(arg, 404, "NOT_FOUND - gone")
        elif kind == "close" and conn.state not in (State.CLOSING, State.CLOSED):
            conn.close_connection(320, "shutdown")
        elif kind == "block":
            conn.block("disk")
        elif kind == "finish":
            self.finish()
        self.drain()

    def finish(self) -> None:
        for close in self.closing:
            if isinstance(close, ChannelClosed):
                self.conn.finish_channel_close(close.channel)
            else:
                self.conn.finish_close()
        self.closing.clear()


@settings(max_examples=300, deadline=None)
@given(st.booleans(), st.booleans(), steps())
def test_random_runs_never_raise_and_close_at_most_once(one_byte: bool, refuse: bool,
                                                        script: list[tuple[str, Any]]) -> None:
    driver = Driver(one_byte, refuse)
    driver.feed(handshake(frame_max=4096, heartbeat=5, channel_max=8)
                + method(1, Channel.Open()))
    for kind, arg in script:
        driver.step(kind, arg)  # any exception, ConnectionStateError included, fails the test
        assert driver.closed == 0 or driver.conn.state is State.CLOSED
    driver.finish()
    driver.drain()
    assert driver.closed <= 1
    assert driver.conn.state is not State.CLOSE_RECEIVED  # finishing a client's close ends it


def test_the_random_runs_reach_an_open_channel() -> None:
    """The driver's opening really opens channel 1 (so the runs exercise channels)."""
    driver = Driver(False, False)
    driver.feed(handshake(frame_max=4096, heartbeat=5, channel_max=8) + method(1, Channel.Open()))
    assert driver.conn.channel_state(1) is ChannelState.OPEN and driver.closed == 0
    assert events(driver.conn) == []
