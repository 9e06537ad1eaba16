"""One AMQP connection's messages: publishes (routed through the virtual host, stored once,
confirmed once durable), basic.get, acks, and consumers pushed from the queue's signal.

A queue is a core named queue; a delivery is a pop of it, invisible to others until settled
(ack, reject/nack without requeue) or released (requeue, recover, the channel or connection
closing). Deliveries are driven by callbacks (the queue's signal, an ack making room), never a
task per message. Consumers of every connection are in one `Consumers` registry, so exclusive
consumers and deleted queues are seen across connections. Runs on the event loop.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from pamqp.base import Frame
from pamqp.commands import Basic, Confirm

from core.errors import AccessDenied, NotSupported, PreconditionFailed, SluiceError
from core.model import Action, Delivery, OutgoingMessage, Principal
from core.service import MAX_INVISIBLE_MS, Broker
from core.untrusted import clip
from core.queue_features import features, levels
from core.vhost_permissions import Right
from core.vhosts import QueueSettings, VirtualHosts

from . import direct_reply, frames
from .access import EXCHANGE, QUEUE
from .connection import ServerConnection
from .consumers import Consumers, consumer_priority
from .direct_reply import DirectReplies, ReplyConsumer
from .events import PublishReceived
from .flow_control import WriteGate
from .mapping import (TOPIC_EXCHANGE, exchange_topic, origin, subject_of_key, to_outgoing,
                      to_properties)
from .methods import ids
from .queue_limits import QueueLimits, parse_expiration
from .reason_codes import ReplyCode
from .streams import OFFSET_ARGUMENT, check_consumer, start_offset
from .topology import Topology

MAX_POP = 256
"""Most messages one consumer takes from its queue per dispatch."""
Fail = Callable[[int, Frame, Exception], None]


@dataclass(eq=False)
class _Unacked:
    queue: str
    """The named queue popped (the level, in a priority queue)."""
    offset: int
    consumer: Consumer | None
    stream: bool = False
    """Read from a stream: an ack only makes room, nothing is settled or requeued."""


@dataclass(eq=False)
class _Channel:
    """What one channel holds: confirm tags, delivery tags and its consumers."""

    confirming: bool = False
    publish_tags: itertools.count = field(default_factory=lambda: itertools.count(1))
    outstanding: set[int] = field(default_factory=set)
    """Publish tags neither acked nor nacked yet."""
    delivery_tags: itertools.count = field(default_factory=lambda: itertools.count(1))
    unacked: dict[int, _Unacked] = field(default_factory=dict)
    prefetch: int = 0
    """basic.qos (global false): the limit of each consumer of the channel."""
    global_prefetch: int = 0
    consumers: dict[str, Consumer] = field(default_factory=dict)
    flowing: bool = True
    """channel.flow: False holds back deliveries to the channel's consumers."""
    reply_address: str = ""
    """Where replies to this channel's direct reply-to consumer go (none: empty)."""
    reply_tag: str = ""
    """The consumer tag of that reply consumer."""

    def confirmed(self, tags: list[int], ok: bool) -> list[Frame]:
        """The acks (nacks) for ``tags``: one ``multiple`` when they are every outstanding tag
        up to the highest."""
        self.outstanding.difference_update(tags)
        if len(tags) > 1 and (not self.outstanding or min(self.outstanding) > max(tags)):
            top = max(tags)
            return [Basic.Ack(top, True) if ok else Basic.Nack(top, True, False)]
        return [Basic.Ack(tag) if ok else Basic.Nack(tag, False, False) for tag in tags]


class Consumer:
    """One basic.consume: pops as many messages as its prefetch window has room for."""

    def __init__(self, owner: Messages, channel: int, state: _Channel, tag: str,
                 queue: QueueSettings, m: Basic.Consume) -> None:
        self.owner = owner
        self.channel = channel
        self.state = state
        self.tag = tag
        self.vhost = owner.topology.vhost
        self.queue_name = queue.name
        self.queue = owner.vhosts.get(self.vhost).named(queue.name)
        kind = features(queue.arguments)
        self.levels = levels(self.queue, kind.max_priority)
        self.single_active = kind.single_active
        self.priority = consumer_priority(m.arguments)
        self.no_ack = m.no_ack
        self.exclusive = m.exclusive
        self.stream_offset: int | None = None
        """The next offset to read, for a consumer of a stream queue."""
        self.prefetch = state.prefetch
        self.unacked = 0
        self.active = True
        self._armed = False
        self._dispatching = False
        self._woken = False

    def room(self) -> int:
        """How many more messages this consumer may be handed now."""
        room = MAX_POP
        if self.no_ack:
            return room
        if self.prefetch:
            room = min(room, self.prefetch - self.unacked)
        if self.state.global_prefetch:
            room = min(room, self.state.global_prefetch - len(self.state.unacked))
        return room

    def has_room(self) -> bool:
        """Whether a message could go out to this consumer now."""
        return (self.active and self.room() > 0 and self.state.flowing and self.owner.gate.open
                and self.owner.conn.can_send(self.channel))

    def cancel_from_server(self) -> None:
        self.owner.cancel_from_server(self)

    def dispatch(self) -> None:
        """Deliver what the window has room for; wait for the queue's signal when it is empty."""
        if self._dispatching or not self.active:
            return
        self._dispatching = True
        try:
            self._dispatch()
        finally:
            self._dispatching = False

    def wake(self) -> None:
        """Dispatch once this event-loop iteration's work is done: the acks read together make
        room together, and one pop fills it."""
        if not self._woken:
            self._woken = True
            asyncio.get_running_loop().call_soon(self._wake)

    def _wake(self) -> None:
        self._woken = False
        self.dispatch()

    def _dispatch(self) -> None:
        owner = self.owner
        room = self.room()
        if room <= 0 or not self.state.flowing or not owner.conn.can_send(self.channel):
            return
        if not owner.gate.open:  # the client reads slowly: wait until the wire drains
            owner.gate.wait(self.dispatch)
            return
        if self.stream_offset is not None:  # a stream: read on from this consumer's offset
            popped, self.stream_offset = owner.queues.read(self.queue, self.stream_offset, room)
        elif not owner.consumers.may_take(self):  # single active, or higher priorities first
            if not self.single_active:
                self._arm()
            return
        else:
            popped = owner.queues.pop_first(self.levels, room, MAX_INVISIBLE_MS,
                                            mark=not self.no_ack)
        for delivery in popped:
            owner.deliver(self, delivery)
        owner.write_out()
        if len(popped) < room:
            self._arm()
        elif self.room() > 0:  # more may wait: taken after others had a turn
            asyncio.get_running_loop().call_soon(self.dispatch)
        else:
            owner.consumers.filled(self)

    def _arm(self) -> None:
        if not self._armed:
            self._armed = True
            self.owner.queues.signal_any(self.levels).add_done_callback(self._signalled)

    def _signalled(self, _: asyncio.Future[None]) -> None:
        self._armed = False
        self.dispatch()


class Messages:
    """The publishes, deliveries and acks of one connection."""

    def __init__(self, broker: Broker, vhosts: VirtualHosts, queues: QueueLimits,
                 consumers: Consumers, principal: Principal, topology: Topology,
                 conn: ServerConnection, write_out: Callable[[], None], fail: Fail,
                 gate: WriteGate, replies: DirectReplies) -> None:
        self.broker = broker
        self.vhosts = vhosts
        self.queues = queues
        self.consumers = consumers
        self.principal = principal
        self.topology = topology
        self.conn = conn
        self.write_out = write_out
        """Hand what the connection has to send to the wire."""
        self._fail = fail
        self.gate = gate
        """Open while the wire takes more; consumers wait on it otherwise."""
        self.replies = replies
        self._channels: dict[int, _Channel] = {}

    def _channel(self, channel: int) -> _Channel:
        state = self._channels.get(channel)
        if state is None:
            state = self._channels[channel] = _Channel()
        return state

    # ---------------------------------------------------------------- publish

    async def publish(self, events: list[PublishReceived]) -> None:
        """Route, authorize and store ``events`` (read in one go) with one core send; then
        confirm them on channels in confirm mode."""
        batch: list[tuple[int, int, OutgoingMessage]] = []
        refused: set[tuple[int, int]] = set()
        """(channel, tag) of publishes a full reject-publish queue refused: nacked."""
        pending: dict[str, tuple[int, int]] = {}
        for event in events:
            if not self.conn.can_send(event.channel):
                continue  # its channel or connection is closing: dropped, as RabbitMQ does
            try:
                replied = self._direct_reply(event)
                message = None if replied else self._prepare(event)
            except SluiceError as error:
                self._fail(event.channel, event.method, error)
                continue
            state = self._channel(event.channel)
            tag = 0
            if state.confirming:
                tag = next(state.publish_tags)
                state.outstanding.add(tag)
            if replied:
                for answer in state.confirmed([tag], True) if tag else ():
                    self.conn.send_method(event.channel, answer)
                continue
            if message is not None:
                message, full = self.queues.admit(message, pending)
                if full and tag:
                    refused.add((event.channel, tag))
                if full and message is None:  # every queue it reached is full
                    for answer in state.confirmed([tag], False) if tag else ():
                        self.conn.send_method(event.channel, answer)
                    continue
            if message is None:
                self._unroutable(event, state, tag)
            else:
                batch.append((event.channel, tag, message))
        if batch:
            await self._store(batch, refused)
        self.write_out()

    def _check(self, event: PublishReceived) -> None:
        """What RabbitMQ refuses in any publish: immediate, a bad expiration, another user's
        user_id, no write right on the exchange."""
        m, properties = event.method, event.properties
        if m.immediate:
            raise NotSupported("immediate=true")
        parse_expiration(properties.expiration)
        if properties.user_id is not None and properties.user_id != self.principal.user:
            raise PreconditionFailed(f"user_id property set to {clip(properties.user_id)} "
                                     f"but authenticated user was {clip(self.principal.user)}")
        self.topology.access.check(Right.WRITE, EXCHANGE, m.exchange)

    def _direct_reply(self, event: PublishReceived) -> bool:
        """Whether ``event`` is a direct reply, delivered (or dropped) here and not stored. A
        request naming ``amq.rabbitmq.reply-to`` gets its channel's reply address instead."""
        m, properties = event.method, event.properties
        if properties.reply_to == direct_reply.PSEUDO_QUEUE:
            state = self._channels.get(event.channel)
            if state is None or not state.reply_address:
                raise PreconditionFailed("fast reply consumer does not exist")
            properties.reply_to = state.reply_address
        if not direct_reply.is_reply(m.exchange, m.routing_key):
            return False
        self._check(event)
        if not self.replies.send(m.routing_key, properties, event.body) and m.mandatory:
            self.conn.send_content(event.channel, frames.Return(
                ReplyCode.NO_ROUTE, "NO_ROUTE", m.exchange, m.routing_key), properties,
                event.body)
        return True

    def deliver_reply(self, consumer: ReplyConsumer, routing_key: str,
                      properties: Basic.Properties, body: bytes) -> None:
        """Send a direct reply to this connection's reply ``consumer`` (no ack expected)."""
        state = self._channels.get(consumer.channel)
        if state is None or not self.conn.can_send(consumer.channel):
            return
        self.conn.send_content(consumer.channel, frames.Deliver(
            consumer.tag, next(state.delivery_tags), False, "", routing_key), properties, body)
        self.write_out()

    def _prepare(self, event: PublishReceived) -> OutgoingMessage | None:
        """The message to store for ``event``; None when no queue is reached. A publish to
        ``amq.topic`` is always stored: MQTT subscribers and native readers of its topic are
        its consumers too."""
        m, properties = event.method, event.properties
        self._check(event)
        vhost = self.topology.vhost
        queues = tuple(self.vhosts.route(vhost, m.exchange, m.routing_key, properties.headers,
                                          properties.priority))
        subject = subject_of_key(m.routing_key) if m.exchange == TOPIC_EXCHANGE \
            and m.routing_key else None
        if not queues and subject is None:  # amq.topic's topic has readers of its own
            return None
        if subject is not None:
            topic = self.broker.topic_of_subject(subject)
            allowed = self.broker.subject_allowed(self.principal, Action.PUBLISH, subject)
        else:
            topic = exchange_topic(vhost, m.exchange)
            allowed = self.broker.allowed(self.principal, Action.PUBLISH, topic)
        if not allowed:
            raise AccessDenied(f"access to exchange {clip(m.exchange)} in vhost {clip(vhost)} "
                               f"refused for user {clip(self.principal.user)} (publishing to "
                               f"{clip(subject or topic)})")
        return to_outgoing(topic, subject, m.exchange, m.routing_key, properties, event.body,
                           queues)

    def _unroutable(self, event: PublishReceived, state: _Channel, tag: int) -> None:
        m = event.method
        if m.mandatory:
            self.conn.send_content(event.channel, frames.Return(
                ReplyCode.NO_ROUTE, "NO_ROUTE", m.exchange, m.routing_key), event.properties,
                event.body)
        if tag:
            for answer in state.confirmed([tag], True):
                self.conn.send_method(event.channel, answer)

    async def _store(self, batch: list[tuple[int, int, OutgoingMessage]],
                     refused: set[tuple[int, int]]) -> None:
        messages = [message for _, _, message in batch]
        try:
            await self.broker.send_decided(messages)
            ok, error = True, None
        except SluiceError as failed:
            ok, error = False, failed
        if ok:
            self.queues.stored(messages)
        tags: dict[int, list[int]] = {}
        for channel, tag, _ in batch:
            if tag and (channel, tag) in refused:
                state = self._channels.get(channel)
                for answer in state.confirmed([tag], False) if state is not None else ():
                    self.conn.send_method(channel, answer)
            elif tag:
                tags.setdefault(channel, []).append(tag)
            elif error is not None:  # nothing else tells an unconfirmed publisher
                self._fail(channel, Basic.Publish(), error)
        for channel, channel_tags in tags.items():
            state = self._channels.get(channel)
            if state is not None:
                for answer in state.confirmed(channel_tags, ok):
                    self.conn.send_method(channel, answer)

    # ---------------------------------------------------------------- methods

    def handles(self, method: Frame) -> bool:
        return type(method) in _HANDLERS

    async def answer(self, channel: int, method: Frame) -> Frame | None:
        """Carry out ``method``; its answer, or None (nowait, acks)."""
        return _HANDLERS[type(method)](self, channel, method)

    def settle_read(self, channel: int, method: Frame) -> None:
        """Carry out an ack, nack or reject read before its channel or connection closed (no
        answer can go out any more); other methods are dropped."""
        if type(method) in _SETTLING and channel in self._channels:
            try:
                _HANDLERS[type(method)](self, channel, method)
            except SluiceError:
                pass  # an unknown tag: the channel is closing anyway

    def _select(self, channel: int, m: Confirm.Select) -> Frame | None:
        self._channel(channel).confirming = True
        return None if m.nowait else Confirm.SelectOk()

    def _qos(self, channel: int, m: Basic.Qos) -> Frame | None:
        """global=true limits the channel; global=false each consumer of the channel, those
        consuming already included. RabbitMQ leaves those at their old limit, but kombu reads
        a server that is not RabbitMQ 3.x as following the spec, where the limit changes at
        once: Celery raises it so that a worker holding countdown tasks still gets others."""
        state = self._channel(channel)
        if m.global_:
            state.global_prefetch = m.prefetch_count
        else:
            state.prefetch = m.prefetch_count
            for consumer in state.consumers.values():
                consumer.prefetch = m.prefetch_count
        self._dispatch(state)
        return Basic.QosOk()

    def _queue(self, channel: int, name: str) -> tuple[QueueSettings, str]:
        """(queue, its named queue) of a get or consume; NotFound, ResourceLocked."""
        name = self.topology.queue_name(channel, name)
        self.topology.access.check(Right.READ, QUEUE, name)
        queue = self.vhosts.get(self.topology.vhost).queue(name)
        self.topology.check_owner(name)
        named = self.vhosts.get(self.topology.vhost).named(name)
        self.queues.used(named)
        return queue, named

    def _get(self, channel: int, m: Basic.Get) -> Frame | None:
        queue, named = self._queue(channel, m.queue)
        kind = features(queue.arguments)
        if kind.stream:
            raise NotSupported(f"basic.get not supported by stream queues queue "
                               f"{clip(queue.name)} in vhost {clip(self.topology.vhost)}")
        queues = levels(named, kind.max_priority)
        popped = self.queues.pop_first(queues, 1, MAX_INVISIBLE_MS, mark=not m.no_ack)
        if not popped:
            return Basic.GetEmpty()
        delivery = popped[0]
        state = self._channel(channel)
        tag = next(state.delivery_tags)
        if m.no_ack:
            self.queues.settle(delivery.topic, delivery.queue_offset)
        else:
            state.unacked[tag] = _Unacked(delivery.topic, delivery.queue_offset, None)
        props = delivery.properties
        ready = sum(self.queues.ready(level) for level in queues)
        self.conn.send_content(channel, frames.GetOk(
            tag, delivery.attempt > 1, *origin(delivery.topic, props), ready),
            to_properties(props, delivery.born_ts), delivery.body)
        return None

    def _ack(self, channel: int, m: Basic.Ack) -> Frame | None:
        self._settle(channel, m.delivery_tag, m.multiple, False, False)
        return None

    def _nack(self, channel: int, m: Basic.Nack) -> Frame | None:
        self._settle(channel, m.delivery_tag, m.multiple, m.requeue, True)
        return None

    def _reject(self, channel: int, m: Basic.Reject) -> Frame | None:
        self._settle(channel, m.delivery_tag, False, m.requeue, True)
        return None

    def _settle(self, channel: int, tag: int, multiple: bool, requeue: bool,
                rejected: bool) -> None:
        state = self._channel(channel)
        if multiple:
            tags = [t for t in state.unacked if t <= tag or tag == 0]
        else:
            tags = [tag] if tag in state.unacked else []
        if not tags and (tag or not multiple):
            raise PreconditionFailed(f"unknown delivery tag {tag}")
        for t in tags:
            self._done(state.unacked.pop(t), requeue, rejected)
        if state.global_prefetch:  # room on the channel: any of its consumers may use it
            self._dispatch(state)

    def _done(self, unacked: _Unacked, requeue: bool, rejected: bool = False) -> None:
        if unacked.stream:  # a stream keeps its messages: an ack only makes room
            pass
        elif requeue:
            self.queues.release(unacked.queue, unacked.offset)
        elif rejected:  # dead-lettered when its queue has a dead-letter exchange
            self.queues.reject(unacked.queue, unacked.offset)
        else:
            self.queues.settle(unacked.queue, unacked.offset)
        if unacked.consumer is not None:
            unacked.consumer.unacked -= 1
            unacked.consumer.wake()

    def _recover(self, channel: int, m: Basic.Recover | Basic.RecoverAsync) -> Frame | None:
        state = self._channel(channel)
        for unacked in state.unacked.values():
            self._done(unacked, True)
        state.unacked.clear()
        self._dispatch(state)
        return Basic.RecoverOk() if isinstance(m, Basic.Recover) else None

    def _consume(self, channel: int, m: Basic.Consume) -> Frame | None:
        if m.queue == direct_reply.PSEUDO_QUEUE:
            return self._consume_replies(channel, m)
        queue, _ = self._queue(channel, m.queue)
        state = self._channel(channel)
        tag = m.consumer_tag or f"amq.ctag-{uuid.uuid4().hex}"
        if tag in state.consumers or tag == state.reply_tag:  # a connection error in RabbitMQ
            self.conn.close_connection(ReplyCode.NOT_ALLOWED, "NOT_ALLOWED - attempt to reuse "
                                       f"consumer tag {clip(tag)}", *ids(m))
            return None
        consumer = Consumer(self, channel, state, tag, queue, m)
        if features(queue.arguments).stream:
            check_consumer(queue.name, self.topology.vhost, m.no_ack, consumer.prefetch)
            consumer.stream_offset = start_offset(
                m.arguments, self.queues.bounds(consumer.queue),
                lambda ms: self.queues.offset_at(consumer.queue, ms))
        self.consumers.add(consumer)
        state.consumers[tag] = consumer
        if not m.nowait:
            self.conn.send_method(channel, Basic.ConsumeOk(tag))
        consumer.dispatch()
        return None

    def _consume_replies(self, channel: int, m: Basic.Consume) -> Frame | None:
        """basic.consume of ``amq.rabbitmq.reply-to``: this channel's reply consumer."""
        if not m.no_ack:
            raise PreconditionFailed("reply consumer cannot acknowledge")
        state = self._channel(channel)
        if state.reply_address:
            raise PreconditionFailed("reply consumer already set")
        tag = m.consumer_tag or f"amq.ctag-{uuid.uuid4().hex}"
        if tag in state.consumers:
            self.conn.close_connection(ReplyCode.NOT_ALLOWED, "NOT_ALLOWED - attempt to reuse "
                                       f"consumer tag {clip(tag)}", *ids(m))
            return None
        state.reply_address = self.replies.add(ReplyConsumer(channel, tag, self.deliver_reply))
        state.reply_tag = tag
        return None if m.nowait else Basic.ConsumeOk(tag)

    def _cancel(self, channel: int, m: Basic.Cancel) -> Frame | None:
        state = self._channel(channel)
        if state.reply_address and m.consumer_tag == state.reply_tag:
            self.replies.remove(state.reply_address)
            state.reply_address = state.reply_tag = ""
        consumer = state.consumers.pop(m.consumer_tag, None)
        if consumer is not None:
            consumer.active = False
            self.consumers.remove(consumer)
        return None if m.nowait else Basic.CancelOk(m.consumer_tag)

    # ---------------------------------------------------------------- deliveries

    def deliver(self, consumer: Consumer, delivery: Delivery) -> None:
        """Send ``delivery`` to ``consumer`` (settled at once under no_ack)."""
        state = consumer.state
        tag = next(state.delivery_tags)
        stream = consumer.stream_offset is not None
        if consumer.no_ack:
            self.queues.settle(delivery.topic, delivery.queue_offset)
        else:
            state.unacked[tag] = _Unacked(delivery.topic, delivery.queue_offset, consumer, stream)
            consumer.unacked += 1
        props = delivery.properties
        properties = to_properties(props, delivery.born_ts)
        if stream:
            properties.headers = {**(properties.headers or {}),
                                  OFFSET_ARGUMENT: delivery.queue_offset}
        self.conn.send_content(consumer.channel, frames.Deliver(
            consumer.tag, tag, delivery.attempt > 1, *origin(delivery.topic, props)),
            properties, delivery.body)

    def _dispatch(self, state: _Channel) -> None:
        for consumer in state.consumers.values():
            consumer.wake()

    def channel_details(self, channel: int) -> dict[str, Any]:
        """What `sluice channel list` shows of ``channel``: consumers, unacked deliveries,
        prefetch limits, confirm mode and unconfirmed publishes."""
        state = self._channels.get(channel) or _Channel()
        return {"consumers": len(state.consumers), "messages_unacknowledged": len(state.unacked),
                "prefetch_count": state.prefetch, "global_prefetch_count": state.global_prefetch,
                "confirm": state.confirming, "messages_unconfirmed": len(state.outstanding)}

    def flow(self, channel: int, active: bool) -> None:
        """channel.flow (answered already): stop or resume deliveries to the channel's
        consumers; unacked deliveries stay unacked."""
        state = self._channel(channel)
        state.flowing = active
        if active:
            self._dispatch(state)
        self.write_out()

    def cancel_unreadable(self, readable: Callable[[str], bool]) -> None:
        """Cancel (basic.cancel) the consumers of queues ``readable`` no longer allows; their
        unacked deliveries stay theirs to ack."""
        for state in self._channels.values():
            for consumer in [c for c in state.consumers.values() if not readable(c.queue_name)]:
                self.consumers.remove(consumer)
                self.cancel_from_server(consumer)

    def cancel_from_server(self, consumer: Consumer) -> None:
        """The queue of ``consumer`` is gone: basic.cancel if the client understands it."""
        consumer.active = False
        self._channel(consumer.channel).consumers.pop(consumer.tag, None)
        capabilities = self.conn.client_properties.get("capabilities")
        if isinstance(capabilities, dict) and capabilities.get("consumer_cancel_notify"):
            self.conn.send_method(consumer.channel, Basic.Cancel(consumer.tag, True))
            self.write_out()

    def unacked_tags(self, channel: int) -> Collection[int]:
        """The delivery tags of ``channel`` not acked, nacked or rejected yet."""
        state = self._channels.get(channel)
        return state.unacked.keys() if state is not None else ()

    def channel_closed(self, channel: int) -> None:
        """Cancel the channel's consumers and release its unacked deliveries."""
        state = self._channels.pop(channel, None)
        if state is None:
            return
        if state.reply_address:
            self.replies.remove(state.reply_address)
        for consumer in state.consumers.values():
            consumer.active = False
        for unacked in state.unacked.values():  # released first: taken over before new ones
            self._done(unacked, True)
        for consumer in state.consumers.values():
            self.consumers.remove(consumer)

    def closed(self) -> None:
        """The connection is gone: every channel's consumers and deliveries go."""
        for channel in list(self._channels):
            self.channel_closed(channel)


_HANDLERS: dict[type, Callable[[Messages, int, Any], Frame | None]] = {
    Confirm.Select: Messages._select,
    Basic.Qos: Messages._qos,
    Basic.Get: Messages._get,
    Basic.Ack: Messages._ack,
    Basic.Nack: Messages._nack,
    Basic.Reject: Messages._reject,
    Basic.Recover: Messages._recover,
    Basic.RecoverAsync: Messages._recover,
    Basic.Consume: Messages._consume,
    Basic.Cancel: Messages._cancel,
}
_SETTLING = (Basic.Ack, Basic.Nack, Basic.Reject)
"""Methods that still count when read before their channel or connection closed."""
