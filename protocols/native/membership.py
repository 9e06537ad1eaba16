"""Group membership over the native API: Heartbeat, NotifyClientTermination, a lite
consumer's SyncLiteSubscription, and the implicit registration a consumer's first receive or
assignment query makes.

Core expires a member whose heartbeats stop (``CoreConfig.heartbeat_timeout_ms``); the official
clients heartbeat every 10 s, so that timeout must stay well above 10 s.
"""

from __future__ import annotations

from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc

from core import lite
from core.model import Subscription

from .context import Call, Edge
from .convert import name_of
from .errors import ok


async def heartbeat(edge: Edge, call: Call, request: rpc.HeartbeatRequest) -> rpc.HeartbeatResponse:
    """Refresh a consumer in its group with every subscription it declared; producers (no
    group) just succeed."""
    if request.HasField("group") and request.group.name:
        client_id = call.require_client_id()
        info = edge.clients.get(client_id)
        info.group = request.group.name
        if request.client_type:
            info.client_type = request.client_type
        await edge.broker.heartbeat(call.principal, request.group.name, client_id,
                                    list(info.subscriptions.values()))
    return rpc.HeartbeatResponse(status=ok())


async def notify_client_termination(edge: Edge, call: Call, request: rpc.NotifyClientTerminationRequest
                                    ) -> rpc.NotifyClientTerminationResponse:
    """A client shuts down: it leaves its group at once, so its queues go to the others."""
    if call.client_id:
        if request.HasField("group") and request.group.name:
            edge.broker.leave(request.group.name, call.client_id)
        edge.clients.forget(call.client_id)
    return rpc.NotifyClientTerminationResponse(status=ok())


async def ensure_subscribed(edge: Edge, call: Call, subscription: Subscription) -> None:
    """Make sure core knows the calling client subscribes as ``subscription``.

    A consumer may receive before its first heartbeat, or subscribe after its last settings;
    this registers it then (one heartbeat), and costs nothing once core knows.
    """
    client_id = call.require_client_id()
    if edge.clients.learn(client_id, subscription):
        await edge.broker.heartbeat(call.principal, subscription.group, client_id,
                                    list(edge.clients.get(client_id).subscriptions.values()))


async def refresh(edge: Edge, call: Call, group: str, topic: str) -> None:
    """Heartbeat the calling client in ``group``, adding ``topic`` (every tag) to its
    subscriptions if it never declared it."""
    client_id = call.require_client_id()
    info = edge.clients.get(client_id)
    if topic not in info.subscriptions:
        edge.clients.learn(client_id, Subscription(group, topic))
    await edge.broker.heartbeat(call.principal, group, client_id, list(info.subscriptions.values()))


LITE_ACTIONS = {pb.LiteSubscriptionAction.PARTIAL_ADD: lite.PARTIAL_ADD,
                pb.LiteSubscriptionAction.PARTIAL_REMOVE: lite.PARTIAL_REMOVE,
                pb.LiteSubscriptionAction.COMPLETE_ADD: lite.COMPLETE_ADD,
                pb.LiteSubscriptionAction.COMPLETE_REMOVE: lite.COMPLETE_REMOVE}


async def sync_lite_subscription(edge: Edge, call: Call, request: rpc.SyncLiteSubscriptionRequest
                                 ) -> rpc.SyncLiteSubscriptionResponse:
    """A lite consumer adds or removes lite topics of its bind topic (or states them all, as
    it does every 30 s)."""
    await edge.broker.sync_lite_subscription(
        call.principal, name_of(request.group, "consumer group"), name_of(request.topic, "topic"),
        call.require_client_id(), LITE_ACTIONS.get(request.action, lite.PARTIAL_ADD),
        list(request.lite_topic_set))
    return rpc.SyncLiteSubscriptionResponse(status=ok())
