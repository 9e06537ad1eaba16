"""The server-side MQTT connection state machine as one table (h11 `_state.py` style).

    CONNECTING --CONNECT--> CONNECT_RECEIVED --accept--> CONNECTED --DISCONNECT--> CLOSED
                                  |                        |  ^
                                  +--refuse--> CLOSED      +--+ PUBLISH, PUB*, (UN)SUBSCRIBE,
                                                                PINGREQ, and our own sends

Inputs are client packet types (`PacketType`) and the adapter's actions (`Action`). A pair
missing from `TRANSITIONS` is a protocol error when the client caused it (a second CONNECT,
CONNACK/SUBACK/PINGRESP from a client, AUTH, which Sluice does not support) and a
`ConnectionStateError` when the adapter did. Errors, keepalive timeouts and EOF close from any
state; that needs no table entry.
"""

from __future__ import annotations

from enum import Enum, auto

from .reason_codes import PacketType as P


class State(Enum):
    """Where the connection is."""

    __hash__ = object.__hash__  # members are singletons; Enum's own hash runs Python code

    CONNECTING = auto()
    """Waiting for CONNECT, the only packet allowed first."""
    CONNECT_RECEIVED = auto()
    """CONNECT reported; the adapter has not answered yet, so later bytes stay buffered."""
    CONNECTED = auto()
    """CONNACK sent with success."""
    CLOSED = auto()
    """Nothing more is read or sent."""


class Action(Enum):
    """What the adapter can do to the connection."""

    __hash__ = object.__hash__

    ACCEPT = auto()
    REFUSE = auto()
    SEND = auto()
    """publish: a message of our own."""
    ANSWER = auto()
    """ack_subscribe, ack_unsubscribe, release, complete: answers to client packets. Also
    allowed once CLOSED, where they send nothing: a packet read just before the connection
    closed may still be answered by the adapter."""
    ACK_PUBLISH = auto()
    """ack_publish. Also allowed once CLOSED: a message stored after the client went away is
    still acknowledged in the session's in-flight state, so QoS 2 stays exactly once."""
    DISCONNECT = auto()


S = State
_IN_SESSION = (P.PUBLISH, P.PUBACK, P.PUBREC, P.PUBREL, P.PUBCOMP, P.SUBSCRIBE, P.UNSUBSCRIBE,
               P.PINGREQ)

TRANSITIONS: dict[tuple[State, P | Action], State] = {
    (S.CONNECTING, P.CONNECT): S.CONNECT_RECEIVED,
    (S.CONNECT_RECEIVED, Action.ACCEPT): S.CONNECTED,
    (S.CONNECT_RECEIVED, Action.REFUSE): S.CLOSED,
    **{(S.CONNECTED, packet): S.CONNECTED for packet in _IN_SESSION},
    (S.CONNECTED, P.DISCONNECT): S.CLOSED,
    (S.CONNECTED, Action.SEND): S.CONNECTED,
    (S.CONNECTED, Action.ANSWER): S.CONNECTED,
    (S.CLOSED, Action.ANSWER): S.CLOSED,
    (S.CONNECTED, Action.ACK_PUBLISH): S.CONNECTED,
    (S.CLOSED, Action.ACK_PUBLISH): S.CLOSED,
    **{(state, Action.DISCONNECT): S.CLOSED for state in State},
}
"""(state, input) -> next state. Closing on an error is not listed: it is allowed anywhere."""
