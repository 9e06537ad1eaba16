"""RabbitMQ's direct reply-to: RPC replies go straight to the requesting channel, no queue.

A client consumes the pseudo-queue ``amq.rabbitmq.reply-to`` (with no_ack) and publishes its
requests with ``reply_to`` set to that name; the broker rewrites it to
``amq.rabbitmq.reply-to.<token>``, the token naming that channel's reply consumer. A reply
published to the default exchange with that routing key is delivered to the consumer at once:
it is never stored, and it is dropped (returned when mandatory) once the consumer is gone, as in
RabbitMQ. Tokens are random, so a client cannot reach another's reply consumer by guessing, and
an address belongs to the virtual host of its consumer: a reply published on another virtual
host reaches no one (dropped, or returned when mandatory), whoever learned the address.
Runs on the event loop.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass

from pamqp.commands import Basic

PSEUDO_QUEUE = "amq.rabbitmq.reply-to"
"""What a reply consumer consumes and a request names as its reply_to."""
PREFIX = PSEUDO_QUEUE + "."
"""The start of a reply address (the routing key of a reply)."""


@dataclass(frozen=True, eq=False)
class ReplyConsumer:
    """The reply consumer of one channel, and how to hand it a reply."""

    channel: int
    tag: str
    deliver: Callable[[ReplyConsumer, str, Basic.Properties, bytes], None]
    """``deliver(consumer, routing key, properties, body)``: send it as a basic.deliver."""
    vhost: str
    """The virtual host of the consumer's connection: only replies published there reach it."""


class DirectReplies:
    """Every reply consumer of every connection, by token."""

    def __init__(self) -> None:
        self._by_token: dict[str, ReplyConsumer] = {}

    def add(self, consumer: ReplyConsumer) -> str:
        """Register ``consumer``; its reply address."""
        token = secrets.token_urlsafe(18)
        self._by_token[token] = consumer
        return PREFIX + token

    def remove(self, address: str) -> None:
        self._by_token.pop(address.removeprefix(PREFIX), None)

    def send(self, vhost: str, routing_key: str, properties: Basic.Properties, body: bytes) -> bool:
        """Deliver a reply published on ``vhost`` to the default exchange with ``routing_key``
        (a reply address); False when no reply consumer of ``vhost`` has that address (any
        more)."""
        consumer = self._by_token.get(routing_key.removeprefix(PREFIX))
        if consumer is None or consumer.vhost != vhost:
            return False
        consumer.deliver(consumer, routing_key, properties, body)
        return True


def is_reply(exchange: str, routing_key: str) -> bool:
    """Whether a publish with ``exchange`` and ``routing_key`` is a direct reply."""
    return exchange == "" and routing_key.startswith(PREFIX)
