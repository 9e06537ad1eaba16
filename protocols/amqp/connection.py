"""Sans-IO server side of one AMQP 0-9-1 connection: bytes in, events out (h11 style).

The adapter owns the socket and the clock. Per read it calls `receive_data(data, now)` (`b""`
means EOF), then `next_event()` until None, then writes `data_to_send()`. Its decisions are
methods (`accept_login`, `open_vhost`, `send_method`, `close_channel`, ...) whose bytes also
go to `data_to_send()`. A timer calls `check_timeouts(now)`: the handshake timeout, heartbeats
both ways, and the wait for close-ok. The handshake (header, start, tune, open), channel
open/flow, content assembly and heartbeats are answered here; everything else is an event.

A close from the client (channel or connection) is answered only when the adapter says that
what was read before it is carried out (`finish_channel_close`, `finish_close`). What was read
on a channel the broker closed with an error is discarded until the client's close-ok is carried
out (`accepts`), as the spec and RabbitMQ do. Nothing here imports asyncio or core. Not
thread-safe: one task drives one connection.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from pamqp.base import Frame
from pamqp.body import ContentBody
from pamqp.commands import Basic, Channel, Connection
from pamqp.header import ContentHeader, ProtocolHeader
from pamqp.heartbeat import Heartbeat

from .codec import Decoder
from .events import (ChannelClosed, ChannelOpened, CloseRequested, ConnectionClosed, Event,
                     FlowChanged, LoginRequested, MethodReceived, PublishReceived, VhostRequested)
from .frames import (FRAME_MIN_SIZE, HEARTBEAT_FRAME, PROTOCOL_HEADER, encode_content,
                     encode_delivery, encode_method)
from .methods import MECHANISMS, credentials, ids, start
from .reason_codes import AmqpError, BadProtocolHeader, FrameError, ReplyCode
from .state_table import (CHANNEL_TRANSITIONS, SENDING_STATES, TRANSITIONS, Action,
                          ChannelState, State, refusal)

__all__ = ["ConnectionStateError", "Options", "ServerConnection"]

MISSED_HEARTBEATS: Final = 2
"""The client is gone after this many heartbeat intervals of silence."""
MAX_TEXT: Final = 255
"""A reply text is a short string."""


class ConnectionStateError(RuntimeError):
    """The adapter called a method the current state does not allow (a bug in the adapter)."""


@dataclass(frozen=True)
class Options:
    """What the server offers in connection.tune and the limits it holds clients to."""

    channel_max: int = 2047
    frame_max: int = 131_072
    heartbeat: int = 60
    """Seconds; 0 turns heartbeats off unless the client asks for them."""
    max_message_size: int = 16 * 1024 * 1024
    """A larger publish is refused with 406 PRECONDITION_FAILED (RabbitMQ 4's default)."""
    handshake_timeout: float = 10.0
    close_timeout: float = 30.0
    """How long our connection.close waits for close-ok."""
    product: str = "Sluice"
    version: str = "0.1.0"
    mechanisms: tuple[str, ...] = MECHANISMS
    """SASL mechanisms offered in connection.start."""

    def __post_init__(self) -> None:
        if not FRAME_MIN_SIZE <= self.frame_max <= 0xFFFFFFFF:
            raise ValueError(f"frame_max must be at least {FRAME_MIN_SIZE}")
        if not 1 <= self.channel_max <= 0xFFFF:
            raise ValueError("channel_max must be 1..65535")


@dataclass
class _Content:
    """A publish whose header and body frames are being read."""

    method: Basic.Publish
    properties: Basic.Properties = field(default_factory=Basic.Properties)
    size: int = 0
    chunks: list[bytes] = field(default_factory=list)
    received: int = 0


class ServerConnection:
    """One client connection seen from the broker. Runs on the adapter's task; never blocks."""

    def __init__(self, options: Options = Options(), opened_at: float = 0.0) -> None:
        self.options = options
        self.state = State.AWAITING_HEADER
        self.channel_max = options.channel_max
        self.frame_max = FRAME_MIN_SIZE
        self.heartbeat = 0
        self.client_properties: dict[str, Any] = {}
        self._mechanism = ""
        self._decoder = Decoder(FRAME_MIN_SIZE)
        self._events: deque[Event] = deque()
        self._outgoing: list[bytes] = []
        """Frames to send, joined once per `data_to_send` (a delivery's body is not copied
        again per frame)."""
        self._channels: dict[int, ChannelState] = {}
        self._contents: dict[int, _Content] = {}
        self._channel_close: dict[int, tuple[int, str]] = {}
        self._discarding: set[int] = set()
        """Channels the broker closed with an error, until the adapter has carried out their
        `ChannelClosed`: what was read on them is no longer carried out."""
        self._close: tuple[int, str] = (ReplyCode.REPLY_SUCCESS, "")
        self._opened_at = opened_at
        self._now = opened_at
        self._last_received = opened_at
        self._last_sent = opened_at
        self._closing_since = opened_at
        self._read_paused = False

    # ------------------------------------------------------------------------ bytes in

    def receive_data(self, data: bytes, now: float) -> None:
        """Feed bytes read from the socket; `b""` means the peer closed it."""
        self._now = now
        if self.state is State.CLOSED:
            return
        if self.state is State.CLOSE_RECEIVED:  # the client may send nothing after its close
            if not data:
                self._closed(*self._close, True)
            return
        if not data:
            self._closed(ReplyCode.CONNECTION_FORCED, "connection closed by the client", True)
            return
        self._last_received = now
        self._decoder.feed(data)
        self._process()

    def next_event(self) -> Event | None:
        """The next event, or None when the bytes so far hold no more."""
        return self._events.popleft() if self._events else None

    def data_to_send(self) -> bytes:
        """Bytes to write: answers, the adapter's sends, heartbeats, closes."""
        return b"".join(self.chunks_to_send())

    def chunks_to_send(self) -> list[bytes]:
        """`data_to_send` in pieces, for an adapter that joins them with more of its own."""
        out, self._outgoing = self._outgoing, []
        return out

    @property
    def open_channels(self) -> int:
        """Channels open (or closing) now."""
        return len(self._channels)

    def accepts(self, channel: int) -> bool:
        """Whether what was read on ``channel`` is still to be carried out: everything is, in
        order, whatever ends the channel or the connection afterwards, except on a channel the
        broker closed with an error (until the adapter carried out its `ChannelClosed`)."""
        return channel not in self._discarding

    @property
    def channel_numbers(self) -> list[int]:
        """The channels open (or closing) now, in order."""
        return sorted(self._channels)

    def channel_state(self, channel: int) -> ChannelState:
        """Where ``channel`` is (CLOSED when it was never opened)."""
        return self._channels.get(channel, ChannelState.CLOSED)

    def _process(self) -> None:
        # LOGIN_REQUESTED and VHOST_REQUESTED wait for the adapter; the bytes stay buffered.
        while self.state not in _NOT_READING:
            try:
                if self.state is State.OPEN and self._whole_publish():
                    continue
                received = self._decoder.next_frame()
                if received is None:
                    return
                self._handle(*received)
            except BadProtocolHeader as exc:
                self._send(PROTOCOL_HEADER)
                self._closed(ReplyCode.FRAME_ERROR, str(exc), False)
            except FrameError as exc:  # framing is lost: say why, read nothing more
                if self.state is not State.CLOSING:
                    self._send_close(exc.code, exc.reply_text, 0, 0)
                self._closed(exc.code, exc.reply_text, False)
            except AmqpError as exc:  # a whole frame: the stream stays readable
                if self.state is not State.CLOSING:  # closing ignores all but close(-ok)
                    self._start_close(exc.code, exc.reply_text, exc.class_id, exc.method_id)

    def _whole_publish(self) -> bool:
        """Take a publish whose three frames are all buffered in one step, where its channel
        is open and it is within the size limit: what reading it frame by frame through the
        channel table would do (most publishes are read so). False: read it that way."""
        message = self._decoder.next_message()
        if message is None:
            return False
        channel, method, properties, body, end = message
        if self._channels.get(channel) is not ChannelState.OPEN \
                or len(body) > self.options.max_message_size:
            return False
        self._decoder.skip(end)
        self._events.append(PublishReceived(channel, method, properties, body))
        return True

    def _handle(self, channel: int, frame: Any) -> None:
        if isinstance(frame, Heartbeat):
            if channel:
                raise AmqpError(ReplyCode.UNEXPECTED_FRAME, f"heartbeat on channel {channel}")
        elif channel == 0:
            self._on_connection_frame(frame)
        elif self.state is State.OPEN:
            self._on_channel_frame(channel, frame)
        elif self.state is not State.CLOSING:
            raise AmqpError(ReplyCode.UNEXPECTED_FRAME,
                            f"frame on channel {channel} in connection state {self.state.name}")

    # ------------------------------------------------------------------------ channel 0

    def _on_connection_frame(self, frame: Any) -> None:
        after = TRANSITIONS.get((self.state, type(frame)))
        if after is None:
            if self.state is State.CLOSING:
                return
            code = (ReplyCode.UNEXPECTED_FRAME if isinstance(frame, (ContentHeader, ContentBody))
                    else ReplyCode.CHANNEL_ERROR)
            raise AmqpError(code, f"unexpected {frame.name} in connection state "
                            f"{self.state.name.lower()}", *_ids(frame))
        before, self.state = self.state, after
        handler = self._CONNECTION_HANDLERS.get(type(frame))
        if handler is not None:
            handler(self, frame, before)

    def _on_header(self, frame: ProtocolHeader, before: State) -> None:
        options = self.options
        self._send(encode_method(0, start(options.product, options.version, options.mechanisms)))

    def _on_start_ok(self, frame: Connection.StartOk, before: State) -> None:
        user, password = credentials(frame.mechanism, frame.response, self.options.mechanisms)
        self._mechanism = frame.mechanism
        self.client_properties = dict(frame.client_properties or {})
        self._events.append(LoginRequested(frame.mechanism, user, password,
                                           self.client_properties))

    def _on_tune_ok(self, frame: Connection.TuneOk, before: State) -> None:
        ours = self.options
        if not FRAME_MIN_SIZE <= frame.frame_max <= ours.frame_max:
            raise AmqpError(ReplyCode.NOT_ALLOWED, f"negotiated frame_max = {frame.frame_max} "
                            f"is outside {FRAME_MIN_SIZE}..{ours.frame_max}", *_ids(frame))
        if not 1 <= frame.channel_max <= ours.channel_max:
            raise AmqpError(ReplyCode.NOT_ALLOWED, f"negotiated channel_max = "
                            f"{frame.channel_max} is outside 1..{ours.channel_max}", *_ids(frame))
        self.frame_max = self._decoder.frame_max = frame.frame_max
        self.channel_max = frame.channel_max
        self.heartbeat = frame.heartbeat
        self._last_sent = self._now

    def _on_open(self, frame: Connection.Open, before: State) -> None:
        self._events.append(VhostRequested(frame.virtual_host))

    def _on_close(self, frame: Connection.Close, before: State) -> None:
        if self.state is State.CLOSE_RECEIVED:  # close-ok once what came before is carried out
            self._close = (frame.reply_code, frame.reply_text)
            self._contents.clear()
            self._events.append(CloseRequested(frame.reply_code, frame.reply_text))
            return
        self._send(encode_method(0, Connection.CloseOk()))
        if before is State.CLOSING:
            self._closed(*self._close, False)
        else:
            self._closed(frame.reply_code, frame.reply_text, True)

    def _on_close_ok(self, frame: Connection.CloseOk, before: State) -> None:
        self._closed(*self._close, False)

    _CONNECTION_HANDLERS: dict[type, Callable[[Any, Any, State], None]] = {
        ProtocolHeader: _on_header,
        Connection.StartOk: _on_start_ok,
        Connection.TuneOk: _on_tune_ok,
        Connection.Open: _on_open,
        Connection.Close: _on_close,
        Connection.CloseOk: _on_close_ok,
    }

    # ------------------------------------------------------------------------ channels

    def _on_channel_frame(self, channel: int, frame: Any) -> None:
        state = self.channel_state(channel)
        after = CHANNEL_TRANSITIONS.get((state, type(frame)))
        if after is None:
            code = refusal(state, type(frame))
            if code is None:
                return
            raise AmqpError(code, f"unexpected {frame.name} on channel {channel} "
                            f"({state.name.lower()})", *_ids(frame))
        self._set_channel(channel, after)
        handler = self._CHANNEL_HANDLERS.get(type(frame), ServerConnection._on_method)
        handler(self, channel, frame, state)

    def _set_channel(self, channel: int, state: ChannelState) -> None:
        if state is ChannelState.CLOSED:
            self._channels.pop(channel, None)
            self._contents.pop(channel, None)
        else:
            self._channels[channel] = state

    def _on_channel_open(self, channel: int, frame: Channel.Open, before: ChannelState) -> None:
        if len(self._channels) > self.channel_max:  # counted, not numbered, as RabbitMQ does
            self._set_channel(channel, ChannelState.CLOSED)
            raise AmqpError(ReplyCode.NOT_ALLOWED, f"number of channels opened "
                            f"({len(self._channels)}) has reached the negotiated channel_max "
                            f"({self.channel_max})")
        self._send(encode_method(channel, Channel.OpenOk()))
        self._events.append(ChannelOpened(channel))

    def _on_channel_close(self, channel: int, frame: Channel.Close,
                          before: ChannelState) -> None:
        if before is ChannelState.CLOSING:  # crossing ours: what it sent is discarded anyway
            self._send(encode_method(channel, Channel.CloseOk()))
        else:  # close-ok once what it sent before is carried out (finish_channel_close)
            self._events.append(ChannelClosed(channel, frame.reply_code, frame.reply_text, True))

    def _on_channel_close_ok(self, channel: int, frame: Channel.CloseOk,
                             before: ChannelState) -> None:
        self._events.append(ChannelClosed(channel, *self._channel_close.pop(channel), False))

    def _on_flow(self, channel: int, frame: Channel.Flow, before: ChannelState) -> None:
        self._send(encode_method(channel, Channel.FlowOk(frame.active)))
        self._events.append(FlowChanged(channel, frame.active))

    def _on_publish(self, channel: int, frame: Basic.Publish, before: ChannelState) -> None:
        self._contents[channel] = _Content(frame)

    def _on_content_header(self, channel: int, frame: ContentHeader,
                           before: ChannelState) -> None:
        content = self._contents[channel]
        if frame.class_id != Basic.frame_id:
            raise AmqpError(ReplyCode.UNEXPECTED_FRAME, f"content header for class "
                            f"{frame.class_id}, expected {Basic.frame_id}")
        if frame.body_size > self.options.max_message_size:
            self.close_channel(channel, ReplyCode.PRECONDITION_FAILED,
                               f"PRECONDITION_FAILED - message size {frame.body_size} is larger "
                               f"than configured max size {self.options.max_message_size}",
                               *_ids(content.method))
            return
        content.properties, content.size = frame.properties, frame.body_size
        if not frame.body_size:
            self._content_done(channel, content)

    def _on_content_body(self, channel: int, frame: ContentBody, before: ChannelState) -> None:
        content = self._contents[channel]
        content.received += len(frame.value)
        if content.received > content.size:
            raise AmqpError(ReplyCode.UNEXPECTED_FRAME, f"received {content.received} body "
                            f"bytes, the header announced {content.size}")
        content.chunks.append(frame.value)
        if content.received == content.size:
            self._content_done(channel, content)

    def _content_done(self, channel: int, content: _Content) -> None:
        self._set_channel(channel, CHANNEL_TRANSITIONS[ChannelState.AWAITING_BODY,
                                                       Action.CONTENT_DONE])
        del self._contents[channel]
        self._events.append(PublishReceived(channel, content.method, content.properties,
                                            b"".join(content.chunks)))

    def _on_method(self, channel: int, frame: Frame, before: ChannelState) -> None:
        self._events.append(MethodReceived(channel, frame))

    _CHANNEL_HANDLERS: dict[type, Callable[[Any, int, Any, ChannelState], None]] = {
        Channel.Open: _on_channel_open,
        Channel.Close: _on_channel_close,
        Channel.CloseOk: _on_channel_close_ok,
        Channel.Flow: _on_flow,
        Basic.Publish: _on_publish,
        ContentHeader: _on_content_header,
        ContentBody: _on_content_body,
    }

    # ------------------------------------------------------------------------ adapter actions

    def _transition(self, action: Action) -> None:
        after = TRANSITIONS.get((self.state, action))
        if after is None:
            raise ConnectionStateError(f"cannot {action.name.lower()} in state {self.state.name}")
        self.state = after

    def accept_login(self) -> None:
        """The credentials of `LoginRequested` are good: offer connection.tune."""
        self._transition(Action.ACCEPT_LOGIN)
        o = self.options
        self._send(encode_method(0, Connection.Tune(o.channel_max, o.frame_max, o.heartbeat)))
        self._process()

    def refuse_login(self, reason: str = "") -> None:
        """The credentials are bad: 403 ACCESS_REFUSED (we announce authentication_failure_close,
        so the client is told rather than dropped)."""
        if self.state is not State.LOGIN_REQUESTED:
            raise ConnectionStateError(f"no login to refuse in state {self.state.name}")
        text = reason or (f"Login was refused using authentication mechanism {self._mechanism}. "
                          "For details see the broker logfile.")
        self._start_close(ReplyCode.ACCESS_REFUSED, f"ACCESS_REFUSED - {text}",
                          *ids(Connection.StartOk()))

    def open_vhost(self) -> None:
        """The client may use the vhost of `VhostRequested`: open-ok; the connection is OPEN."""
        self._transition(Action.OPEN_VHOST)
        self._send(encode_method(0, Connection.OpenOk()))
        self._process()

    def refuse_vhost(self, reason: str) -> None:
        """The vhost does not exist or is not permitted: 530 NOT_ALLOWED."""
        if self.state is not State.VHOST_REQUESTED:
            raise ConnectionStateError(f"no vhost to refuse in state {self.state.name}")
        self._start_close(ReplyCode.NOT_ALLOWED, f"NOT_ALLOWED - {reason}",
                          *ids(Connection.Open()))

    def close_connection(self, code: int = ReplyCode.REPLY_SUCCESS, text: str = "",
                         class_id: int = 0, method_id: int = 0, channel: int = 0) -> None:
        """Send connection.close (shutdown, a hard error) and wait for close-ok; then, or after
        ``close_timeout``, `ConnectionClosed` follows. Nothing else is read meanwhile.
        ``channel``: the channel whose method caused it; what was read on it after that is
        discarded (`accepts`). Does nothing once the connection is closing or closed (a
        method read before a close may fail after it)."""
        if self.state in (State.CLOSE_RECEIVED, State.CLOSING, State.CLOSED):
            return
        if channel:
            self._discarding.add(channel)
        self._start_close(code, text, class_id, method_id)

    def close_channel(self, channel: int, code: int, text: str, class_id: int = 0,
                      method_id: int = 0) -> None:
        """Send channel.close for a soft error (403, 404, 405, 406) and wait for close-ok; the
        channel ignores everything else meanwhile, and what was read on it before is discarded
        (`accepts`). `ChannelClosed` follows the close-ok."""
        if ReplyCode(code).hard:
            raise ValueError(f"{code} is a connection error: use close_connection")
        state = self.channel_state(channel)
        after = CHANNEL_TRANSITIONS.get((state, Action.CLOSE))
        if after is None or self.state is not State.OPEN:
            raise ConnectionStateError(f"cannot close channel {channel} ({state.name})")
        self._set_channel(channel, after)
        self._contents.pop(channel, None)
        self._channel_close[channel] = (code, text)
        self._discarding.add(channel)
        self._send(encode_method(channel, Channel.Close(code, text[:MAX_TEXT], class_id,
                                                        method_id)))

    def finish_channel_close(self, channel: int) -> None:
        """What was read on ``channel`` before its `ChannelClosed` is carried out: answer the
        client's close with close-ok, or (after our close) carry out what it sends on the
        channel from now on. Nothing to send once the connection is closing or closed."""
        self._discarding.discard(channel)
        if self.channel_state(channel) is ChannelState.CLOSE_RECEIVED:
            self._set_channel(channel, CHANNEL_TRANSITIONS[ChannelState.CLOSE_RECEIVED,
                                                           Action.FINISH_CLOSE])
            if self.state is State.OPEN:
                self._send(encode_method(channel, Channel.CloseOk()))

    def finish_close(self) -> None:
        """What was read before `CloseRequested` is carried out: send close-ok; then
        `ConnectionClosed` follows. Does nothing once the connection is closed (the client
        did not wait for close-ok)."""
        if self.state is State.CLOSED:
            return
        self._transition(Action.FINISH_CLOSE)
        self._send(encode_method(0, Connection.CloseOk()))
        self._closed(*self._close, True)

    def can_send(self, channel: int) -> bool:
        """Whether `send_method` / `send_content` on ``channel`` would send anything."""
        return self.state is State.OPEN and self.channel_state(channel) in SENDING_STATES

    def send_method(self, channel: int, method: Frame) -> bool:
        """A method to the client on an open channel (declare-ok, consume-ok, basic.ack for a
        confirm, ...). Returns False, sending nothing, once the channel or the connection is
        closing or closed: a reply to a method read just before may still be attempted."""
        if channel == 0:
            raise ConnectionStateError("channel 0 carries only the connection's own methods")
        if not self.can_send(channel):
            return False
        self._send(encode_method(channel, method))
        return True

    def send_content(self, channel: int, method: Frame, properties: Basic.Properties,
                     body: bytes) -> bool:
        """basic.deliver / get-ok / return with its header and body, split by frame_max.
        Returns False like `send_method`."""
        if not self.can_send(channel):
            return False
        self._send(encode_content(channel, method, properties, body, self.frame_max))
        return True

    def send_delivery(self, channel: int, consumer_tag: str, delivery_tag: int,
                      redelivered: bool, exchange: str, routing_key: str, properties: bytes,
                      body: bytes) -> bool:
        """basic.deliver as `send_content` sends it, from its fields and the marshalled
        ``properties`` (the one content method every consumed message carries)."""
        if not self.can_send(channel):
            return False
        self._outgoing += encode_delivery(channel, consumer_tag, delivery_tag, redelivered,
                                          exchange, routing_key, properties, body, self.frame_max)
        self._last_sent = self._now
        return True

    def block(self, reason: str) -> bool:
        """connection.blocked (memory or disk pressure), if the client announced it
        understands it; returns whether it was sent."""
        return self._send_if_understood(Connection.Blocked(reason[:MAX_TEXT]))

    def unblock(self) -> bool:
        """connection.unblocked after `block`."""
        return self._send_if_understood(Connection.Unblocked())

    def _send_if_understood(self, method: Frame) -> bool:
        capabilities = self.client_properties.get("capabilities")
        if (self.state is not State.OPEN or not isinstance(capabilities, dict)
                or capabilities.get("connection.blocked") is not True):
            return False
        self._send(encode_method(0, method))
        return True

    # ------------------------------------------------------------------------ time

    def reading_paused(self, paused: bool, now: float) -> None:
        """The adapter stopped (or resumed) reading on purpose (a resource alarm): the client's
        silence meanwhile is not a missed heartbeat, as RabbitMQ pauses its monitor."""
        self._read_paused = paused
        if not paused:
            self._last_received = now

    def heartbeat_due(self, now: float) -> bool:
        """Whether we have been silent for a whole heartbeat interval."""
        return (self.heartbeat > 0 and self.state in _HEARTBEATING
                and now - self._last_sent >= self.heartbeat)

    def check_timeouts(self, now: float) -> None:
        """Close a connection whose handshake is too slow, whose client has been silent for
        two heartbeat intervals, or whose close-ok does not come; queue a heartbeat when due."""
        self._now = now
        if self.state is State.CLOSING:
            if now - self._closing_since >= self.options.close_timeout:
                self._closed(*self._close, False)
        elif self.state in _HANDSHAKE:
            if now - self._opened_at >= self.options.handshake_timeout:
                self._closed(ReplyCode.CONNECTION_FORCED, "handshake timeout", False)
        if self.state not in _HEARTBEATING or not self.heartbeat:
            return
        if not self._read_paused and \
                now - self._last_received >= MISSED_HEARTBEATS * self.heartbeat:
            self._closed(ReplyCode.CONNECTION_FORCED, "missed heartbeats from client, "
                         f"timeout: {self.heartbeat}s", False)
        elif self.heartbeat_due(now):
            self._send(HEARTBEAT_FRAME)

    # ------------------------------------------------------------------------ closing

    def _send(self, data: bytes) -> None:
        self._outgoing.append(data)
        self._last_sent = self._now

    def _send_close(self, code: int, text: str, class_id: int, method_id: int) -> None:
        self._send(encode_method(0, Connection.Close(code, text[:MAX_TEXT], class_id,
                                                     method_id)))

    def _start_close(self, code: int, text: str, class_id: int, method_id: int) -> None:
        self._transition(Action.CLOSE)
        self._close = (code, text)
        self._closing_since = self._now
        self._contents.clear()
        self._send_close(code, text, class_id, method_id)

    def _closed(self, code: int, text: str, by_client: bool) -> None:
        self.state = State.CLOSED
        self._channels.clear()
        self._contents.clear()
        self._events.append(ConnectionClosed(code, text, by_client))


_HANDSHAKE: Final = frozenset({State.AWAITING_HEADER, State.AWAITING_START_OK,
                               State.LOGIN_REQUESTED, State.AWAITING_TUNE_OK,
                               State.AWAITING_OPEN, State.VHOST_REQUESTED})
_HEARTBEATING: Final = frozenset({State.AWAITING_OPEN, State.VHOST_REQUESTED, State.OPEN})
"""Heartbeats run from tune-ok on (RabbitMQ starts its heartbeater there)."""
_NOT_READING: Final = frozenset({State.LOGIN_REQUESTED, State.VHOST_REQUESTED,
                                 State.CLOSE_RECEIVED, State.CLOSED})
"""States in which buffered frames are not decoded: the adapter must answer first, or the
client may send nothing more."""


def _ids(frame: Any) -> tuple[int, int]:
    """(class id, method id) of a method frame; (0, 0) for anything else."""
    return ids(frame) if isinstance(frame, Frame) else (0, 0)
