"""ServerConnection as a state machine (h2 `test_state_machines` style): every state × every
client packet agrees with the table in `state_table.py`, and random interleavings of client packets,
garbage, EOF, time and adapter actions never raise and close at most once."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocols.mqtt.codec import Decoder, encode
from protocols.mqtt.connection import FlowControlFull, ServerConnection
from protocols.mqtt.events import ConnectionClosed, ConnectRequested, MessagePublished
from protocols.mqtt.packets import (Auth, ConnAck, Connect, Disconnect, PingReq, PingResp, PubAck,
                                    PubComp, Publish, PubRec, PubRel, SubAck, Subscribe,
                                    Subscription, UnsubAck, Unsubscribe)
from protocols.mqtt.properties import Properties
from protocols.mqtt.reason_codes import ReasonCode
from protocols.mqtt.state_table import TRANSITIONS, State

SAMPLES = [Connect("x"), ConnAck(), Publish("t", b"p", 1, packet_id=1), PubAck(1), PubRec(1),
           PubRel(1), PubComp(1), Subscribe(1, (Subscription("a"),)), SubAck(1, (0,)),
           Unsubscribe(1, ("a",)), UnsubAck(1), PingReq(), PingResp(), Disconnect(), Auth()]


def _in_state(state: State, version: int) -> ServerConnection:
    conn = ServerConnection()
    if state is not State.CONNECTING:
        conn.receive_data(encode(Connect("c"), version), 0.0)
    if state is State.CONNECTED:
        conn.accept()
    while conn.next_event() is not None:
        pass
    return conn


VERSION_PACKETS = [(version, packet) for version in (4, 5) for packet in SAMPLES
                   if not (version == 4 and isinstance(packet, Auth))]  # AUTH is MQTT 5 only


@pytest.mark.parametrize("state", [State.CONNECTING, State.CONNECTED])
@pytest.mark.parametrize("version, packet", VERSION_PACKETS,
                         ids=lambda p: type(p).__name__ if not isinstance(p, int) else f"v{p}")
def test_every_state_and_packet_agrees_with_the_table(version: int, state: State,
                                                      packet: Any) -> None:
    conn = _in_state(state, version)
    conn.receive_data(encode(packet, version), 1.0)
    evs = []
    while (e := conn.next_event()) is not None:
        evs.append(e)
    if (state, packet.type) in TRANSITIONS:
        assert ConnectionClosed(ReasonCode.ProtocolError, True) not in evs
        assert conn.state is TRANSITIONS[state, packet.type]
    else:
        assert evs == [ConnectionClosed(ReasonCode.ProtocolError, True)]
        assert conn.state is State.CLOSED


def test_nothing_is_read_while_connect_is_unanswered() -> None:
    for packet in SAMPLES:
        conn = _in_state(State.CONNECT_RECEIVED, 5)
        conn.receive_data(encode(packet, 5), 1.0)
        assert conn.next_event() is None and conn.state is State.CONNECT_RECEIVED


# ----------------------------------------------------------------------------- random runs

pids = st.integers(1, 4)
qos = st.integers(0, 2)
reasons = st.sampled_from([ReasonCode.Success, ReasonCode.QuotaExceeded])


def client_packets(version: int) -> st.SearchStrategy[Any]:
    alias = (st.none() | st.integers(1, 20)) if version == 5 else st.none()
    publish = st.builds(
        lambda topic, q, pid, dup, a: Publish(topic if topic or a else "t", b"x", q, False,
                                              dup and q > 0, pid if q else None,
                                              Properties(topic_alias=a)),
        st.sampled_from(["", "a", "b/c"]), qos, pids, st.booleans(), alias)
    acks = st.builds(lambda cls, pid, r: cls(pid, r if version == 5 else ReasonCode.Success),
                     st.sampled_from([PubAck, PubRec, PubRel, PubComp]), pids, reasons)
    fixed = [Connect("again"), ConnAck(), SubAck(1, (0,)), PingReq(), PingResp(),
             Subscribe(2, (Subscription("a/#", 1),)), Unsubscribe(3, ("a/#",)),
             Disconnect(), *([Auth(), Disconnect(ReasonCode.DisconnectWithWillMessage)]
                             if version == 5 else [])]
    return st.one_of(publish, acks.filter(_valid_ack), st.sampled_from(fixed))


def _valid_ack(p: Any) -> bool:
    # PUBREL/PUBCOMP only carry 0x00 or 0x92.
    return p.reason_code == 0 or isinstance(p, (PubAck, PubRec))


def steps(version: int) -> st.SearchStrategy[list[tuple[str, Any]]]:
    step = st.one_of(
        client_packets(version).map(lambda p: ("packet", p)),
        st.tuples(st.just("garbage"), st.binary(min_size=1, max_size=6)),
        st.tuples(st.just("tick"), st.floats(0, 30)),
        st.tuples(st.just("publish"), qos),
        st.tuples(st.just("ack"), reasons),
        st.just(("refuse", None)), st.just(("disconnect", None)), st.just(("eof", None)),
    )
    return st.lists(step, max_size=40)


@st.composite
def runs(draw: st.DrawFn) -> tuple[int, bool, list[tuple[str, Any]]]:
    version = draw(st.sampled_from([4, 5]))
    return version, draw(st.booleans()), draw(steps(version))


class Driver:
    """Plays the adapter: accepts CONNECT, remembers what needs acking, checks every output."""

    def __init__(self, version: int, one_byte: bool) -> None:
        self.conn = ServerConnection(receive_maximum=3, topic_alias_maximum=8)
        self.version, self.one_byte = version, one_byte
        self.now = 0.0
        self.closed = 0
        self.to_ack: list[int] = []
        self.client = Decoder(version)

    def feed(self, data: bytes) -> None:
        chunks = [data[i:i + 1] for i in range(len(data))] if self.one_byte else [data]
        for chunk in chunks:
            self.conn.receive_data(chunk, self.now)
            self.drain()

    def drain(self) -> None:
        while (e := self.conn.next_event()) is not None:
            assert self.closed == 0, f"event {e} after ConnectionClosed"
            if isinstance(e, ConnectionClosed):
                self.closed += 1
            elif isinstance(e, ConnectRequested):
                self.write(self.conn.accept())
            elif isinstance(e, MessagePublished) and e.packet_id is not None:
                self.to_ack.append(e.packet_id)
        self.write(self.conn.data_to_send())

    def write(self, data: bytes) -> None:
        """Whatever the server writes must be valid MQTT a client can decode."""
        self.client.feed(data)
        while self.client.next_packet() is not None:
            pass

    def step(self, kind: str, arg: Any) -> None:
        conn, connected = self.conn, self.conn.state is State.CONNECTED
        if kind == "packet":
            self.feed(encode(arg, self.version))
        elif kind == "garbage":
            self.feed(arg)
        elif kind == "eof":
            self.feed(b"")
        elif kind == "tick":
            self.now += arg
            conn.check_timeouts(self.now)
            self.drain()
        elif kind == "publish" and connected:
            try:
                self.write(conn.publish(f"out/{self.now}", b"m", arg)[1])
            except FlowControlFull:
                assert conn.send_quota == 0
        elif kind == "ack" and conn.state in (State.CONNECTED, State.CLOSED) and self.to_ack:
            self.write(conn.ack_publish(self.to_ack.pop(0), arg))
        elif kind == "refuse" and conn.state is State.CONNECT_RECEIVED:
            self.write(conn.refuse(ReasonCode.NotAuthorized))
        elif kind == "disconnect":
            self.write(conn.disconnect(ReasonCode.ServerShuttingDown))
        self.drain()


@settings(max_examples=300, deadline=None)
@given(runs())
def test_random_runs_never_raise_and_close_at_most_once(run: tuple[int, bool, list[Any]]) -> None:
    version, one_byte, script = run
    driver = Driver(version, one_byte)
    props = Properties(topic_alias_maximum=2, receive_maximum=2) if version == 5 else Properties()
    driver.feed(encode(Connect("c", keep_alive=10, properties=props), version))
    for kind, arg in script:
        driver.step(kind, arg)  # any exception, ConnectionStateError included, fails the test
        assert driver.closed == 0 or driver.conn.state is State.CLOSED
    assert driver.closed <= 1
