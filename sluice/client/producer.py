"""The producer: single, batched, packed and transactional sends over SendMessage.

Runs on one event loop (see ``client.py``). Concurrent sends from many tasks are fine and are
how a stream producer reaches high rates: each ``send_packed`` is one request.
"""

from __future__ import annotations

import inspect
import logging
import time
import zlib
from collections.abc import Iterable, Mapping, Sequence

from rocketmq.grpc_protocol.definition_pb2 import (ClientType, MessageQueue, Publishing, Settings,
                                                   TransactionResolution, TransactionSource)
from rocketmq.grpc_protocol.service_pb2 import (EndTransactionRequest, RecallMessageRequest,
                                                RecoverOrphanedTransactionCommand, SendMessageRequest)

from .client import Client, writable
from .config import ClientConfig
from .convert import message_from_proto, message_to_proto, new_message_id
from .coalesce import Coalescer
from .errors import (OK_CODES, NotFoundError, ServerError, SluiceClientError, error_from_status,
                     raise_for_status)
from .model import Message, SendReceipt
from .packing import BATCH_PROPERTY, pack_bodies
from .transaction import Transaction, TransactionChecker

log = logging.getLogger(__name__)


QUEUE_HEADER = "x-sluice-queue-id"
"""Request header naming the queue for the request's messages without a message group."""


class Producer(Client):
    """Sends messages. ``topics`` are routed at ``start()``; others on their first send.

    Each message goes to a queue chosen here: messages with a ``message_group`` to the queue the
    group hashes to (CRC32, as the broker does), the others of one request to one queue,
    round-robin from request to request, named in the ``x-sluice-queue-id`` request header.
    """

    client_type = ClientType.PRODUCER

    def __init__(self, config: ClientConfig, topics: Iterable[str] = (),
                 checker: TransactionChecker | None = None) -> None:
        super().__init__(config)
        self.topics = list(dict.fromkeys(topics))
        self.checker = checker
        """Answers the broker's checks of this producer's topics' open transactions."""
        self._next_queue: dict[str, int] = {}
        self._coalescers: dict[str, Coalescer[Message, SendReceipt]] = {}
        self._half_coalescers: dict[str, Coalescer[Message, SendReceipt]] = {}

    async def on_start(self) -> None:
        """Look up the routes of the declared topics."""
        for topic in self.topics:
            await self.route(topic)

    def describe(self, settings: Settings) -> None:
        """Announce the declared topics as publishing settings."""
        settings.publishing.CopyFrom(Publishing(topics=[self.resource(t) for t in self.topics]))

    async def send(self, message: Message) -> SendReceipt:
        """Send one message; return where it was stored once the broker acknowledged it.

        Sends from concurrent tasks share requests (see ``coalesce``): each still gets its
        own receipt or error, and a busy producer pays gRPC's per-call cost once per request.
        """
        self.check_running()
        coalescer = self._coalescers.get(message.topic)
        if coalescer is None:
            coalescer = self._coalescers[message.topic] = Coalescer(self._send_entries)
        return await coalescer.call(message)

    async def send_batch(self, messages: Sequence[Message]) -> list[SendReceipt]:
        """Send ``messages`` (all of one topic) in one SendMessage request; receipts come back in
        the same order.

        Raises the first failed entry's error if the broker refused any of them.
        """
        self.check_running()
        if len({m.topic for m in messages}) > 1:
            raise ValueError("a batch goes to one topic; send each topic's messages in a batch of its own")
        results = await self._send_entries(messages)
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return results

    async def send_in_transaction(self, message: Message) -> Transaction:
        """Send ``message`` as a half message, held invisible until the returned transaction
        is committed (or dropped when rolled back) to a topic of message type TRANSACTION.
        Declare the topic and pass a ``checker`` so the broker can ask about a transaction
        this producer did not decide (see ``transaction``)."""
        self.check_running()
        coalescer = self._half_coalescers.get(message.topic)
        if coalescer is None:  # half messages of concurrent transactions share requests
            coalescer = self._half_coalescers[message.topic] = Coalescer(self._send_halves)
        return Transaction(self, message.topic, await coalescer.call(message))

    async def _send_halves(self, messages: Sequence[Message]) -> list[SendReceipt | SluiceClientError]:
        return await self._send_entries(messages, transactional=True)

    async def end_transaction(self, topic: str, message_id: str, transaction_id: str, commit: bool,
                              *, checked: bool = False) -> None:
        """Commit or roll back an open transaction (``Transaction`` does this); ``checked``
        when answering the broker's check. NotFoundError when it was decided already."""
        request = EndTransactionRequest(
            topic=self.resource(topic), message_id=message_id, transaction_id=transaction_id,
            resolution=TransactionResolution.COMMIT if commit else TransactionResolution.ROLLBACK,
            source=TransactionSource.SOURCE_SERVER_CHECK if checked else TransactionSource.SOURCE_CLIENT)
        raise_for_status((await self._transport.unary("EndTransaction", request)).status)

    def on_transaction_check(self, command: RecoverOrphanedTransactionCommand) -> None:
        if self.checker is None:
            log.warning("%s: the broker asks about transaction %s, and this producer has no "
                        "checker to answer", self.client_id, command.transaction_id)
            return
        self.spawn(self._answer_check(command))

    async def _answer_check(self, command: RecoverOrphanedTransactionCommand) -> None:
        message = message_from_proto(command.message)
        try:
            decision = self.checker(message)  # type: ignore[misc]
            if inspect.isawaitable(decision):
                decision = await decision
            if decision is None:
                return
            await self.end_transaction(message.topic, message.message_id, command.transaction_id,
                                       bool(decision), checked=True)
        except Exception:  # noqa: BLE001 - the broker asks again later
            log.exception("%s: answering the check of transaction %s failed", self.client_id,
                          command.transaction_id)

    async def _send_entries(self, messages: Sequence[Message], *,
                            transactional: bool = False) -> list[SendReceipt | SluiceClientError]:
        """One SendMessage request; a receipt or the broker's error for each message."""
        if not messages:
            return []
        born_ms = time.time_ns() // 1_000_000
        chosen: dict[str, int] = {}
        queue_ids = [await self._queue_for(m, chosen) for m in messages]
        request = SendMessageRequest(messages=[
            message_to_proto(m, self.config.namespace, q, new_message_id(), born_ms, transactional)
            for m, q in zip(messages, queue_ids)])
        headers = tuple((QUEUE_HEADER, str(q)) for q in chosen.values())
        response = await self._transport.unary("SendMessage", request, headers=headers)
        raise_for_status(response.status)
        if len(response.entries) != len(messages):
            raise ServerError(f"the broker answered {len(response.entries)} results for "
                              f"{len(messages)} messages")
        return [SendReceipt(e.message_id, q, e.offset, e.recall_handle, e.transaction_id)
                if e.status.code in OK_CODES
                else error_from_status(e.status) for e, q in zip(response.entries, queue_ids)]

    async def recall(self, topic: str, recall_handle: str) -> str:
        """Cancel a delayed message that has not fallen due, by its receipt's ``recall_handle``;
        return its message id. NotFoundError once it was delivered or recalled."""
        self.check_running()
        response = await self._transport.unary("RecallMessage", RecallMessageRequest(
            topic=self.resource(topic), recall_handle=recall_handle))
        raise_for_status(response.status)
        return response.message_id

    async def send_packed(self, topic: str, bodies: Sequence[bytes], tag: str = "",
                          properties: Mapping[str, str] | None = None) -> SendReceipt:
        """Pack ``bodies`` into one message (see ``packing``) and send it.

        The broker stores one record; pull consumers and Spark see one message per body.
        """
        if not bodies:
            raise ValueError("send_packed needs at least one body")
        packed_properties = {**(properties or {}), BATCH_PROPERTY: str(len(bodies))}
        return await self.send(Message(topic, pack_bodies(bodies), tag, properties=packed_properties))

    async def _queue_for(self, message: Message, chosen: dict[str, int]) -> int:
        queues = await self._writable_queues(message.topic)
        if message.priority is not None:  # a priority topic's queue N holds priority N
            return queues[min(max(message.priority, 0), len(queues) - 1)].id
        if message.message_group or message.lite_topic:  # the broker's choice, made here too
            key = message.message_group or message.lite_topic
            return queues[zlib.crc32(key.encode()) % len(queues)].id
        if message.topic not in chosen:
            index = self._next_queue.get(message.topic, 0)
            self._next_queue[message.topic] = index + 1
            chosen[message.topic] = queues[index % len(queues)].id
        return chosen[message.topic]

    async def _writable_queues(self, topic: str) -> list[MessageQueue]:
        queues = writable(await self.route(topic))
        if not queues:
            raise NotFoundError(f"topic {topic!r} has no writable queue")
        return queues
