"""One AMQP connection's publishes: checked as RabbitMQ checks them, routed through the virtual
host, admitted by the queues' limits, stored once with one core send per batch, and confirmed
once durable (nacked when they cannot be stored); direct replies go straight to their consumer.
A publish read before its channel or connection closed is stored all the same: only its confirm
or return cannot go out any more. Runs on the event loop.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from pamqp.base import Frame
from pamqp.commands import Basic

from core.clock import now_ms
from core.errors import AccessDenied, NotSupported, PreconditionFailed, SluiceError
from core.model import Action, OutgoingMessage, Principal
from core.queue_features import field_type
from core.service import Broker
from core.untrusted import clip
from core.vhost_permissions import Right
from core.vhosts import VirtualHosts

from . import direct_reply, frames
from .access import EXCHANGE
from .channel_state import ChannelState, Channels
from .connection import ServerConnection
from .direct_reply import DirectReplies
from .events import PublishReceived
from .mapping import TOPIC_EXCHANGE, exchange_topic, subject_of_key, to_outgoing
from .queue_limits import QueueLimits, parse_expiration
from .reason_codes import ReplyCode
from .topology import Topology

log = logging.getLogger(__name__)

Fail = Callable[[int, Frame, Exception], None]
CC, BCC = "CC", "BCC"
"""Sender-selected distribution: headers naming more routing keys for the same publish."""


def routing_keys(routing_key: str, headers: Mapping[str, Any] | None) -> list[str]:
    """The keys a publish is routed with: its own, then the strings in its ``CC`` and ``BCC``
    headers (other items are skipped); PreconditionFailed (406) if either is not an array,
    in RabbitMQ's words."""
    keys = [routing_key]
    for name in (CC, BCC):
        extra = headers.get(name) if headers else None
        if extra is None:
            continue
        if not isinstance(extra, list):
            raise PreconditionFailed(f"invalid message: {{unacceptable_type_in_header,"
                                     f"\"{name}\",{field_type(extra)}}}")
        keys += [key for key in extra if isinstance(key, str) and key not in keys]
    return keys


class Publisher:
    """The publishes of one connection."""

    def __init__(self, broker: Broker, vhosts: VirtualHosts, queues: QueueLimits,
                 principal: Principal, topology: Topology, conn: ServerConnection,
                 channels: Channels, write_out: Callable[[], None], fail: Fail,
                 replies: DirectReplies) -> None:
        self.broker = broker
        self.vhosts = vhosts
        self.queues = queues
        self.principal = principal
        self.topology = topology
        self.conn = conn
        self._channels = channels
        self.write_out = write_out
        self._fail = fail
        self.replies = replies

    async def publish(self, events: list[PublishReceived]) -> None:
        """Route, authorize and store ``events`` (read in one go) with one core send; then
        confirm them on channels in confirm mode."""
        batch: list[tuple[int, int, OutgoingMessage]] = []
        refused: set[tuple[int, int]] = set()
        """(channel, tag) of publishes a full reject-publish queue refused: nacked."""
        pending: dict[str, tuple[int, int]] = {}
        for event in events:
            if not self.conn.accepts(event.channel):
                continue  # the broker closed its channel with an error: discarded (spec)
            try:
                replied = self._direct_reply(event)
                message = None if replied else self._prepare(event)
            except SluiceError as error:
                self._fail(event.channel, event.method, error)
                continue
            state = self._channels.of(event.channel)
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
        if not self.replies.send(self.topology.vhost, m.routing_key, properties, event.body) \
                and m.mandatory:
            self.conn.send_content(event.channel, frames.Return(
                ReplyCode.NO_ROUTE, "NO_ROUTE", m.exchange, m.routing_key), properties,
                event.body)
        return True

    def _prepare(self, event: PublishReceived) -> OutgoingMessage | None:
        """The message to store for ``event``; None when no queue is reached. A publish to
        ``amq.topic`` is always stored: MQTT subscribers and native readers of its topic are
        its consumers too."""
        m, properties = event.method, event.properties
        self._check(event)
        vhost = self.topology.vhost
        queues: dict[str, None] = {}  # in order, once each
        for key in routing_keys(m.routing_key, properties.headers):
            queues.update(dict.fromkeys(self.vhosts.route(
                vhost, m.exchange, key, properties.headers, properties.priority)))
        if properties.headers and BCC in properties.headers:  # never shown to consumers
            properties.headers = {k: v for k, v in properties.headers.items() if k != BCC}
        subject = subject_of_key(m.routing_key) if m.exchange == TOPIC_EXCHANGE \
            and m.routing_key else None
        if not queues and subject is None:  # amq.topic's topic has readers of its own
            return None
        if subject is None:  # the exchange's own topic: the vhost's write permission decided
            topic = exchange_topic(vhost, m.exchange)
        else:  # the subject space MQTT and native clients share: its publish right decides too
            topic = self.broker.topic_of_subject(subject)
            if not self.broker.subject_allowed(self.principal, Action.PUBLISH, subject):
                raise AccessDenied(f"access to exchange {clip(m.exchange)} in vhost "
                                   f"{clip(vhost)} refused for user {clip(self.principal.user)} "
                                   f"(publishing to {clip(subject)})")
        message = to_outgoing(topic, subject, m.exchange, m.routing_key, properties, event.body,
                              tuple(queues))
        delay = self.vhosts.delay_of(vhost, m.exchange, properties.headers)
        if delay:  # an x-delayed-message exchange: core's timer holds it, routed already
            message.delivery_ts = now_ms() + delay
        return message

    def _unroutable(self, event: PublishReceived, state: ChannelState, tag: int) -> None:
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
        else:
            self._log_untold(batch, error)
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

    def _log_untold(self, batch: list[tuple[int, int, OutgoingMessage]],
                    error: SluiceError | None) -> None:
        """One line for publishes that were not stored and whose publisher can no longer be
        told (no nack, no channel close), because it closed after sending them."""
        untold = sum(1 for channel, _, _ in batch if not self.conn.can_send(channel))
        if untold:
            log.warning("AMQP connection %s of user %s closed before %d of its publishes could "
                        "be stored; they were not stored: %s", self.topology.connection_id,
                        clip(self.principal.user), untold, clip(str(error), 300))
