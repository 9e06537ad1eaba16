"""Message-level (pop) consumption shared by SimpleConsumer and PushConsumer: receive with an
invisible duration, ack, change the invisible duration, forward to the dead-letter queue.

Runs on the client's event loop.
"""

from __future__ import annotations

from collections.abc import Mapping

from rocketmq.grpc_protocol.definition_pb2 import Code, MessageQueue, Settings
from rocketmq.grpc_protocol.service_pb2 import (AckMessageEntry, AckMessageRequest,
                                                ChangeInvisibleDurationRequest,
                                                ForwardMessageToDeadLetterQueueRequest,
                                                ReceiveMessageRequest)

from .client import Client, describe_subscription
from .config import ClientConfig
from .convert import duration, message_from_proto, tag_filter
from .coalesce import Coalescer
from .errors import OK_CODES, ServerError, SluiceClientError, error_from_status, raise_for_status
from .model import ReceivedMessage


class PopConsumer(Client):
    """A consumer group member that pops messages and settles each one by receipt handle."""

    def __init__(self, config: ClientConfig, group: str, subscriptions: Mapping[str, str],
                 invisible_duration: float, await_duration: float) -> None:
        if not group:
            raise ValueError("a consumer needs a group name")
        if not subscriptions:
            raise ValueError("a consumer needs at least one subscription {topic: filter}")
        if invisible_duration <= 0 or await_duration < 0:
            raise ValueError("invisible_duration must be positive and await_duration not negative")
        super().__init__(config, group)
        self.subscriptions = dict(subscriptions)
        self._ackers: dict[str, Coalescer[ReceivedMessage, None]] = {}
        self.invisible_duration = invisible_duration
        self.await_duration = await_duration

    def describe(self, settings: Settings) -> None:
        """Announce the group, its tag filters and the long-polling time."""
        describe_subscription(self, settings, self.subscriptions, self.await_duration)

    async def receive_from(self, queue: MessageQueue, max_messages: int,
                           invisible_duration: float) -> list[ReceivedMessage]:
        """Pop up to ``max_messages`` from ``queue``, long-polling up to ``await_duration``."""
        request = ReceiveMessageRequest(
            group=self.resource(self.group), message_queue=queue,
            filter_expression=tag_filter(self.subscriptions.get(queue.topic.name, "*")),
            batch_size=max_messages, invisible_duration=duration(invisible_duration),
            auto_renew=False, long_polling_timeout=duration(self.await_duration))
        responses = await self._transport.server_stream(
            "ReceiveMessage", request, timeout=self.await_duration + self.config.request_timeout)
        messages = []
        for response in responses:
            if response.HasField("message"):
                messages.append(message_from_proto(response.message))
            elif response.HasField("status") and response.status.code != Code.MESSAGE_NOT_FOUND:
                raise_for_status(response.status)
        return messages

    async def ack(self, message: ReceivedMessage) -> None:
        """Acknowledge ``message``: the group will not receive it again.

        Acks from concurrent tasks share AckMessage requests (see ``coalesce``)."""
        self.check_running()
        coalescer = self._ackers.get(message.topic)
        if coalescer is None:
            coalescer = self._ackers[message.topic] = Coalescer(self._ack_entries)
        await coalescer.call(message)

    async def _ack_entries(self, messages: list[ReceivedMessage]) -> list[None | SluiceClientError]:
        """One AckMessage request for messages of one topic; None or the error for each."""
        request = AckMessageRequest(
            group=self.resource(self.group), topic=self.resource(messages[0].topic),
            entries=[AckMessageEntry(message_id=m.message_id, receipt_handle=m.receipt_handle)
                     for m in messages])
        response = await self._transport.unary("AckMessage", request)
        raise_for_status(response.status)
        if len(response.entries) != len(messages):
            error = ServerError(f"the broker answered {len(response.entries)} results for "
                                f"{len(messages)} acks")
            return [error] * len(messages)
        return [None if e.status.code in OK_CODES else error_from_status(e.status) for e in response.entries]

    async def change_invisible_duration(self, message: ReceivedMessage, seconds: float) -> None:
        """Make ``message`` invisible for ``seconds`` from now (0: redeliver at once).

        Updates ``message.receipt_handle`` to the new handle the broker returns.
        """
        self.check_running()
        request = ChangeInvisibleDurationRequest(
            group=self.resource(self.group), topic=self.resource(message.topic),
            receipt_handle=message.receipt_handle, invisible_duration=duration(seconds),
            message_id=message.message_id)
        response = await self._transport.unary("ChangeInvisibleDuration", request)
        raise_for_status(response.status)
        message.receipt_handle = response.receipt_handle

    async def forward_to_dead_letter_queue(self, message: ReceivedMessage, max_attempts: int) -> None:
        """Move ``message`` to the group's dead-letter queue."""
        self.check_running()
        request = ForwardMessageToDeadLetterQueueRequest(
            group=self.resource(self.group), topic=self.resource(message.topic),
            receipt_handle=message.receipt_handle, message_id=message.message_id,
            delivery_attempt=message.delivery_attempt, max_delivery_attempts=max_attempts)
        response = await self._transport.unary("ForwardMessageToDeadLetterQueue", request)
        raise_for_status(response.status)
