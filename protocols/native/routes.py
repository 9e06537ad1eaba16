"""QueryRoute and QueryAssignment: which queues a topic has, and which of them a consumer owns.

Sluice is one broker, so every route names this server's own endpoint and one MessageQueue per
queue of the topic, readable and writable, accepting the topic's message type.

The caller's right on the topic is decided before the topic is looked up: a caller without one
gets FORBIDDEN whether the topic exists or not, so topic names do not leak.
"""

from __future__ import annotations

from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc

from core.errors import AccessDenied
from core.model import Action

from .context import Call, Edge
from .convert import message_queue, name_of
from .errors import ok
from .membership import refresh


async def query_route(edge: Edge, call: Call, request: rpc.QueryRouteRequest) -> rpc.QueryRouteResponse:
    """Every queue of the topic, on this broker, for a caller that may publish or subscribe
    there (producers and consumers both ask). A missing topic the caller may publish to is
    answered, when ``auto_create_topics`` is on, with write-only queues: the first send
    creates it (RocketMQ's ``autoCreateTopicEnable``), and a consumer that looked up a
    mistyped name finds nothing to read rather than a new topic."""
    topic = name_of(request.topic, "topic")
    allowed = edge.broker.allowed
    if not (allowed(call.principal, Action.PUBLISH, topic)
            or allowed(call.principal, Action.SUBSCRIBE, topic)):
        raise AccessDenied(f"user {call.principal.user!r} may neither publish nor subscribe on "
                           f"topic {topic!r}; ask an administrator to grant one of them on a "
                           "topic pattern matching it")
    config, exists = await edge.broker.route_topic(call.principal, topic)
    endpoints = edge.endpoints(request.endpoints)
    permission = pb.Permission.READ_WRITE if exists else pb.Permission.WRITE
    queues = [message_queue(request.topic, config, queue_id, endpoints, permission)
              for queue_id in range(config.queue_count)]
    return rpc.QueryRouteResponse(status=ok(), message_queues=queues)


async def query_assignment(edge: Edge, call: Call,
                           request: rpc.QueryAssignmentRequest) -> rpc.QueryAssignmentResponse:
    """The queues of the topic this client owns in its group. Push consumers ask every 5 s,
    which also counts as a heartbeat: a client asking is alive."""
    group = name_of(request.group, "consumer group")
    topic = name_of(request.topic, "topic")
    client_id = call.require_client_id()
    if not edge.broker.allowed(call.principal, Action.SUBSCRIBE, topic):
        raise AccessDenied(f"user {call.principal.user!r} may not subscribe on topic {topic!r}; "
                           "ask an administrator to grant subscribe on a topic pattern matching it")
    await refresh(edge, call, group, topic)
    config = edge.broker.get_topic(topic)
    queue_ids = edge.broker.assignment(call.principal, group, topic, client_id)
    endpoints = edge.endpoints(request.endpoints)
    assignments = [pb.Assignment(message_queue=message_queue(request.topic, config, queue_id, endpoints))
                   for queue_id in queue_ids]
    return rpc.QueryAssignmentResponse(status=ok(), assignments=assignments)

