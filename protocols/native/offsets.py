"""Queue-level consumption: PullMessage and the offset RPCs (UpdateOffset, GetOffset,
QueryOffset). The client owns its position; the broker stores what it commits."""

from __future__ import annotations

from collections.abc import AsyncIterator

from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc

from core.errors import InvalidArgument
from core.history import with_history

from .context import Call, Edge
from .convert import delivered, filter_of, name_of, now_ms
from .errors import ok

POLICIES = {pb.QueryOffsetPolicy.BEGINNING: "earliest", pb.QueryOffsetPolicy.END: "latest"}


async def pull_message(edge: Edge, call: Call,
                       request: rpc.PullMessageRequest) -> AsyncIterator[rpc.PullMessageResponse]:
    """Read up to ``batch_size`` messages of one queue from ``offset``, long polling if none;
    the stream carries the messages, then the next offset, then the Status."""
    group = name_of(request.group, "consumer group")
    mq = request.message_queue
    topic = name_of(mq.topic, "topic")
    expression, expression_type = filter_of(request.filter_expression)
    config = edge.broker.get_topic(topic)
    wait_ms = call.wait_ms(request.long_polling_timeout.ToMilliseconds(), edge.config.max_long_poll_ms)
    result = await edge.broker.pull(call.principal, group, topic, mq.id, request.offset,
                                    max_messages=request.batch_size or 32, wait_ms=wait_ms,
                                    expression=expression, expression_type=expression_type)
    edge.connections.delivered(call.client_id, call.principal.user, len(result.messages))
    now, store_host = now_ms(), edge.store_host()
    for delivery in result.messages:
        yield rpc.PullMessageResponse(message=delivered(delivery, mq.topic, config.message_type,
                                                        store_host, now))
    yield rpc.PullMessageResponse(next_offset=result.next_offset)
    yield rpc.PullMessageResponse(status=ok())


async def update_offset(edge: Edge, call: Call, request: rpc.UpdateOffsetRequest) -> rpc.UpdateOffsetResponse:
    """Commit the group's next offset to read in one queue."""
    mq = request.message_queue
    edge.broker.commit_offset(call.principal, name_of(request.group, "consumer group"),
                              name_of(mq.topic, "topic"), mq.id, request.offset, call.client_id)
    return rpc.UpdateOffsetResponse(status=ok())


async def get_offset(edge: Edge, call: Call, request: rpc.GetOffsetRequest) -> rpc.GetOffsetResponse:
    """The group's committed offset in one queue."""
    mq = request.message_queue
    offset = edge.broker.committed_offset(call.principal, name_of(request.group, "consumer group"),
                                          name_of(mq.topic, "topic"), mq.id, call.client_id)
    return rpc.GetOffsetResponse(status=ok(), offset=offset)


async def query_offset(edge: Edge, call: Call, request: rpc.QueryOffsetRequest) -> rpc.QueryOffsetResponse:
    """The queue offset at the beginning, the end, or the first message stored at or after a time."""
    mq = request.message_queue
    topic = name_of(mq.topic, "topic")
    if request.query_offset_policy == pb.QueryOffsetPolicy.TIMESTAMP:
        if not request.HasField("timestamp"):
            raise InvalidArgument("query_offset_policy TIMESTAMP needs the timestamp field")
        where: str | int = request.timestamp.ToMilliseconds()
    elif request.query_offset_policy in POLICIES:
        where = POLICIES[request.query_offset_policy]
    else:
        raise InvalidArgument(f"unknown query_offset_policy {request.query_offset_policy}; "
                              "use BEGINNING, END or TIMESTAMP")
    edge.broker.get_topic(topic)
    offset = await with_history(lambda: edge.broker.offset_at(topic, mq.id, where))
    return rpc.QueryOffsetResponse(status=ok(), offset=offset)
