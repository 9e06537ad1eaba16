"""Message-level (pop) consumption: ReceiveMessage, AckMessage, ChangeInvisibleDuration and
ForwardMessageToDeadLetterQueue.

A receive answers on a server stream: the delivery timestamp, then one response per message,
then the final Status (MESSAGE_NOT_FOUND when the long poll ended empty, as RocketMQ's proxy
answers; the clients treat it as "nothing yet").
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from rocketmq.grpc_protocol import service_pb2 as rpc

from core.model import Subscription

from .context import Call, Edge
from .convert import delivered, filter_of, name_of, now_ms, timestamp
from .errors import Code, Status, ok, overall, status_of
from .membership import ensure_subscribed


async def receive_message(edge: Edge, call: Call,
                          request: rpc.ReceiveMessageRequest) -> AsyncIterator[rpc.ReceiveMessageResponse]:
    """Pop up to ``batch_size`` messages, long polling up to ``long_polling_timeout`` (capped
    by the broker's maximum and the client's deadline).

    Push consumers receive from the queue named in the request, one of their assigned queues
    (core answers nothing once it is no longer theirs); simple consumers never ask for an
    assignment, so core lets them pop any queue of the topic, whichever they name.
    """
    group = name_of(request.group, "consumer group")
    topic = name_of(request.message_queue.topic, "topic")
    expression, expression_type = filter_of(request.filter_expression)
    client_id = call.require_client_id()
    await ensure_subscribed(edge, call, Subscription(group, topic, expression, expression_type))
    config = edge.broker.get_topic(topic)
    wait_ms = 0
    if request.HasField("long_polling_timeout"):
        wait_ms = call.wait_ms(request.long_polling_timeout.ToMilliseconds(), edge.config.max_long_poll_ms)
    invisible_ms = (request.invisible_duration.ToMilliseconds()
                    if request.HasField("invisible_duration") else None)
    deliveries = await edge.broker.receive(
        call.principal, group, topic, client_id, expression=expression, expression_type=expression_type,
        max_messages=request.batch_size or 32, invisible_ms=invisible_ms, wait_ms=wait_ms,
        queue_id=request.message_queue.id)
    if not deliveries:
        yield rpc.ReceiveMessageResponse(status=Status(code=Code.MESSAGE_NOT_FOUND, message="no new message"))
        return
    edge.connections.delivered(client_id, call.principal.user, len(deliveries))
    now = now_ms()
    yield rpc.ReceiveMessageResponse(delivery_timestamp=timestamp(now))
    store_host = edge.store_host()
    for delivery in deliveries:
        yield rpc.ReceiveMessageResponse(message=delivered(
            delivery, request.message_queue.topic, config.message_type, store_host, now))
    yield rpc.ReceiveMessageResponse(status=ok())


async def ack_message(edge: Edge, call: Call, request: rpc.AckMessageRequest) -> rpc.AckMessageResponse:
    """Acknowledge each entry on its own; one result per entry."""
    group = name_of(request.group, "consumer group")
    topic = name_of(request.topic, "topic")
    entries = []
    for entry in request.entries:
        try:
            await edge.broker.ack(call.principal, group, topic, entry.receipt_handle)
            edge.connections.traffic.messages_acked += 1
            status = ok()
        except Exception as error:  # noqa: BLE001 - becomes this entry's status
            status = status_of(error)
        entries.append(rpc.AckMessageResultEntry(message_id=entry.message_id,
                                                 receipt_handle=entry.receipt_handle, status=status))
    return rpc.AckMessageResponse(status=overall(e.status for e in entries), entries=entries)


async def change_invisible_duration(edge: Edge, call: Call, request: rpc.ChangeInvisibleDurationRequest
                                    ) -> rpc.ChangeInvisibleDurationResponse:
    """Hide the message for a new duration from now (a push consumer's nack); a new handle."""
    handle = await edge.broker.change_invisible(
        call.principal, name_of(request.group, "consumer group"), name_of(request.topic, "topic"),
        request.receipt_handle, request.invisible_duration.ToMilliseconds())
    return rpc.ChangeInvisibleDurationResponse(status=ok(), receipt_handle=handle)


async def forward_to_dead_letter(edge: Edge, call: Call, request: rpc.ForwardMessageToDeadLetterQueueRequest
                                 ) -> rpc.ForwardMessageToDeadLetterQueueResponse:
    """Move a message the client gave up on to the group's dead-letter queue."""
    await edge.broker.forward_to_dead_letter(
        call.principal, name_of(request.group, "consumer group"), name_of(request.topic, "topic"),
        request.receipt_handle)
    return rpc.ForwardMessageToDeadLetterQueueResponse(status=ok())
