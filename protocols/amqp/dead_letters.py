"""Dead-lettering as RabbitMQ 4 does it: a message leaving a queue (rejected, expired,
dropped by a length limit, past its delivery limit) is published again, into the log, to the
queue's dead-letter exchange, with the ``x-death`` header telling its history.

``x-death`` is a list of tables, newest first, one per (queue, reason): count, reason, queue,
time, exchange, routing-keys (and original-expiration when the message had one, which is
removed from the copy). A repeated death in the same queue for the same reason counts up and
moves its table to the front. ``x-first-death-*`` are set once, ``x-last-death-*`` each time.
A message that would go round in a cycle with no rejection in it is dropped, as RabbitMQ
drops it. Dead letters are stored in the dead-letter exchange's own topic (``amq.topic``'s
too), indexed into the queues it routes them to, never under an MQTT subject. Runs on the
event loop.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Final

from pamqp.commands import Basic

from core.errors import NotFound
from core.model import OutgoingMessage
from core.service import Broker
from core.untrusted import clip
from core.vhosts import VirtualHosts

from .mapping import (EXCHANGE_PROPERTY, ROUTING_KEY_PROPERTY, exchange_topic, to_outgoing,
                      to_properties)

log = logging.getLogger(__name__)

REJECTED: Final = "rejected"
EXPIRED: Final = "expired"
MAXLEN: Final = "maxlen"
DELIVERY_LIMIT: Final = "delivery_limit"


@dataclasses.dataclass(frozen=True, slots=True)
class DeadLetter:
    """One message leaving ``queue``: its stored properties and body, and why."""

    properties: Mapping[str, str]
    body: bytes
    reason: str


def record_death(properties: Basic.Properties, queue: str, reason: str, exchange: str,
                 routing_keys: list[str], now: datetime) -> Basic.Properties:
    """``properties`` of a message dying in ``queue`` for ``reason``, with ``x-death`` and
    the first/last death headers updated and ``expiration`` moved into the death table."""
    headers = dict(properties.headers or {})
    deaths = [d for d in headers.get("x-death", ()) if isinstance(d, Mapping)]
    for index, death in enumerate(deaths):
        if death.get("queue") == queue and death.get("reason") == reason:
            entry = dict(death)
            entry["count"] = _count(entry.get("count")) + 1
            del deaths[index]
            break
    else:
        entry = {"count": 1, "reason": reason, "queue": queue,
                 "time": now.replace(microsecond=0), "exchange": exchange,
                 "routing-keys": list(routing_keys)}
        if properties.expiration is not None:
            entry["original-expiration"] = properties.expiration
    headers["x-death"] = [entry, *deaths]
    for what, value in (("reason", reason), ("queue", queue), ("exchange", exchange)):
        headers.setdefault(f"x-first-death-{what}", value)
        headers[f"x-last-death-{what}"] = value
    fields = {name: getattr(properties, name) for name in properties.attributes()}
    fields.update(headers=headers, expiration=None)
    return Basic.Properties(**fields)


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def is_cycle(headers: Mapping[str, Any], target: str) -> bool:
    """Whether dead-lettering into queue ``target`` closes a cycle with no rejection in it
    (RabbitMQ drops the message then, so it does not circulate for ever)."""
    deaths = [d for d in headers.get("x-death", ()) if isinstance(d, Mapping)]
    if not any(d.get("queue") == target for d in deaths):
        return False
    return not any(d.get("reason") == REJECTED for d in deaths)


class DeadLetters:
    """Publishes dead letters into the log through a virtual host's exchanges."""

    def __init__(self, broker: Broker, vhosts: VirtualHosts) -> None:
        self._broker = broker
        self._vhosts = vhosts

    async def send(self, vhost: str, queue: str, exchange: str, routing_key: str | None,
                   letters: Sequence[DeadLetter]) -> None:
        """Publish ``letters`` (from queue ``queue``) to ``exchange``, each with its own
        routing keys unless ``routing_key`` is given; what reaches no queue is dropped.
        SluiceError if the store refuses them."""
        now = datetime.now(UTC)
        batch = [m for letter in letters
                 if (m := self._message(vhost, queue, exchange, routing_key, letter, now))]
        if batch:
            await self._broker.send_decided(batch)

    def _message(self, vhost: str, queue: str, exchange: str, routing_key: str | None,
                 letter: DeadLetter, now: datetime) -> OutgoingMessage | None:
        stored = letter.properties
        old_exchange = stored.get(EXCHANGE_PROPERTY, "")
        old_key = stored.get(ROUTING_KEY_PROPERTY, "")
        properties = record_death(to_properties(stored, body=letter.body), queue, letter.reason,
                                  old_exchange, [old_key], now)
        key = old_key if routing_key is None else routing_key
        host = self._vhosts.get(vhost)
        try:
            names = host.graph.route(exchange, key, properties.headers, by_client=False)
        except NotFound:
            log.debug("dead letter of queue %s in vhost %s dropped: no exchange %s",
                      clip(queue), clip(vhost), clip(exchange))
            return None
        headers = properties.headers or {}
        targets = tuple(host.named(name) for name in sorted(names)
                        if name in host.queues and not is_cycle(headers, name))
        if not targets:
            return None
        # Never under an amq.topic subject: MQTT and native readers would get a message that
        # no one was authorized to publish to that subject.
        return to_outgoing(exchange_topic(vhost, exchange), None, exchange, key, properties,
                           letter.body, targets)

