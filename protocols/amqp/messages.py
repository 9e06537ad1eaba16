"""One AMQP connection's messages: publishes (``publishing.Publisher``), basic.get, acks, and
deliveries to its consumers (``consumer.Consumer``).

A queue is a core named queue; a delivery is a pop of it, invisible to others until settled
(ack, reject/nack without requeue) or released (requeue, recover, the channel or connection
closing). Consumers of every connection are in one `Consumers` registry, so exclusive
consumers and deleted queues are seen across connections. Runs on the event loop.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Collection
from typing import Any

from pamqp.base import Frame
from pamqp.commands import Basic, Confirm

from core.acl import Withheld
from core.errors import NotSupported, PreconditionFailed
from core.model import Delivery, Principal
from core.queue_features import features, levels
from core.service import MAX_INVISIBLE_MS, Broker
from core.traffic import ClientCounters, Traffic
from core.untrusted import clip
from core.vhost_permissions import Right
from core.vhosts import QueueSettings, VirtualHosts

from . import direct_reply, frames
from .access import QUEUE
from .channel_state import ChannelState, Channels, Unacked
from .connection import ServerConnection
from .consumer import Consumer
from .consumers import Consumers
from .direct_reply import DirectReplies, ReplyConsumer
from .events import PublishReceived
from .flow_control import WriteGate
from .mapping import origin, properties_payload, to_properties
from .methods import ids
from .publishing import Fail, Publisher
from .queue_limits import QueueLimits
from .reason_codes import ReplyCode
from .streams import OFFSET_ARGUMENT, check_consumer, start_offset
from .topology import Topology


class Messages:
    """The publishes, deliveries and acks of one connection."""

    def __init__(self, broker: Broker, vhosts: VirtualHosts, queues: QueueLimits,
                 consumers: Consumers, principal: Principal, topology: Topology,
                 conn: ServerConnection, write_out: Callable[[], None], fail: Fail,
                 gate: WriteGate, replies: DirectReplies, traffic: Traffic,
                 counters: ClientCounters) -> None:
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
        self.traffic = traffic
        """The protocol's counters: deliveries and acks are added here."""
        self.counters = counters
        """The connection's own: deliveries are added here too."""
        self._channels = Channels()
        self.publisher = Publisher(broker, vhosts, queues, principal, topology, conn,
                                   self._channels, write_out, fail, replies)

    def withheld(self) -> Withheld | None:
        """What the access rules withhold from this connection's user now: messages whose
        subject a rule denies it (``Broker.withheld_by_rules``); asked again for every pop."""
        return self.broker.withheld_by_rules(self.principal)

    async def publish(self, events: list[PublishReceived]) -> None:
        """Store ``events`` and confirm them (``Publisher.publish``)."""
        await self.publisher.publish(events)

    def deliver_reply(self, consumer: ReplyConsumer, routing_key: str,
                      properties: Basic.Properties, body: bytes) -> None:
        """Send a direct reply to this connection's reply ``consumer`` (no ack expected)."""
        state = self._channels.get(consumer.channel)
        if state is None or not self.conn.can_send(consumer.channel):
            return
        self.traffic.messages_delivered += 1
        self.counters.delivered += 1
        self.conn.send_content(consumer.channel, frames.Deliver(
            consumer.tag, next(state.delivery_tags), False, "", routing_key), properties, body)
        self.write_out()

    # ---------------------------------------------------------------- methods

    def handles(self, method: Frame) -> bool:
        return type(method) in _HANDLERS

    async def answer(self, channel: int, method: Frame) -> Frame | None:
        """Carry out ``method``; its answer, or None (nowait, acks)."""
        return _HANDLERS[type(method)](self, channel, method)

    def _select(self, channel: int, m: Confirm.Select) -> Frame | None:
        self._channels.of(channel).confirming = True
        return None if m.nowait else Confirm.SelectOk()

    def _qos(self, channel: int, m: Basic.Qos) -> Frame | None:
        """global=true limits the channel; global=false each consumer of the channel, those
        consuming already included. RabbitMQ leaves those at their old limit, but kombu reads
        a server that is not RabbitMQ 3.x as following the spec, where the limit changes at
        once: Celery raises it so that a worker holding countdown tasks still gets others."""
        state = self._channels.of(channel)
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
        if not self.conn.can_send(channel):  # read before a close: nothing could go out
            return None
        queue, named = self._queue(channel, m.queue)
        kind = features(queue.arguments)
        if kind.stream:
            raise NotSupported(f"basic.get not supported by stream queues queue "
                               f"{clip(queue.name)} in vhost {clip(self.topology.vhost)}")
        queues = levels(named, kind.max_priority)
        popped = self.queues.pop_first(queues, 1, MAX_INVISIBLE_MS, mark=not m.no_ack,
                                       withheld=self.withheld())
        if not popped:
            return Basic.GetEmpty()
        delivery = popped[0]
        if self.queues.tracer.on:
            self.queues.tracer.delivered(delivery.topic, "basic.get", popped, queue.name)
        state = self._channels.of(channel)
        tag = next(state.delivery_tags)
        if m.no_ack:
            self.queues.settle(delivery.topic, delivery.queue_offset)
        else:
            state.unacked[tag] = Unacked(delivery.topic, delivery.queue_offset, None)
        props = delivery.properties
        ready = sum(self.queues.ready(level) for level in queues)
        self.traffic.messages_delivered += 1
        self.counters.delivered += 1
        self.conn.send_content(channel, frames.GetOk(
            tag, delivery.attempt > 1, *origin(delivery.topic, props), ready),
            to_properties(props, delivery.born_ts, delivery.body), delivery.body)
        return None

    def ack(self, channel: int, m: Basic.Ack) -> None:
        """basic.ack (never answered); PreconditionFailed for an unknown tag."""
        self._settle(channel, m.delivery_tag, m.multiple, False, False)

    def _ack(self, channel: int, m: Basic.Ack) -> Frame | None:
        self.ack(channel, m)
        return None

    def _nack(self, channel: int, m: Basic.Nack) -> Frame | None:
        self._settle(channel, m.delivery_tag, m.multiple, m.requeue, True)
        return None

    def _reject(self, channel: int, m: Basic.Reject) -> Frame | None:
        self._settle(channel, m.delivery_tag, False, m.requeue, True)
        return None

    def _settle(self, channel: int, tag: int, multiple: bool, requeue: bool,
                rejected: bool) -> None:
        state = self._channels.of(channel)
        if multiple:
            tags = [t for t in state.unacked if t <= tag or tag == 0]
        else:
            tags = [tag] if tag in state.unacked else []
        if not tags and (tag or not multiple):
            raise PreconditionFailed(f"unknown delivery tag {tag}")
        for t in tags:
            self._done(state.unacked.pop(t), requeue, rejected)
        if not requeue and not rejected:
            self.traffic.messages_acked += len(tags)
        if state.global_prefetch:  # room on the channel: any of its consumers may use it
            self._dispatch(state)

    def _done(self, unacked: Unacked, requeue: bool, rejected: bool = False) -> None:
        if self.queues.tracer.on and not unacked.stream:
            self._trace_done(unacked, requeue, rejected)
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

    def _trace_done(self, unacked: Unacked, requeue: bool, rejected: bool) -> None:
        tracer, queue, offset = self.queues.tracer, unacked.queue, unacked.offset
        if requeue:
            tracer.requeued(queue, queue, 0, offset)
        elif rejected:
            tracer.rejected(queue, queue, 0, offset)
        else:
            tracer.acked(queue, queue, 0, offset)

    def _recover(self, channel: int, m: Basic.Recover | Basic.RecoverAsync) -> Frame | None:
        state = self._channels.of(channel)
        for unacked in state.unacked.values():
            self._done(unacked, True)
        state.unacked.clear()
        self._dispatch(state)
        return Basic.RecoverOk() if isinstance(m, Basic.Recover) else None

    def _consume(self, channel: int, m: Basic.Consume) -> Frame | None:
        if m.queue == direct_reply.PSEUDO_QUEUE:
            return self._consume_replies(channel, m)
        queue, named = self._queue(channel, m.queue)
        state = self._channels.of(channel)
        tag = m.consumer_tag or f"amq.ctag-{uuid.uuid4().hex}"
        if tag in state.consumers or tag == state.reply_tag:  # a connection error in RabbitMQ
            self.conn.close_connection(ReplyCode.NOT_ALLOWED, "NOT_ALLOWED - attempt to reuse "
                                       f"consumer tag {clip(tag)}", *ids(m),
                                       channel=channel)
            return None
        consumer = Consumer(self, channel, state, tag, self.topology.vhost, queue, named,
                            m)
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
        state = self._channels.of(channel)
        if state.reply_address:
            raise PreconditionFailed("reply consumer already set")
        tag = m.consumer_tag or f"amq.ctag-{uuid.uuid4().hex}"
        if tag in state.consumers:
            self.conn.close_connection(ReplyCode.NOT_ALLOWED, "NOT_ALLOWED - attempt to reuse "
                                       f"consumer tag {clip(tag)}", *ids(m),
                                       channel=channel)
            return None
        state.reply_address = self.replies.add(ReplyConsumer(channel, tag, self.deliver_reply,
                                                             self.topology.vhost))
        state.reply_tag = tag
        return None if m.nowait else Basic.ConsumeOk(tag)

    def _cancel(self, channel: int, m: Basic.Cancel) -> Frame | None:
        state = self._channels.of(channel)
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
        if self.queues.tracer.on and not stream:
            self.queues.tracer.delivered(delivery.topic, consumer.tag, (delivery,), consumer.queue_name)
        if consumer.no_ack:
            self.queues.settle(delivery.topic, delivery.queue_offset)
        else:
            state.unacked[tag] = Unacked(delivery.topic, delivery.queue_offset, consumer, stream)
            consumer.unacked += 1
        props = delivery.properties
        if stream:
            properties = to_properties(props, delivery.born_ts, delivery.body)
            properties.headers = {**(properties.headers or {}),
                                  OFFSET_ARGUMENT: delivery.queue_offset}
            payload = properties.marshal()
        else:
            payload = properties_payload(props, delivery.born_ts, delivery.body)
        self.traffic.messages_delivered += 1
        self.counters.delivered += 1
        self.conn.send_delivery(consumer.channel, consumer.tag, tag, delivery.attempt > 1,
                                *origin(delivery.topic, props), payload, delivery.body)

    def _dispatch(self, state: ChannelState) -> None:
        for consumer in state.consumers.values():
            consumer.wake()

    def consumed(self) -> tuple[str, ...]:
        """The queues this connection's consumers read, each once, sorted."""
        return tuple(sorted({consumer.queue_name for state in self._channels.values()
                             for consumer in state.consumers.values()}))

    def unacked(self) -> int:
        """Deliveries over every channel the client has not acked or rejected yet."""
        return sum(len(state.unacked) for state in self._channels.values())

    def channel_details(self, channel: int) -> dict[str, Any]:
        """What `sluice channel list` shows of ``channel``: consumers, unacked deliveries,
        prefetch limits, confirm mode and unconfirmed publishes."""
        state = self._channels.get(channel) or ChannelState()
        return {"consumers": len(state.consumers), "messages_unacknowledged": len(state.unacked),
                "prefetch_count": state.prefetch, "global_prefetch_count": state.global_prefetch,
                "confirm": state.confirming, "messages_unconfirmed": len(state.outstanding)}

    def flow(self, channel: int, active: bool) -> None:
        """channel.flow (answered already): stop or resume deliveries to the channel's
        consumers; unacked deliveries stay unacked."""
        state = self._channels.of(channel)
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
        self._channels.of(consumer.channel).consumers.pop(consumer.tag, None)
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
