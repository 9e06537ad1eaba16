"""``apache.rocketmq.v2.MessagingService`` over the core facade.

Every RPC authenticates first, then runs its handler (``routes``, ``membership``, ``produce``,
``consume``, ``offsets``, ``telemetry``) with the caller's Principal. Whatever a handler raises
becomes the response's Status through the one table in ``errors``; an unexpected exception is
logged and answered with INTERNAL_ERROR, and the server carries on. All methods run on the
server's event loop.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc.aio
from rocketmq.grpc_protocol import service_pb2 as rpc
from rocketmq.grpc_protocol import service_pb2_grpc

from . import consume, membership, offsets, produce, routes, settings_stream
from .context import Call, Edge
from .decoding import MalformedRequest
from .errors import status_of

Handler = Callable[[Edge, Call, Any], Awaitable[Any]]


class MessagingServicer(service_pb2_grpc.MessagingServiceServicer):
    """The RocketMQ 5 messaging service, one instance per server."""

    def __init__(self, edge: Edge) -> None:
        self._edge = edge

    async def _unary(self, handler: Handler, response_type: type, request: Any,
                     context: grpc.aio.ServicerContext) -> Any:
        try:
            call = await self._edge.call(context)
            if isinstance(request, MalformedRequest):
                raise request.refusal()
            return await handler(self._edge, call, request)
        except Exception as error:  # noqa: BLE001 - every failure is answered as a Status
            return response_type(status=status_of(error))

    async def _stream(self, handler: Callable[..., AsyncIterator[Any]], response_type: type,
                      request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        try:
            call = await self._edge.call(context)
            if isinstance(request, MalformedRequest):
                raise request.refusal()
            async for response in handler(self._edge, call, request):
                yield response
        except Exception as error:  # noqa: BLE001 - the stream ends with the error's Status
            yield response_type(status=status_of(error))

    async def QueryRoute(self, request, context):
        return await self._unary(routes.query_route, rpc.QueryRouteResponse, request, context)

    async def QueryAssignment(self, request, context):
        return await self._unary(routes.query_assignment, rpc.QueryAssignmentResponse, request, context)

    async def Heartbeat(self, request, context):
        return await self._unary(membership.heartbeat, rpc.HeartbeatResponse, request, context)

    async def NotifyClientTermination(self, request, context):
        return await self._unary(membership.notify_client_termination,
                                 rpc.NotifyClientTerminationResponse, request, context)

    async def SendMessage(self, request, context):
        return await self._unary(produce.send_message, rpc.SendMessageResponse, request, context)

    async def EndTransaction(self, request, context):
        return await self._unary(produce.end_transaction, rpc.EndTransactionResponse, request, context)

    async def RecallMessage(self, request, context):
        return await self._unary(produce.recall_message, rpc.RecallMessageResponse, request, context)

    async def ReceiveMessage(self, request, context):
        async for response in self._stream(consume.receive_message, rpc.ReceiveMessageResponse,
                                           request, context):
            yield response

    async def AckMessage(self, request, context):
        return await self._unary(consume.ack_message, rpc.AckMessageResponse, request, context)

    async def ChangeInvisibleDuration(self, request, context):
        return await self._unary(consume.change_invisible_duration, rpc.ChangeInvisibleDurationResponse,
                                 request, context)

    async def ForwardMessageToDeadLetterQueue(self, request, context):
        return await self._unary(consume.forward_to_dead_letter,
                                 rpc.ForwardMessageToDeadLetterQueueResponse, request, context)

    async def PullMessage(self, request, context):
        async for response in self._stream(offsets.pull_message, rpc.PullMessageResponse, request, context):
            yield response

    async def UpdateOffset(self, request, context):
        return await self._unary(offsets.update_offset, rpc.UpdateOffsetResponse, request, context)

    async def GetOffset(self, request, context):
        return await self._unary(offsets.get_offset, rpc.GetOffsetResponse, request, context)

    async def QueryOffset(self, request, context):
        return await self._unary(offsets.query_offset, rpc.QueryOffsetResponse, request, context)

    async def SyncLiteSubscription(self, request, context):
        return await self._unary(membership.sync_lite_subscription, rpc.SyncLiteSubscriptionResponse,
                                 request, context)

    async def Telemetry(self, request_iterator, context):
        async for response in self._stream(settings_stream.telemetry, rpc.TelemetryCommand,
                                           request_iterator, context):
            yield response
