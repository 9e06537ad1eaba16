"""Asking producers to decide transactions left open, as RocketMQ 5 brokers do.

Core calls `TransactionChecks.ask` for a transaction no decision arrived for; it is written, as
a ``RecoverOrphanedTransactionCommand`` carrying the message, on the Telemetry stream of a
producer that named the topic in its settings and may publish to it (the message goes to no
one else). The producer's ``TransactionChecker`` answers with EndTransaction. Producers of a
topic take turns.
"""

from __future__ import annotations

import asyncio
import itertools
import logging

from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc

from core.model import Action, Delivery

from .context import Edge
from .convert import delivered, now_ms

log = logging.getLogger("sluice.native")


class TransactionChecks:
    """Writes transaction checks on producers' Telemetry streams (core's ``Checker``)."""

    def __init__(self, edge: Edge) -> None:
        self._edge = edge
        self._turn = itertools.count()

    def ask(self, topic: str, message: Delivery, transaction_id: str) -> bool:
        """Queue a check of ``transaction_id`` for one producer of ``topic``; False when none
        that may publish to it is connected."""
        broker = self._edge.broker
        streams = [stream for stream in self._edge.connections.publishers_of(topic)
                   if broker.allowed(stream.principal, Action.PUBLISH, topic)]
        if not streams:
            return False
        resource = pb.Resource(name=topic)
        command = rpc.TelemetryCommand(
            recover_orphaned_transaction_command=rpc.RecoverOrphanedTransactionCommand(
                message=delivered(message, resource, broker.get_topic(topic).message_type,
                                  self._edge.store_host(), now_ms()),
                transaction_id=transaction_id))
        start = next(self._turn)
        for i in range(len(streams)):
            stream = streams[(start + i) % len(streams)]
            try:
                stream.outbox.put_nowait(command)
                return True
            except asyncio.QueueFull:
                log.warning("client %s has %d commands waiting; asking another producer",
                            stream.client_id, stream.outbox.qsize())
        return False
