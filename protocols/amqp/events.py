"""What an AMQP `ServerConnection` reports to its adapter: one frozen dataclass per thing the
client did. The adapter reads them with `ServerConnection.next_event()` and answers through the
connection's methods (`accept_login`, `open_vhost`, `send_method`, ...). Methods and properties
are pamqp objects: the adapter maps them onto core, the connection only checks their order."""

from __future__ import annotations

from dataclasses import dataclass, field

from pamqp import common
from pamqp.base import Frame
from pamqp.commands import Basic


@dataclass(frozen=True)
class LoginRequested:
    """start-ok with credentials; answer `accept_login()` or `refuse_login(reason)`. Nothing
    after it is read until then."""

    mechanism: str
    user: str
    password: str = field(repr=False)
    client_properties: common.FieldTable = field(default_factory=dict)


@dataclass(frozen=True)
class VhostRequested:
    """connection.open; answer `open_vhost()` or `refuse_vhost(reason)`."""

    vhost: str


@dataclass(frozen=True)
class ChannelOpened:
    """channel.open, already answered with open-ok."""

    channel: int


@dataclass(frozen=True)
class ChannelClosed:
    """A channel is closing: the client closed it (``by_client``) or confirmed the close we
    sent (`close_channel`). Carry out what was read before it, release its consumers and
    unacked deliveries, then call `finish_channel_close`: that answers the client's close with
    close-ok, and ends the discarding of what was read on a channel we closed."""

    channel: int
    reply_code: int
    reply_text: str
    by_client: bool


@dataclass(frozen=True)
class FlowChanged:
    """channel.flow, already answered: stop (``active`` False) or resume deliveries."""

    channel: int
    active: bool


@dataclass(frozen=True)
class MethodReceived:
    """Any other method the client may send on an open channel (declares, binds, consume,
    ack, qos, tx, confirm.select, ...); the adapter answers with `send_method`."""

    channel: int
    method: Frame


@dataclass(frozen=True)
class PublishReceived:
    """basic.publish with its content assembled from the header and body frames."""

    channel: int
    method: Basic.Publish
    properties: Basic.Properties
    body: bytes = field(repr=False)


@dataclass(frozen=True)
class CloseRequested:
    """connection.close from the client: carry out what was read before it (publishes stored),
    then call `finish_close`, which sends close-ok; `ConnectionClosed` follows. Nothing after
    it is read."""

    reply_code: int
    reply_text: str


@dataclass(frozen=True)
class ConnectionClosed:
    """The connection is over on the wire: write out `data_to_send()` and close the socket.
    ``by_client`` is True when the client closed it (connection.close, EOF). What was read
    before it and not carried out yet still is, as after `CloseRequested`."""

    reply_code: int
    reply_text: str
    by_client: bool


Event = (LoginRequested | VhostRequested | ChannelOpened | ChannelClosed | FlowChanged
         | MethodReceived | PublishReceived | CloseRequested | ConnectionClosed)
"""Anything `ServerConnection.next_event()` returns."""
