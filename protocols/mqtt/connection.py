"""Sans-IO server side of one MQTT 3.1.1/5.0 connection: bytes in, events out (h11 style).

The adapter owns the socket and the clock. Per read it calls `receive_data(data, now)`
(`b""` means EOF), then `next_event()` until None, then writes `data_to_send()`: the answers
the connection gives by itself (PINGRESP, PUBREL, PUBCOMP, a re-sent PUBREC, a DISCONNECT
with the reason of a protocol error). The adapter's own decisions are methods that return the
bytes to write (`accept`, `ack_publish`, `publish`, ...); write those first, then drain
`data_to_send()`. A timer calls `check_timeouts(now)` (the CONNECT timeout and keep alive).
`Limits` bound what a client can make it parse or hold, before and after CONNECT.

Nothing here imports asyncio or core; the state table is in `state_table.py`, the events in
`events.py`. Not thread-safe: one connection is driven by one task.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, replace
from collections.abc import Callable
from typing import Any, Final

from .codec import MAX_PACKET_SIZE, MQTT_5, MQTT_311, Decoder, encode
from .events import (ConnectionClosed, ConnectRequested, Event, MessagePublished,
                     PublishAcknowledged, PublishReceived, ReleaseRequested, SubscribeRequested,
                     UnsubscribeRequested)
from .packets import (ConnAck, Connect, Disconnect, Packet, PingResp, PubAck, PubComp, Publish,
                      PubRec, PubRel, SubAck, Subscribe, UnsubAck, Unsubscribe)
from .limits import Limits
from .properties import NO_PROPERTIES, Properties, varint
from .reason_codes import (REASON_CODES_BY_PACKET, V311_CONNACK_FOR, MqttError, PacketType,
                           ProtocolError, ReasonCode, TopicNameInvalid)
from .state_table import TRANSITIONS, Action, State

__all__ = ["ConnectionStateError", "FlowControlFull", "Inflight", "ServerConnection"]

DEFAULT_RECEIVE_MAXIMUM: Final = 65_535
"""Receive Maximum when CONNECT/CONNACK do not say (spec 3.1.2.11.3)."""
MAX_REASON_STRING: Final = 256
"""Reason strings we send are cut to this many characters."""
KEEPALIVE_GRACE: Final = 1.5
"""A client is gone after 1.5 keep-alive periods without a packet (spec 3.1.2.10)."""


class ConnectionStateError(RuntimeError):
    """The adapter called a method the current state does not allow (a bug in the adapter,
    like h11's LocalProtocolError): e.g. `publish` before `accept`, or acking an unknown id."""


class FlowControlFull(Exception):
    """`publish` at QoS 1/2 while the client's Receive Maximum window is full: queue the message
    and retry after a `PublishAcknowledged`. `ServerConnection.send_quota` tells in advance."""


class TopicAliasInvalid(MqttError):
    """An inbound topic alias that is 0, above our Topic Alias Maximum, or unknown (0x94)."""

    reason_code = ReasonCode.TopicAliasInvalid


class ReceiveMaximumExceeded(MqttError):
    """The client has more unacknowledged QoS 1/2 messages than our Receive Maximum (0x93)."""

    reason_code = ReasonCode.ReceiveMaximumExceeded


class ClientIdentifierNotValid(MqttError):
    """A client identifier this server does not accept (0x85; 3.1.1 return code 2)."""

    reason_code = ReasonCode.ClientIdentifierNotValid


class QoSNotSupported(MqttError):
    """A PUBLISH above the Maximum QoS we advertised in CONNACK (0x9B)."""

    reason_code = ReasonCode.QoSNotSupported


class RetainNotSupported(MqttError):
    """A retained PUBLISH after we advertised Retain Available = 0 (0x9A)."""

    reason_code = ReasonCode.RetainNotSupported


@dataclass(frozen=True)
class Inflight:
    """The QoS 1/2 state a persistent session keeps across connections (spec 4.1): messages
    we sent and await acks for, and inbound QoS 2 ids awaiting PUBREL. Take it with
    `ServerConnection.inflight()` when a connection ends; pass it to `accept(resume=...)`,
    then write `pending_resend()`."""

    outbound: tuple[tuple[Publish, PacketType], ...] = ()
    awaiting_pubrel: tuple[tuple[int, ReasonCode], ...] = ()
    next_packet_id: int = 1


class ServerConnection:
    """One client connection seen from the broker. Runs on the adapter's task; never blocks.

    `receive_maximum`, `topic_alias_maximum` and `max_packet_size` are the limits we enforce
    on the client and advertise in an MQTT 5 CONNACK; `limits` are the others (packet size
    before CONNACK, CONNECT timeout counted from `opened_at`, client id, topic and user
    property caps).
    """

    def __init__(self, *, receive_maximum: int = DEFAULT_RECEIVE_MAXIMUM,
                 topic_alias_maximum: int = 16, max_packet_size: int = MAX_PACKET_SIZE,
                 adapter_releases: bool = False,
                 max_outbound_inflight: int = DEFAULT_RECEIVE_MAXIMUM,
                 limits: Limits = Limits(), opened_at: float = 0.0) -> None:
        """``adapter_releases``: QoS 2 handshakes wait for the adapter (so it can persist the
        step first): a PUBREC from the client becomes a `PublishReceived` event answered with
        `release()`, a PUBREL a `ReleaseRequested` event answered with `complete()`.
        ``max_outbound_inflight`` caps our unacknowledged QoS 1/2 PUBLISHes below the client's
        Receive Maximum (a 3.1.1 client announces none)."""
        self.state = State.CONNECTING
        self.version: int | None = None
        self.receive_maximum = receive_maximum
        self.topic_alias_maximum = topic_alias_maximum
        self.max_packet_size = max_packet_size
        self.keep_alive = 0
        self.adapter_releases = adapter_releases
        self.max_outbound_inflight = max_outbound_inflight
        self._outbound_window = min(DEFAULT_RECEIVE_MAXIMUM, max_outbound_inflight)
        """QoS 1/2 PUBLISHes we may have unacknowledged: the lower of the client's Receive
        Maximum and ``max_outbound_inflight``."""
        self.limits = limits
        self._decoder = Decoder(max_packet_size=min(max_packet_size, limits.max_connect_packet_size),
                                max_user_properties=limits.max_user_properties)
        self._events: deque[Event] = deque()
        self._outgoing = bytearray()
        self._opened_at = opened_at
        self._now = opened_at
        self._last_packet_at = 0.0
        # What the client told us in CONNECT.
        self._client_max_packet_size = MAX_PACKET_SIZE
        # Inbound QoS 1/2: reported to the adapter, not yet acked; and QoS 2 after PUBREC.
        self._unacked: dict[int, int] = {}
        self._awaiting_pubrel: dict[int, ReasonCode] = {}
        self._aliases: dict[int, str] = {}
        self._outbound_aliases: dict[str, int] = {}
        self._client_topic_alias_maximum = 0
        # Outbound QoS 1/2 by packet id, in send order: the packet and the ack we expect.
        self._inflight: dict[int, tuple[Publish, PacketType]] = {}
        self._next_packet_id = 1
        # What our CONNACK promised (MQTT 5), checked on every PUBLISH.
        self._maximum_qos = 2
        self._retain_available = True
        self._session_expiry = 0

    # ------------------------------------------------------------------------ bytes in

    def receive_data(self, data: bytes, now: float) -> None:
        """Feed bytes read from the socket; `b""` means the peer closed it."""
        self._now = now
        if self.state is State.CLOSED:
            return
        if not data:
            self._close(ReasonCode.UnspecifiedError, will=True, send=False)
            return
        self._decoder.feed(data)
        self._process()

    def next_event(self) -> Event | None:
        """The next event, or None when the bytes so far hold no more."""
        return self._events.popleft() if self._events else None

    def data_to_send(self) -> bytes:
        """Bytes the connection answered by itself since the last call; write them out."""
        out = bytes(self._outgoing)
        self._outgoing.clear()
        return out

    def check_timeouts(self, now: float) -> None:
        """Close a connection that has not sent its whole CONNECT within the limit's
        ``connect_timeout`` (nothing is sent: the client's version is unknown), or with
        KeepAliveTimeout one that has been silent for 1.5 keep-alives."""
        self._now = now
        timeout = self.limits.connect_timeout
        if self.state is State.CONNECTING and timeout and now - self._opened_at >= timeout:
            self._close(ReasonCode.MaximumConnectTime, will=False, send=False,
                        detail=f"no complete CONNECT within {timeout:g} s (connect_timeout_s)")
        elif (self.state is State.CONNECTED and self.keep_alive > 0
                and now - self._last_packet_at >= KEEPALIVE_GRACE * self.keep_alive):
            self._close(ReasonCode.KeepAliveTimeout, will=True, send=True)

    def _process(self) -> None:
        # Only CONNECTING and CONNECTED read packets: after CONNECT the rest waits for accept().
        while self.state in (State.CONNECTING, State.CONNECTED):
            try:
                packet = self._decoder.next_packet()
                if packet is None:
                    return
                self._last_packet_at = self._now
                if packet.__class__ is Publish and self.state is State.CONNECTED:
                    self._on_publish(packet)  # the table's (CONNECTED, PUBLISH) -> CONNECTED
                else:
                    self._handle(packet)
            except MqttError as exc:
                self._protocol_error(exc)

    def _handle(self, packet: Packet) -> None:
        after = TRANSITIONS.get((self.state, packet.type))
        if after is None:
            raise ProtocolError(f"{packet.type.name} is not allowed in {self.state.name}")
        self._HANDLERS[packet.type](self, packet)
        if self.state is not State.CLOSED:
            self.state = after

    def _protocol_error(self, exc: MqttError) -> None:
        if self.state is State.CONNECTING:
            self._outgoing += _failed_connack(exc, self._decoder.version)
        self._close(exc.reason_code, will=True, send=True, detail=str(exc))

    def _close(self, reason: ReasonCode, *, will: bool, send: bool,
               session_expiry: int | None = None, detail: str = "") -> None:
        """Report ConnectionClosed; in MQTT 5 after CONNACK also tell the client why."""
        if send and self.state is State.CONNECTED and self.version == MQTT_5:
            if reason not in REASON_CODES_BY_PACKET[PacketType.DISCONNECT]:
                reason = ReasonCode.ProtocolError
            props = Properties(reason_string=detail[:MAX_REASON_STRING]) if detail else NO_PROPERTIES
            self._outgoing += encode(Disconnect(reason, props), MQTT_5)
        self.state = State.CLOSED
        self._events.append(ConnectionClosed(reason, will, session_expiry, detail))

    # ------------------------------------------------------------------------ client packets

    def _on_connect(self, p: Connect) -> None:
        if (problem := self.limits.client_id_problem(p.client_id)) is not None:
            raise ClientIdentifierNotValid(problem)
        if p.will is not None and (problem := self.limits.topic_problem(p.will.topic)) is not None:
            raise TopicNameInvalid(f"will {problem}")
        self.version = self._decoder.version
        self.keep_alive = p.keep_alive
        props = p.properties
        if props.receive_maximum is not None:
            self._outbound_window = min(props.receive_maximum, self.max_outbound_inflight)
        if props.maximum_packet_size is not None:
            self._client_max_packet_size = props.maximum_packet_size
        self._session_expiry = props.session_expiry_interval or 0
        self._client_topic_alias_maximum = props.topic_alias_maximum or 0
        assert self.version is not None
        self._events.append(ConnectRequested(p.client_id, p.clean_start, p.keep_alive, p.username,
                                             p.password, p.will, props, self.version))

    def _on_publish(self, p: Publish) -> None:
        if p.topic and (problem := self.limits.topic_problem(p.topic)) is not None:
            raise TopicNameInvalid(problem)
        if p.properties.subscription_identifiers:
            raise ProtocolError("PUBLISH from a client with a subscription identifier (3.3.4-6)")
        topic, props = self._resolve_alias(p)
        if p.qos > self._maximum_qos:
            raise QoSNotSupported(f"QoS {p.qos} above the maximum QoS {self._maximum_qos}")
        if p.retain and not self._retain_available:
            raise RetainNotSupported("retain is not available")
        if p.qos and (p.packet_id in self._unacked or p.packet_id in self._awaiting_pubrel):
            self._on_duplicate(p)
            return
        if p.qos and self.version == MQTT_5:
            if len(self._unacked) + len(self._awaiting_pubrel) >= self.receive_maximum:
                raise ReceiveMaximumExceeded(f"more than {self.receive_maximum} unacked messages")
        if p.packet_id is not None:
            self._unacked[p.packet_id] = p.qos
        self._events.append(MessagePublished(topic, p.payload, p.qos, p.retain, p.packet_id,
                                             props))

    def _on_duplicate(self, p: Publish) -> None:
        """A PUBLISH whose packet id we still hold: the adapter already has the message."""
        assert p.packet_id is not None
        if p.packet_id in self._awaiting_pubrel:  # our PUBREC was lost: send it again
            code = self._awaiting_pubrel[p.packet_id]
            self._outgoing += self._encode(PubRec(p.packet_id, code))

    def _resolve_alias(self, p: Publish) -> tuple[str, Properties]:
        alias = p.properties.topic_alias
        if alias is None:
            return p.topic, p.properties
        if alias > self.topic_alias_maximum:
            raise TopicAliasInvalid(f"topic alias {alias} > maximum {self.topic_alias_maximum}")
        if p.topic:
            self._aliases[alias] = p.topic
        elif alias not in self._aliases:
            raise TopicAliasInvalid(f"topic alias {alias} was never set")
        return self._aliases[alias], replace(p.properties, topic_alias=None)

    def _on_pubrel(self, p: PubRel) -> None:
        if self.adapter_releases and p.packet_id in self._awaiting_pubrel:
            del self._awaiting_pubrel[p.packet_id]
            self._events.append(ReleaseRequested(p.packet_id))
            return
        if self._awaiting_pubrel.pop(p.packet_id, None) is not None or self.version == MQTT_311:
            self._outgoing += self._encode(PubComp(p.packet_id))
        else:
            self._outgoing += self._encode(PubComp(p.packet_id,
                                                   ReasonCode.PacketIdentifierNotFound))

    def _on_puback(self, p: PubAck) -> None:
        self._outbound_ack(p.packet_id, PacketType.PUBACK, p.reason_code)

    def _on_pubrec(self, p: PubRec) -> None:
        if p.packet_id not in self._inflight:
            if self.version == MQTT_5:
                self._outgoing += self._encode(PubRel(p.packet_id,
                                                      ReasonCode.PacketIdentifierNotFound))
            return
        if p.reason_code >= 0x80:  # the client refused the message: the exchange ends here
            self._outbound_ack(p.packet_id, PacketType.PUBREC, p.reason_code)
        elif self._inflight[p.packet_id][1] in (PacketType.PUBREC, PacketType.PUBCOMP):
            self._inflight[p.packet_id] = (self._inflight[p.packet_id][0], PacketType.PUBCOMP)
            if self.adapter_releases:
                self._events.append(PublishReceived(p.packet_id))
            else:
                self._outgoing += self._encode(PubRel(p.packet_id))
        else:
            raise ProtocolError(f"PUBREC for QoS 1 message {p.packet_id}")

    def _on_pubcomp(self, p: PubComp) -> None:
        self._outbound_ack(p.packet_id, PacketType.PUBCOMP, p.reason_code)

    def _outbound_ack(self, packet_id: int, kind: PacketType, reason: ReasonCode) -> None:
        """PUBACK/PUBCOMP (or a refusing PUBREC) for a message we sent. An unknown id is
        ignored: it is usually a late duplicate (spec 4.3 asks for nothing else)."""
        entry = self._inflight.get(packet_id)
        if entry is None:
            return
        if entry[1] is not kind and kind is not PacketType.PUBREC:
            raise ProtocolError(f"{kind.name} for message {packet_id} awaiting {entry[1].name}")
        del self._inflight[packet_id]
        self._events.append(PublishAcknowledged(packet_id, reason))

    def _on_subscribe(self, p: Subscribe) -> None:
        self._events.append(SubscribeRequested(p.packet_id, p.subscriptions, p.properties))

    def _on_unsubscribe(self, p: Unsubscribe) -> None:
        self._events.append(UnsubscribeRequested(p.packet_id, p.topic_filters, p.properties))

    def _on_pingreq(self, p: Packet) -> None:
        self._outgoing += self._encode(PingResp())

    def _on_disconnect(self, p: Disconnect) -> None:
        if self._session_expiry == 0 and p.properties.session_expiry_interval:
            raise ProtocolError("DISCONNECT sets a session expiry; CONNECT said 0 (3.14.2.2.2)")
        self._close(p.reason_code, will=p.reason_code != ReasonCode.NormalDisconnection,
                    send=False, session_expiry=p.properties.session_expiry_interval)

    _HANDLERS: dict[PacketType, Callable[[Any, Any], None]] = {
        PacketType.CONNECT: _on_connect,
        PacketType.PUBLISH: _on_publish,
        PacketType.PUBACK: _on_puback,
        PacketType.PUBREC: _on_pubrec,
        PacketType.PUBREL: _on_pubrel,
        PacketType.PUBCOMP: _on_pubcomp,
        PacketType.SUBSCRIBE: _on_subscribe,
        PacketType.UNSUBSCRIBE: _on_unsubscribe,
        PacketType.PINGREQ: _on_pingreq,
        PacketType.DISCONNECT: _on_disconnect,
    }

    # ------------------------------------------------------------------------ adapter actions

    def _transition(self, action: Action) -> None:
        after = TRANSITIONS.get((self.state, action))
        if after is None:
            raise ConnectionStateError(f"cannot {action.name.lower()} in state {self.state.name}")
        self.state = after

    def _answer_closed(self) -> bool:
        """Check that an answer to a client packet is allowed now; True if CLOSED."""
        self._transition(Action.ANSWER)
        return self.state is State.CLOSED

    def _encode(self, packet: Packet) -> bytes:
        assert self.version is not None
        return encode(packet, self.version)

    def accept(self, session_present: bool = False, assigned_client_id: str | None = None,
               properties: Properties = NO_PROPERTIES, resume: Inflight | None = None) -> bytes:
        """CONNACK with success. In MQTT 5 it also advertises our limits, unless `properties`
        set them, and holds the client to the Maximum QoS / Retain Available it states.
        `resume` restores a persistent session's in-flight state (see `Inflight`). Packets the
        client sent after CONNECT are processed now: read events and `data_to_send()` after
        writing the returned bytes."""
        self._transition(Action.ACCEPT)
        self._decoder.max_packet_size = self.max_packet_size
        if resume is not None:
            self._restore(resume)
        if self.version == MQTT_5:
            properties = self._advertise(properties, assigned_client_id)
            if properties.maximum_qos is not None:
                self._maximum_qos = properties.maximum_qos
            self._retain_available = properties.retain_available != 0
        if properties.server_keep_alive is not None:
            self.keep_alive = properties.server_keep_alive
        self._last_packet_at = self._now
        out = self._encode(ConnAck(session_present, ReasonCode.Success, properties))
        self._process()
        return out

    def _advertise(self, props: Properties, assigned_client_id: str | None) -> Properties:
        ours: dict[str, Any] = {"assigned_client_identifier": assigned_client_id,
                "receive_maximum": self.receive_maximum
                if self.receive_maximum != DEFAULT_RECEIVE_MAXIMUM else None,
                "topic_alias_maximum": self.topic_alias_maximum or None,
                "maximum_packet_size": self.max_packet_size
                if self.max_packet_size != MAX_PACKET_SIZE else None}
        unset = {k: v for k, v in ours.items() if v is not None and getattr(props, k) is None}
        if "topic_alias_maximum" not in unset and props.topic_alias_maximum is not None:
            self.topic_alias_maximum = props.topic_alias_maximum
        return replace(props, **unset)

    def refuse(self, reason_code: ReasonCode, reason_string: str = "") -> bytes:
        """CONNACK with a failure; the connection is CLOSED. MQTT 3.1.1 has six return codes
        (`V311_CONNACK_FOR`); for any other reason it just closes, so this returns b"".
        MQTT 5 carries ``reason_string`` to the client."""
        if reason_code < 0x80:
            raise ValueError(f"refuse() needs a failure reason code, not {reason_code!r}")
        self._transition(Action.REFUSE)
        if self.version == MQTT_5:
            props = (Properties(reason_string=reason_string[:MAX_REASON_STRING]) if reason_string
                     else NO_PROPERTIES)
            return self._encode(ConnAck(False, reason_code, props))
        v311 = V311_CONNACK_FOR.get(reason_code)
        return b"" if v311 is None else self._encode(ConnAck(False, v311))

    def disconnect(self, reason_code: ReasonCode = ReasonCode.NormalDisconnection,
                   properties: Properties = NO_PROPERTIES) -> bytes:
        """Close from our side (shutdown, session taken over, ...). MQTT 5 after CONNACK sends
        DISCONNECT; otherwise there is nothing to send and this returns b"". No event."""
        send = self.state is State.CONNECTED and self.version == MQTT_5
        self._transition(Action.DISCONNECT)
        return self._encode(Disconnect(reason_code, properties)) if send else b""

    def ack_publish(self, packet_id: int, reason_code: ReasonCode = ReasonCode.Success) -> bytes:
        """PUBACK for a QoS 1 message, PUBREC for QoS 2 (the client's PUBREL is then answered
        by itself). MQTT 3.1.1 cannot carry `reason_code`; it is dropped there. After the
        connection closed it only records the ack (for `inflight()`) and returns b""."""
        closed = self.state is State.CLOSED
        self._transition(Action.ACK_PUBLISH)
        qos = self._unacked.pop(packet_id, None)
        if qos is None:
            raise ConnectionStateError(f"no unacknowledged inbound message {packet_id}")
        code = reason_code if self.version == MQTT_5 else ReasonCode.Success
        if qos == 2 and code < 0x80:
            self._awaiting_pubrel[packet_id] = code
        if closed:
            return b""
        if code == ReasonCode.Success:  # the common case, without building a packet object
            return (b"\x40\x02" if qos == 1 else b"\x50\x02") + packet_id.to_bytes(2, "big")
        return self._encode((PubAck if qos == 1 else PubRec)(packet_id, code))

    def ack_subscribe(self, packet_id: int, granted: list[ReasonCode | int]) -> bytes:
        """SUBACK: per filter the granted QoS (0/1/2) or a failure (3.1.1: any >= 0x80 is
        sent as 0x80). Like every answer to a client packet, b"" once CLOSED: a packet read
        just before the connection closed may still be answered, with nothing to send."""
        if self._answer_closed():
            return b""
        codes = tuple(int(c) if self.version == MQTT_5 or c < 0x80 else 0x80 for c in granted)
        return self._encode(SubAck(packet_id, codes))

    def ack_unsubscribe(self, packet_id: int,
                        reason_codes: list[ReasonCode] | None = None) -> bytes:
        """UNSUBACK; MQTT 5 carries one reason code per filter (default: all Success)."""
        if self._answer_closed():
            return b""
        if self.version == MQTT_311:
            return self._encode(UnsubAck(packet_id))
        return self._encode(UnsubAck(packet_id, tuple(reason_codes or (ReasonCode.Success,))))

    def release(self, packet_id: int) -> bytes:
        """PUBREL for an outbound QoS 2 message after its `PublishReceived` event."""
        if self._answer_closed():
            return b""
        entry = self._inflight.get(packet_id)
        if entry is None or entry[1] is not PacketType.PUBCOMP:
            raise ConnectionStateError(f"message {packet_id} is not awaiting PUBREL")
        return self._encode(PubRel(packet_id))

    def complete(self, packet_id: int) -> bytes:
        """PUBCOMP for an inbound QoS 2 message after its `ReleaseRequested` event."""
        if self._answer_closed():
            return b""
        return self._encode(PubComp(packet_id))

    # ------------------------------------------------------------------------ outbound messages

    @property
    def send_quota(self) -> int:
        """How many more QoS 1/2 messages the client's Receive Maximum allows now."""
        quota = self._outbound_window - len(self._inflight)
        return quota if quota > 0 else 0

    def publish(self, topic: str, payload: bytes, qos: int = 0, retain: bool = False,
                properties: Properties = NO_PROPERTIES, *, packet_id: int | None = None,
                dup: bool = False, encoded: dict[tuple[int, bool, bool, int | None],
                                                 tuple[bytes, bytes]] | None = None,
                ) -> tuple[int | None, bytes]:
        """A PUBLISH to the client: (packet id or None for QoS 0, bytes to write). QoS 1/2
        stay in flight until PUBACK/PUBCOMP; raises FlowControlFull when the window is full.
        ``packet_id`` picks the id (it must not be in flight); ``dup`` marks a redelivery.
        ``encoded``, given by every connection sending the same message, keeps its encoding
        around the packet id (by QoS, flags and version), so a fan-out encodes it once."""
        if self.state is not State.CONNECTED:  # the table's (CONNECTED, SEND) -> CONNECTED
            self._transition(Action.SEND)
        if qos:
            if not self.send_quota:
                raise FlowControlFull(f"{len(self._inflight)} messages in flight")
            if packet_id is None:
                packet_id = self._allocate_packet_id()
            elif packet_id in self._inflight or not 0 < packet_id <= 0xFFFF:
                raise ConnectionStateError(f"packet id {packet_id} is in flight or invalid")
        else:
            packet_id = None
        if properties is NO_PROPERTIES and not self._client_topic_alias_maximum:
            if encoded is None:
                head, tail = _publish_parts(topic, payload, qos, retain, dup, self.version)
            else:
                key = (qos, retain, dup, self.version)
                parts = encoded.get(key)
                if parts is None:
                    parts = encoded[key] = _publish_parts(topic, payload, qos, retain, dup,
                                                          self.version)
                head, tail = parts
            data = head + tail if packet_id is None else \
                b"".join((head, packet_id.to_bytes(2, "big"), tail))
            if len(data) > self._client_max_packet_size:
                raise ValueError(f"{len(data)}-byte PUBLISH exceeds the client's maximum packet size")
            if packet_id is not None:
                expect = PacketType.PUBACK if qos == 1 else PacketType.PUBREC
                self._inflight[packet_id] = (Publish(topic, payload, qos, retain, dup, packet_id),
                                             expect)
            return packet_id, data
        packet = Publish(topic, payload, qos, retain, dup, packet_id, properties)
        on_wire, new_alias = self._with_alias(packet)
        data = self._encode(on_wire)
        if len(data) > self._client_max_packet_size:
            raise ValueError(f"{len(data)}-byte PUBLISH exceeds the client's maximum packet size")
        if new_alias is not None:  # only now: the client learns an alias when it is sent
            self._outbound_aliases[topic] = new_alias
        if packet_id is not None:
            expect = PacketType.PUBACK if qos == 1 else PacketType.PUBREC
            self._inflight[packet_id] = (packet, expect)
        return packet_id, data

    def _with_alias(self, p: Publish) -> tuple[Publish, int | None]:
        """Outbound topic aliases (MQTT 5): the first message to a topic carries the topic and
        a new alias, later ones only the alias, until the client's Topic Alias Maximum is used
        up. Aliases are per connection, so in-flight state and resends keep the full topic."""
        if p.properties.topic_alias is not None:
            return p, None
        alias = self._outbound_aliases.get(p.topic)
        if alias is not None:
            return replace(p, topic="", properties=replace(p.properties, topic_alias=alias)), None
        if len(self._outbound_aliases) >= self._client_topic_alias_maximum:
            return p, None
        alias = len(self._outbound_aliases) + 1
        return replace(p, properties=replace(p.properties, topic_alias=alias)), alias

    def _allocate_packet_id(self) -> int:
        # send_quota <= 65535 guarantees a free id exists.
        while self._next_packet_id in self._inflight:
            self._next_packet_id = self._next_packet_id % 0xFFFF + 1
        packet_id = self._next_packet_id
        self._next_packet_id = packet_id % 0xFFFF + 1
        return packet_id

    def inflight(self) -> Inflight:
        """The in-flight state a persistent session keeps when this connection ends."""
        return Inflight(tuple(self._inflight.values()), tuple(self._awaiting_pubrel.items()),
                        self._next_packet_id)

    def _restore(self, state: Inflight) -> None:
        self._inflight = {p.packet_id: (p, expect) for p, expect in state.outbound
                          if p.packet_id is not None}
        self._awaiting_pubrel = dict(state.awaiting_pubrel)
        self._next_packet_id = state.next_packet_id

    def pending_resend(self) -> list[bytes]:
        """In-flight messages to send again when a session resumes (spec 4.4): PUBLISH with
        DUP set until its PUBACK/PUBREC, then the PUBREL."""
        out = []
        for packet_id, (packet, expect) in self._inflight.items():
            again = PubRel(packet_id) if expect is PacketType.PUBCOMP else replace(packet, dup=True)
            out.append(self._encode(again))
        return out


def _publish_parts(topic: str, payload: bytes, qos: int, retain: bool, dup: bool,
                   version: int | None) -> tuple[bytes, bytes]:
    """A PUBLISH without properties or alias, encoded directly (the delivery hot path): the
    bytes before its packet id and those after (the packet id is there when QoS > 0)."""
    name = topic.encode()
    props = b"\x00" if version == MQTT_5 else b""
    size = 2 + len(name) + (2 if qos else 0) + len(props) + len(payload)
    first = 0x30 | qos << 1 | retain | dup << 3
    header = bytes((first, size)) if size < 128 else bytes((first,)) + varint(size)
    return b"".join((header, len(name).to_bytes(2, "big"), name)), props + payload


def _failed_connack(exc: MqttError, version: int | None) -> bytes:
    """The CONNACK that tells a client why its CONNECT failed, in its version when known;
    b"" when there is no code for it (MQTT 3.1.1 then just closes, spec 3.2.2.3)."""
    if version == MQTT_5:
        code = exc.reason_code if exc.reason_code in REASON_CODES_BY_PACKET[PacketType.CONNACK] \
            else ReasonCode.UnspecifiedError
        props = Properties(reason_string=str(exc)[:MAX_REASON_STRING])
        return encode(ConnAck(False, code, props), MQTT_5)
    # Spec 3.1.1 3.1.2.2: an unsupported protocol level gets CONNACK 0x01; a CONNACK in 3.1.1
    # form is what any client can read.
    v311 = exc.v311_return_code
    return b"" if v311 is None else encode(ConnAck(False, v311), MQTT_311)
