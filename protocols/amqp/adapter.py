"""One AMQP client connection: bytes from a `Wire` into the sans-IO `ServerConnection`, its
events onto core, and the answers back to the wire.

Writes are collected and handed to the wire once per event-loop iteration. The login runs as
a task (reading pauses meanwhile); channel methods run in order, one at a time, on a task that
lives while any wait, because core's declares await metadata writes.

Whatever ends a channel or the connection (the client's close, a dropped socket, our close),
what was read before it is carried out first, in order, as RabbitMQ's channel processes work
through their mailboxes: a client's close is answered once its publishes are stored, and the
connection is torn down (consumers released, exclusive queues deleted) only after that. Only
what was read on a channel the broker closed with an error is discarded (`ServerConnection.
accepts`), and what an open transaction holds is rolled back. Runs on the event loop; not
thread-safe.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import deque
from collections.abc import Coroutine
from dataclasses import replace
from typing import Any, Protocol

from pamqp.commands import Basic

from core.clients import log_connected, log_disconnected
from core.errors import NotFound, SluiceError
from core.model import Principal
from core.service import Broker
from core.traffic import ClientCounters, Traffic
from core.untrusted import DenialLog, clip
from core.vhost_permissions import Right, VhostPermissions
from core.vhosts import VirtualHosts

from .access import EXCHANGE, VhostAccess
from .alarms import Alarms
from .connection import Options, ServerConnection
from .direct_reply import DirectReplies
from .errors import reply_code
from .events import (ChannelClosed, CloseRequested, ConnectionClosed, Event, FlowChanged,
                     LoginRequested, MethodReceived, PublishReceived, VhostRequested)
from .flow_control import FlowControl, WriteGate
from .login import Refused, log_in, peer_host
from .consumers import Consumers
from .messages import Messages
from .methods import EXTERNAL, ids
from .publish_pipeline import PublishPipeline
from .options import AmqpOptions
from .queue_limits import QueueLimits
from .reason_codes import ReplyCode
from .state_table import State
from .topology import QueueWatch, Topology
from .transactions import Transactions

log = logging.getLogger(__name__)

PROTOCOL = "amqp"
"""The protocol's name in client lists and connect/disconnect log lines."""
MAX_PENDING_METHODS = 256
"""Methods read but not yet carried out before reading pauses."""
MAX_UNFLUSHED = 64 << 10
"""Bytes collected for the wire before they are handed to it within the same iteration."""
_WORK = (MethodReceived, PublishReceived, ChannelClosed, FlowChanged, CloseRequested)
"""Events carried out in order on the adapter's task."""


class Wire(Protocol):
    """A byte pipe to one client (``listener.AmqpWire``, or a fake one in tests)."""

    peer: str

    def write(self, data: bytes) -> None: ...

    def close(self) -> None: ...

    def abort(self) -> None: ...

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...


class Host(QueueWatch, Protocol):
    """What an adapter needs from the front end (``frontend.AmqpFrontend``)."""

    broker: Broker
    vhosts: VirtualHosts
    permissions: VhostPermissions
    queues: QueueLimits
    consumers: Consumers
    replies: DirectReplies
    options: AmqpOptions
    connection_options: Options
    denials: DenialLog
    alarms: Alarms
    traffic: Traffic

    def spawn(self, coroutine: Coroutine[Any, Any, None]) -> None: ...

    def opened(self, adapter: AmqpAdapter) -> None: ...

    def closed(self, adapter: AmqpAdapter) -> None: ...


class AmqpAdapter:
    """The front end's handler for one wire."""

    def __init__(self, host: Host, wire: Wire) -> None:
        self.host = host
        self.wire = wire
        self.id = f"amqp-{uuid.uuid4().hex[:16]}"
        """The client id in `sluice client list`; owner of its exclusive queues."""
        options = host.connection_options
        if getattr(wire, "certificate_user", None) is not None:
            options = replace(options, mechanisms=(*options.mechanisms, EXTERNAL))
        opened = time.monotonic()
        self.conn = ServerConnection(options, opened)
        self.counters = ClientCounters(opened)
        """This connection's messages and rates, for the admin API's client list."""
        self.flow = FlowControl(wire, MAX_PENDING_METHODS)
        self.gate = WriteGate()
        self.publishing = PublishPipeline(MAX_PENDING_METHODS, lambda error: self.kick(
            ReplyCode.INTERNAL_ERROR, "publishes could not be stored; resend the unconfirmed ones"))
        """Publish batches waiting for durability while the next ones are read and stored."""
        self.loop = asyncio.get_running_loop()
        self.principal: Principal | None = None
        self.topology: Topology | None = None
        """Set once connection.open is answered."""
        self.messages: Messages | None = None
        """Publishes and deliveries; set with ``topology``."""
        self.transactions: Transactions | None = None
        """tx.* and confirm.select; set with ``topology``."""
        self.connected_at_ms: int | None = None
        self.publisher = False
        """Whether it has published: a resource alarm blocks only publishers."""
        self.blocked = False
        self._work: deque[Event] = deque()
        self._working = False
        self._done = False
        """The wire is finished: nothing more is read from it or written to it."""
        self._ended: ConnectionClosed | None = None
        """How the connection ended; it is torn down once the work read before is done."""
        self._refusal_logged = False
        self._out: list[bytes] = []
        """What goes to the wire at the end of this iteration, joined once there."""
        self._out_size = 0
        self._flush_scheduled = False

    @property
    def peer(self) -> str:
        return self.wire.peer

    def details(self) -> dict[str, object]:
        """What `sluice client show` adds for an AMQP connection."""
        props = self.conn.client_properties
        return {"vhost": self.topology.vhost if self.topology else None,
                "channels": self.conn.open_channels, "heartbeat_s": self.conn.heartbeat,
                "frame_max": self.conn.frame_max,
                "connection_name": clip(props.get("connection_name", ""), 100),
                "product": clip(props.get("product", ""), 100)}

    # ---------------------------------------------------------------- wire side

    def data_received(self, data: bytes) -> None:
        """Bytes from the client, in order."""
        if not self._done:
            self.host.traffic.bytes_received += len(data)
            self.conn.receive_data(data, time.monotonic())
            self._drain()

    def connection_lost(self) -> None:
        """The socket is gone (called once)."""
        if not self._done:
            self.conn.receive_data(b"", time.monotonic())
            self._drain()

    def check_timeouts(self, now: float) -> None:
        """Handshake timeout, heartbeats, close-ok wait (the front end's sweep calls this)."""
        if not self._done:
            self.conn.check_timeouts(now)
            self._drain()

    def refuse_at_once(self) -> None:
        """Close a connection beyond the limits: nothing is read from it or sent."""
        self._done = True
        self.wire.abort()

    def kick(self, code: ReplyCode, text: str) -> bool:
        """Close from the broker's side with connection.close; False if already closing."""
        if self._done or self.conn.state in (State.CLOSE_RECEIVED, State.CLOSING, State.CLOSED):
            return False
        if self.conn.state is State.AWAITING_HEADER:  # nothing may be sent before the header
            self.refuse_at_once()
            self.host.closed(self)
            return True
        self.conn.close_connection(code, f"{code.name} - {text}")
        self._drain()
        return True

    def alarm_changed(self) -> None:
        """The broker's resource alarm went on or off: block or unblock this connection."""
        if self._done or self.connected_at_ms is None:
            return
        if self.host.alarms.reason is not None:
            if self.publisher and not self.blocked:
                self._block()
        elif self.blocked:
            self.blocked = False
            self.conn.reading_paused(False, time.monotonic())
            self.flow.resume("alarm")
            self.conn.unblock()
            self._write_all(self.conn.chunks_to_send())

    def _block(self) -> None:
        """Stop reading (what was read is still carried out) and tell the client why."""
        self.blocked = True
        self.flow.pause("alarm")
        self.conn.reading_paused(True, time.monotonic())
        self.conn.block(self.host.alarms.reason or "")
        self._write_all(self.conn.chunks_to_send())

    def pause_writing(self) -> None:
        """The wire's write buffer is above its high-water mark: deliveries wait, and so does
        reading, so a client that sends requests (basic.get) but reads no answers cannot make
        the broker buffer them."""
        self.gate.shut()
        self.flow.pause("writing")

    def resume_writing(self) -> None:
        """The wire drained: reading and waiting consumers go on."""
        if not self._done:
            self.flow.resume("writing")
            self.gate.reopen()

    async def _writable(self) -> None:
        """Return once the wire drained (or the connection is gone)."""
        drained = self.loop.create_future()
        self.gate.wait(lambda: drained.done() or drained.set_result(None))
        await drained

    def _write_all(self, chunks: list[bytes]) -> None:
        """Queue ``chunks`` for the wire (the connection's frames, not copied here)."""
        if not chunks or self._done:
            return
        self._out += chunks
        self._out_size += sum(map(len, chunks))
        if self._out_size >= MAX_UNFLUSHED:  # the wire sees it now, and can say it is full
            self._flush()
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._out and not self._done:
            self.host.queues.flush_marks()  # before deliveries go out: redelivered after a crash
            self.wire.write(b"".join(self._out))
            self.host.traffic.bytes_sent += self._out_size
        self._out.clear()
        self._out_size = 0

    # ---------------------------------------------------------------- events

    def _drain(self) -> None:
        conn = self.conn
        while (event := conn.next_event()) is not None:
            kind = type(event)
            if kind in _WORK:
                if kind is MethodReceived and not self._working and not self._work \
                        and self._acked_now(event):
                    continue
                self._work.append(event)
                if kind is PublishReceived:
                    self.host.traffic.messages_published += 1
                    self.counters.published += 1
                    self.publisher = True
                    if self.host.alarms.reason is not None and not self.blocked:
                        self._block()
            elif kind is LoginRequested:
                self.flow.pause("login")
                self.host.spawn(self._login(event))
            elif kind is VhostRequested:
                self._open(event.vhost)
            elif kind is ConnectionClosed:
                self._wire_ended(event)
        self._write_all(conn.chunks_to_send())
        self.flow.pending(len(self._work))
        if self._working:
            return
        if self._work or (self._ended is not None and not self.publishing.idle()):
            self._working = True
            self.host.spawn(self._run())
        elif self._ended is not None:
            self._tear_down(self._ended)

    async def _login(self, event: LoginRequested) -> None:
        user = event.user or getattr(self.wire, "certificate_user", None) or ""  # EXTERNAL: the CN
        try:
            principal = await log_in(self.host.broker, event, self.peer,
                                     self.host.options.guest_from_loopback,
                                     getattr(self.wire, "certificate_user", None))
        except Refused as refused:
            self.host.denials.denied(peer_host(self.peer), "login",
                                     "AMQP login of user %s from %s refused: %s",
                                     clip(user), self.peer, clip(refused.detail, 300))
            self._refusal_logged = True
            if self.conn.state is State.LOGIN_REQUESTED:
                self.conn.refuse_login(refused.reason)
        except Exception:  # noqa: BLE001 - one failed login must not leave the client waiting
            log.exception("AMQP login of user %s from %s failed", clip(user), self.peer)
            if self.conn.state is State.LOGIN_REQUESTED:
                self.conn.refuse_login()
        else:
            self.principal = principal
            if self.conn.state is State.LOGIN_REQUESTED:
                self.conn.accept_login()
        self.flow.resume("login")
        self._drain()

    def _open(self, vhost: str) -> None:
        assert self.principal is not None
        try:
            self.host.vhosts.get(vhost)
        except NotFound:
            self.conn.refuse_vhost(f"vhost {vhost[:200]} not found")
            return
        host = self.host
        if not host.permissions.may_open(self.principal, vhost):
            self.conn.refuse_vhost(f"access to vhost {clip(vhost)} refused for user "
                                   f"{clip(self.principal.user)}")
            return
        self.conn.open_vhost()
        access = VhostAccess(host.permissions, self.principal, vhost)
        self.topology = Topology(host.vhosts, vhost, self.principal, self.id, host, access)
        self.messages = Messages(host.broker, host.vhosts, host.queues, host.consumers,
                                 self.principal, self.topology, self.conn, self._write_out,
                                 self._fail, self.gate, host.replies, host.traffic,
                                 self.counters)
        self.transactions = Transactions(self.messages)
        self.connected_at_ms = time.time_ns() // 1_000_000
        self.host.opened(self)
        host.traffic.connections_opened += 1
        log_connected(PROTOCOL, self.id, self.principal.user, self.peer,
                      f"vhost {clip(vhost)}, heartbeat {self.conn.heartbeat} s, "
                      f"{clip(self.conn.client_properties.get('product', ''), 60)}")

    def _write_out(self) -> None:
        self._write_all(self.conn.chunks_to_send())

    async def _run(self) -> None:
        """Carry out queued channel events in order; publishes read one after another are
        stored together. Goes on after the wire ended: what was read is carried out."""
        work = self._work
        try:
            while work:
                event = work.popleft()
                if self._discarded(event) or self._acked_now(event) or self._held(event):
                    pass
                elif isinstance(event, PublishReceived):
                    batch = [event]
                    while work and isinstance(work[0], PublishReceived) \
                            and not self._transactional(work[0].channel):
                        batch.append(work.popleft())
                    assert self.messages is not None
                    await self.publishing.submit(self.messages.publish(batch), len(batch))
                else:
                    await self.publishing.drain()  # what was published before it is confirmed
                    await self._carry_out(event)
                self._write_all(self.conn.chunks_to_send())
                self.flow.pending(len(self._work))
            if self._ended is not None:
                await self.publishing.drain()  # stored before the teardown releases channels
        finally:
            self._working = False
        self._drain()  # a close decided above, bytes read meanwhile, or the teardown

    def _discarded(self, event: Event) -> bool:
        """Whether ``event`` was read on a channel the broker has closed with an error (a
        channel's own `ChannelClosed` is always carried out)."""
        return isinstance(event, (MethodReceived, PublishReceived, FlowChanged)) \
            and not self.conn.accepts(event.channel)

    def _acked_now(self, event: Event) -> bool:
        """Carry out a basic.ack at once, without a coroutine, when nothing read before it
        waits (the method every consumed message brings back); whether it was one."""
        if type(event) is not MethodReceived or type(event.method) is not Basic.Ack \
                or self.messages is None or not self.publishing.idle():
            return False
        if self._discarded(event) or self._held(event):  # a transaction's, for its commit
            return True
        try:
            self.messages.ack(event.channel, event.method)
        except Exception as error:  # noqa: BLE001 - answered on the wire, as _carry_out does
            self._fail(event.channel, event.method, error)
        return True

    def _transactional(self, channel: int) -> bool:
        return self.transactions is not None and self.transactions.transactional(channel)

    def _held(self, event: Event) -> bool:
        """Whether a transaction keeps ``event`` for its commit (a refusal closes the channel)."""
        if self.transactions is None or not isinstance(event, (PublishReceived, MethodReceived)):
            return False
        try:
            if isinstance(event, PublishReceived) and self._transactional(event.channel):
                assert self.topology is not None  # refused at publish time, as RabbitMQ does
                self.topology.access.check(Right.WRITE, EXCHANGE, event.method.exchange)
            return self.transactions.hold(event)
        except SluiceError as error:
            self._fail(event.channel, event.method, error)
            return True

    async def _carry_out(self, event: Event) -> None:
        topology, messages, conn = self.topology, self.messages, self.conn
        transactions = self.transactions
        assert topology is not None and messages is not None and transactions is not None
        if isinstance(event, CloseRequested):
            conn.finish_close()  # everything read before it is done (and stored)
            return
        if isinstance(event, ChannelClosed):
            topology.channel_closed(event.channel)
            messages.channel_closed(event.channel)
            transactions.channel_closed(event.channel)
            conn.finish_channel_close(event.channel)
            return
        if self._discarded(event):  # its channel was closed by an error while it waited
            return
        if isinstance(event, FlowChanged):
            messages.flow(event.channel, event.active)
            return
        assert isinstance(event, MethodReceived)
        method = event.method
        if isinstance(method, Basic.Get) and not self.gate.open:
            await self._writable()  # its answer carries a message: not while the wire is full
            if self._done:
                return
        handler: Transactions | Topology | Messages = (
            transactions if transactions.handles(method)
            else messages if messages.handles(method) else topology)
        if not handler.handles(method):
            conn.close_connection(ReplyCode.NOT_IMPLEMENTED, f"NOT_IMPLEMENTED - {method.name} "
                                  "is not supported by Sluice yet", *ids(method),
                                  channel=event.channel)
            return
        try:
            answer = await handler.answer(event.channel, method)
        except Exception as error:  # noqa: BLE001 - every failure is answered on the wire
            self._fail(event.channel, method, error)
            return
        if answer is not None:
            conn.send_method(event.channel, answer)

    def _fail(self, channel: int, method: Any, error: Exception) -> None:
        if not isinstance(error, SluiceError):
            log.exception("AMQP %s from %s failed", method.name, self.peer)
        code = reply_code(error)
        text = f"{code.name} - {error}"
        if self.conn.state is not State.OPEN:
            return  # the client is closing: nobody to tell
        if code.hard:
            self.conn.close_connection(code, text, *ids(method), channel=channel)
        elif self.conn.can_send(channel):
            self.conn.close_channel(channel, code, text, *ids(method))

    def _wire_ended(self, event: ConnectionClosed) -> None:
        """The connection is over on the wire: send the last frames (a close-ok, a close) and
        close it. The teardown waits for what was read before."""
        self._write_all(self.conn.chunks_to_send())
        self._flush()
        self._done = True
        self._ended = event
        self.wire.close()
        self.gate.reopen()  # whatever waits for the wire to drain stops waiting

    def _tear_down(self, event: ConnectionClosed) -> None:
        """Everything read is carried out: release what the connection held (once)."""
        self._ended = None
        if not event.by_client and not self._refusal_logged:
            self._log_closed(event)
        if self.connected_at_ms is not None and self.principal is not None:
            log_disconnected(PROTOCOL, self.id, self.principal.user, self.peer,
                             _close_reason(event))
        if self.messages is not None:
            self.messages.closed()
        if self.transactions is not None:
            self.transactions.closed()
        if self.topology is not None and self.topology.exclusive:
            self.host.spawn(self.topology.delete_exclusive())
        self.host.closed(self)

    def _log_closed(self, event: ConnectionClosed) -> None:
        """One line for a connection closed for an error; before login, one per peer host
        and reason a minute, so nobody fills the log by connecting."""
        if event.reply_code == ReplyCode.REPLY_SUCCESS:
            return
        code = _code_name(event.reply_code)
        if self.connected_at_ms is None:
            self.host.denials.denied(peer_host(self.peer), code,
                                     "AMQP connection from %s closed: %s %s", self.peer, code,
                                     clip(event.reply_text))
        else:
            log.info("AMQP connection %s from %s closed: %s %s", self.id, self.peer, code,
                     clip(event.reply_text))


def _code_name(code: int) -> str:
    try:
        return ReplyCode(code).name
    except ValueError:
        return str(code)


def _close_reason(event: ConnectionClosed) -> str:
    """Why a connection ended, for its disconnect line."""
    if event.by_client:
        return "closed by the client" if event.reply_code == ReplyCode.REPLY_SUCCESS \
            else f"closed by the client: {clip(event.reply_text)}"
    return clip(event.reply_text)
