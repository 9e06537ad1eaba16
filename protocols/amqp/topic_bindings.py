"""Queues bound to ``amq.topic`` read subjects: each binding key's subject filter is bound in
core's fan-out, so MQTT, native and AMQP publishes alike are indexed into the queue, stored once.

``VirtualHosts`` tells ``SubjectBindings`` of every such binding (the durable ones restored at
start, before any listener takes a publish) and of each one that goes. An AMQP publish to
``amq.topic`` reaches the same queue through the exchange graph as well; core indexes it once.
Binding is authorized on the subject filter read (``check_binding``), once, before translation.
Runs on the event loop.
"""

from __future__ import annotations

import logging

from core.errors import AccessDenied, InvalidArgument
from core.model import Principal
from core.named_queues import NamedQueues
from core.service import Broker
from core.untrusted import clip

from .mapping import TOPIC_EXCHANGE, filter_of_binding_key, read_filter

log = logging.getLogger(__name__)


class SubjectBindings:
    """The ``core.vhosts.TopicMirror`` of the AMQP adapter."""

    def __init__(self, queues: NamedQueues) -> None:
        self._queues = queues

    def bound(self, vhost: str, queue: str, named: str, routing_key: str) -> None:
        subject_filter = filter_of_binding_key(routing_key)
        if subject_filter is None:  # only AMQP publishes can match it: the graph routes them
            return
        try:
            self._queues.bind(subject_filter, named, multi_anywhere=True)
        except InvalidArgument as error:  # the graph took the key, so this is not expected
            log.warning("amq.topic binding %s of queue %s in vhost %s reads AMQP publishes "
                        "only: %s", clip(routing_key), clip(queue), clip(vhost), error)

    def unbound(self, vhost: str, queue: str, named: str, routing_key: str) -> None:
        subject_filter = filter_of_binding_key(routing_key)
        if subject_filter is not None:
            self._queues.unbind(subject_filter, named)


def check_binding(broker: Broker, principal: Principal, vhost: str, source: str,
                  routing_key: str) -> None:
    """AccessDenied unless ``principal`` may subscribe to the subjects a binding of
    ``amq.topic`` with ``routing_key`` reads; nothing for other exchanges. Worded as
    RabbitMQ's topic authorization."""
    if source != TOPIC_EXCHANGE:
        return
    subject_filter = read_filter(routing_key)
    if not broker.filter_allowed(principal, subject_filter):
        raise AccessDenied(f"access to topic {clip(routing_key)} in exchange '{source}' in "
                           f"vhost {clip(vhost)} refused for user {clip(principal.user)} "
                           f"(it reads {clip(subject_filter)})")
