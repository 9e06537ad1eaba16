"""The AMQP 0-9-1 connection and channel state machines as tables (h11 `_state.py` style).

Connection (channel 0):

    AWAITING_HEADER --header--> AWAITING_START_OK --start-ok--> LOGIN_REQUESTED
        --accept_login--> AWAITING_TUNE_OK --tune-ok--> AWAITING_OPEN --open--> VHOST_REQUESTED
        --open_vhost--> OPEN --close--> CLOSE_RECEIVED --finish_close--> CLOSED
    (any state before OPEN) --close--> CLOSED     (any state) --our close--> CLOSING
                                                  CLOSING --close-ok / close--> CLOSED

Channel (every other number; an unopened one is CLOSED):

    CLOSED --channel.open--> OPEN --basic.publish--> AWAITING_HEADER --header--> AWAITING_BODY
    AWAITING_BODY --body--> AWAITING_BODY --content done--> OPEN
    OPEN --channel.close--> CLOSE_RECEIVED --finish_close--> CLOSED
    (any open state) --our close--> CLOSING --close-ok--> CLOSED

A close from the client is answered (close-ok) only once the adapter has carried out what was
read before it (`Action.FINISH_CLOSE`), as RabbitMQ answers only after the channel processes
have worked through their mailboxes: a publish sent just before a close is never lost.

Inputs are pamqp frame classes and the adapter's `Action`s. A pair missing from a table is the
client's error, answered with the code `refusal` gives (the codes RabbitMQ answers with), except
in CLOSING, which ignores everything but close and close-ok (spec 4.2.2 / channel.close), and in
CLOSE_RECEIVED, which ignores everything: the client may send nothing after its close.
"""

from __future__ import annotations

from enum import Enum, auto
from typing import Final

from pamqp.body import ContentBody
from pamqp.commands import Basic, Channel, Confirm, Connection, Exchange, Queue, Tx
from pamqp.header import ContentHeader, ProtocolHeader

from .reason_codes import ReplyCode


class State(Enum):
    """Where the connection is."""

    AWAITING_HEADER = auto()
    AWAITING_START_OK = auto()
    LOGIN_REQUESTED = auto()
    """start-ok reported; later bytes stay buffered until the adapter answers."""
    AWAITING_TUNE_OK = auto()
    AWAITING_OPEN = auto()
    VHOST_REQUESTED = auto()
    """connection.open reported; later bytes stay buffered until the adapter answers."""
    OPEN = auto()
    CLOSE_RECEIVED = auto()
    """The client sent connection.close; close-ok goes out once what it sent before is carried
    out (`Action.FINISH_CLOSE`)."""
    CLOSING = auto()
    """We sent connection.close and wait for close-ok."""
    CLOSED = auto()


class ChannelState(Enum):
    """Where one channel is."""

    CLOSED = auto()
    OPEN = auto()
    AWAITING_HEADER = auto()
    """basic.publish read; its content header comes next."""
    AWAITING_BODY = auto()
    CLOSE_RECEIVED = auto()
    """The client sent channel.close; close-ok goes out once what it sent before is carried
    out (`Action.FINISH_CLOSE`)."""
    CLOSING = auto()
    """We sent channel.close and wait for close-ok."""


class Action(Enum):
    """What the adapter (or the connection on its behalf) does."""

    ACCEPT_LOGIN = auto()
    OPEN_VHOST = auto()
    CLOSE = auto()
    """close_connection / close_channel: we send a close and wait for close-ok."""
    CONTENT_DONE = auto()
    """The last body frame of a publish arrived."""
    FINISH_CLOSE = auto()
    """What the client sent before its close is carried out: close-ok goes out."""


S, C = State, ChannelState
_HANDSHAKING = (S.AWAITING_START_OK, S.LOGIN_REQUESTED, S.AWAITING_TUNE_OK, S.AWAITING_OPEN,
                S.VHOST_REQUESTED)
_CLOSABLE = (*_HANDSHAKING, S.OPEN)

TRANSITIONS: Final[dict[tuple[State, type | Action], State]] = {
    (S.AWAITING_HEADER, ProtocolHeader): S.AWAITING_START_OK,
    (S.AWAITING_START_OK, Connection.StartOk): S.LOGIN_REQUESTED,
    (S.LOGIN_REQUESTED, Action.ACCEPT_LOGIN): S.AWAITING_TUNE_OK,
    (S.AWAITING_TUNE_OK, Connection.TuneOk): S.AWAITING_OPEN,
    (S.AWAITING_OPEN, Connection.Open): S.VHOST_REQUESTED,
    (S.VHOST_REQUESTED, Action.OPEN_VHOST): S.OPEN,
    **{(state, Connection.Close): S.CLOSED for state in _HANDSHAKING},
    (S.OPEN, Connection.Close): S.CLOSE_RECEIVED,
    (S.CLOSE_RECEIVED, Action.FINISH_CLOSE): S.CLOSED,
    **{(state, Action.CLOSE): S.CLOSING for state in _CLOSABLE},
    (S.CLOSING, Connection.Close): S.CLOSED,
    (S.CLOSING, Connection.CloseOk): S.CLOSED,
}
"""(connection state, channel-0 input) -> next state."""

CLIENT_METHODS: Final = (
    Exchange.Declare, Exchange.Delete, Exchange.Bind, Exchange.Unbind,
    Queue.Declare, Queue.Bind, Queue.Purge, Queue.Delete, Queue.Unbind,
    Basic.Qos, Basic.Consume, Basic.Cancel, Basic.Get, Basic.Ack, Basic.Reject,
    Basic.RecoverAsync, Basic.Recover, Basic.Nack,
    Tx.Select, Tx.Commit, Tx.Rollback, Confirm.Select,
)
"""Methods a client may send on an open channel that the adapter answers (MethodReceived)."""
_SENDING = (C.OPEN, C.AWAITING_HEADER, C.AWAITING_BODY)

CHANNEL_TRANSITIONS: Final[dict[tuple[ChannelState, type | Action], ChannelState]] = {
    (C.CLOSED, Channel.Open): C.OPEN,
    (C.OPEN, Channel.Close): C.CLOSE_RECEIVED,
    (C.CLOSE_RECEIVED, Action.FINISH_CLOSE): C.CLOSED,
    (C.OPEN, Channel.Flow): C.OPEN,
    **{(C.OPEN, method): C.OPEN for method in CLIENT_METHODS},
    (C.OPEN, Basic.Publish): C.AWAITING_HEADER,
    (C.AWAITING_HEADER, ContentHeader): C.AWAITING_BODY,
    (C.AWAITING_BODY, ContentBody): C.AWAITING_BODY,
    (C.AWAITING_BODY, Action.CONTENT_DONE): C.OPEN,
    **{(state, Action.CLOSE): C.CLOSING for state in _SENDING},
    (C.CLOSING, Channel.Close): C.CLOSING,
    (C.CLOSING, Channel.CloseOk): C.CLOSED,
}
"""(channel state, input on that channel) -> next state."""

SENDING_STATES: Final = frozenset(_SENDING)
"""Channel states in which the adapter may send methods and content."""


def refusal(state: ChannelState, received: type) -> ReplyCode | None:
    """The reply code for an input the channel table does not allow (None: ignore it)."""
    if state in (C.CLOSING, C.CLOSE_RECEIVED):
        return None
    if state is C.CLOSED or received is Channel.Open:
        return ReplyCode.CHANNEL_ERROR  # "expected 'channel.open'", "second 'channel.open'"
    if state is not C.OPEN or received in (ContentHeader, ContentBody):
        return ReplyCode.UNEXPECTED_FRAME  # content where a method belongs, or the reverse
    return ReplyCode.COMMAND_INVALID  # a server-only method, or one never sent to us
