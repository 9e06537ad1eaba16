"""SendMessage, EndTransaction and RecallMessage."""

from __future__ import annotations

import dataclasses

from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc

from core.errors import InvalidArgument
from core.model import OutgoingMessage

from .context import Call, Edge
from .convert import name_of, outgoing
from .errors import Code, Status, ok, overall, status_of


async def send_message(edge: Edge, call: Call, request: rpc.SendMessageRequest) -> rpc.SendMessageResponse:
    """Store every message of the request as one batch; one result entry per message.

    A batch is all or nothing: if any entry is refused before storing (a transactional
    message, say), none is stored, and each entry says why. A delayed message's entry carries
    its recall handle. Sluice's SDK names
    the queue for the request's messages without a message group in the ``x-sluice-queue-id``
    header (SendResultEntry has no queue field, so the SDK picks it to report it); RocketMQ's
    own clients leave the choice to the broker.
    """
    if not request.messages:
        return rpc.SendMessageResponse(status=Status(code=Code.BAD_REQUEST,
                                                     message="the request carries no message"))
    edge.connections.published(call.client_id, call.principal.user, len(request.messages))
    converted: list[OutgoingMessage | Exception] = []
    for message in request.messages:
        try:
            converted.append(outgoing(message))
        except Exception as error:  # noqa: BLE001 - becomes this entry's status
            converted.append(error)
    try:
        pinned = _pinned_queue(call)
    except InvalidArgument as error:
        converted = [error] * len(converted)
    else:
        if pinned is not None:
            converted = [dataclasses.replace(m, queue_id=pinned)
                         if isinstance(m, OutgoingMessage) and not m.message_group and m.priority is None
                         and not m.lite_topic
                         else m for m in converted]
    ids = [m.system_properties.message_id for m in request.messages]
    refused = [(i, item) for i, item in enumerate(converted) if isinstance(item, Exception)]
    if refused:
        first = refused[0][0]
        entries = [_failed(ids[i], status_of(item) if isinstance(item, Exception) else Status(
            code=Code.BAD_REQUEST, message=f"not stored: entry {first} of the batch was refused"))
            for i, item in enumerate(converted)]
    else:
        try:
            # A send creates a missing topic (RocketMQ's autoCreateTopicEnable); a route
            # lookup only answers one a send would create (routes.query_route).
            results = await edge.broker.send(call.principal, converted,  # type: ignore[arg-type]
                                             create_topics=True)
        except Exception as error:  # noqa: BLE001 - the whole batch failed alike
            status = status_of(error)
            entries = [_failed(msg_id, status) for msg_id in ids]
        else:
            entries = [rpc.SendResultEntry(status=ok(), message_id=result.msg_id,
                                           offset=result.queue_offset,
                                           recall_handle=result.recall_handle,
                                           transaction_id=result.transaction_id)
                       for result in results]
    return rpc.SendMessageResponse(status=overall(entry.status for entry in entries), entries=entries)


QUEUE_HEADER = "x-sluice-queue-id"


def _pinned_queue(call: Call) -> int | None:
    value = call.header(QUEUE_HEADER)
    if value is None:
        return None
    if not value.isdigit():
        raise InvalidArgument(f"the {QUEUE_HEADER} header must be a queue number, not {value[:20]!r}")
    return int(value)


def _failed(message_id: str, status: Status) -> rpc.SendResultEntry:
    return rpc.SendResultEntry(status=status, message_id=message_id)


async def end_transaction(edge: Edge, call: Call,
                          request: rpc.EndTransactionRequest) -> rpc.EndTransactionResponse:
    """Commit or roll back a transaction by the id its half message's send returned; a
    producer answers so on its own or when asked (``transactions``)."""
    resolution = request.resolution
    if resolution not in (pb.TransactionResolution.COMMIT, pb.TransactionResolution.ROLLBACK):
        raise InvalidArgument("the resolution must be COMMIT or ROLLBACK")
    await edge.broker.end_transaction(call.principal, name_of(request.topic, "topic"),
                                      request.message_id, request.transaction_id,
                                      resolution == pb.TransactionResolution.COMMIT)
    return rpc.EndTransactionResponse(status=ok())


async def recall_message(edge: Edge, call: Call,
                         request: rpc.RecallMessageRequest) -> rpc.RecallMessageResponse:
    """Cancel a delayed message that has not fallen due, by the recall handle its send returned."""
    await edge.broker.recall(call.principal, name_of(request.topic, "topic"), request.recall_handle)
    return rpc.RecallMessageResponse(status=ok(), message_id=request.recall_handle.split(":", 2)[-1])
