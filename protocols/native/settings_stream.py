"""The Telemetry stream: a client states its settings, the server answers with its own.

Every RocketMQ 5 client opens one bidirectional stream per endpoint and writes a ``settings``
command at start-up and every 5 minutes. A consumer's settings register it in its group (one
heartbeat) and are answered with the group's retry policy, FIFO flag, batch size and long
polling timeout; a push consumer does not start until that answer arrives. A producer is told
the maximum body size, and remembered as a publisher of the topics it names: the broker asks
it, on this stream, to decide transactions of those topics left open (``transaction_checks``).
The stream stays open until the client closes it or the server stops.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc

from core.lite import SUBSCRIPTION_QUOTA
from core.model import MAX_LITE_TOPIC_LENGTH, RetryPolicy
from protocols import relayed_peers

from .connections import TelemetryStream
from .context import Call, Edge
from .decoding import MalformedRequest
from .convert import duration, subscription
from .errors import Code, Status, ok, status_of

log = logging.getLogger("sluice.native")

RECEIVE_BATCH_SIZE = 32
PRODUCER_RETRY = RetryPolicy(max_attempts=3, initial_backoff_ms=100, max_backoff_ms=1_000)
"""How often a producer tries a send, told to producers in their settings."""


async def telemetry(edge: Edge, call: Call,
                    commands: AsyncIterator[rpc.TelemetryCommand]) -> AsyncIterator[rpc.TelemetryCommand]:
    """Answer each ``settings`` command; note the client's answers to server commands.
    The stream stays open until the client closes it, an administrator kicks the client, or
    the server stops."""
    stream = edge.connections.open(call.client_id, call.principal, relayed_peers.grpc_peer(call.context.peer()))
    reason = "closed by the client"
    try:
        async for command in _until_ended(edge, stream, commands):
            if isinstance(command, ServerCommand):
                yield command.command
                continue
            if isinstance(command, MalformedRequest):
                yield rpc.TelemetryCommand(status=status_of(command.refusal()))
                continue
            kind = command.WhichOneof("command")
            if kind == "settings":
                yield await _answer(edge, call, stream, command.settings)
            elif kind in ("thread_stack_trace", "verify_message_result"):
                log.debug("client %s answered %s (nonce %s)", call.client_id, kind,
                          getattr(command, kind).nonce)
            else:
                yield rpc.TelemetryCommand(status=Status(
                    code=Code.BAD_REQUEST, message=f"telemetry command {kind!r} is not one a client sends"))
        if stream.kicked.is_set():
            reason = "kicked by an administrator"
        elif edge.stopping.is_set():
            reason = "the broker is stopping"
    finally:
        edge.connections.close(stream, reason)


@dataclass(frozen=True)
class ServerCommand:
    """A command the server writes on its own (a transaction check), not an answer."""

    command: rpc.TelemetryCommand


async def _until_ended(edge: Edge, stream: TelemetryStream, commands: AsyncIterator[rpc.TelemetryCommand]
                       ) -> AsyncIterator[rpc.TelemetryCommand | ServerCommand]:
    """The client's commands, and the server's own from the stream's outbox, until the client
    closes the stream, an administrator kicks the client, or the server stops (a stream never
    ends on its own, and an open one would hold the server's shutdown for its grace period)."""
    iterator = commands.__aiter__()
    ending = (asyncio.ensure_future(edge.stopping.wait()), asyncio.ensure_future(stream.kicked.wait()))
    reading: asyncio.Future | None = None
    outgoing: asyncio.Future | None = None
    try:
        while True:
            if reading is None:
                reading = asyncio.ensure_future(iterator.__anext__())
                # The read may end (end of stream, cancelled call) after this generator is gone.
                reading.add_done_callback(_outcome_seen)
            if outgoing is None:
                outgoing = asyncio.ensure_future(stream.outbox.get())
            await asyncio.wait((reading, outgoing, *ending), return_when=asyncio.FIRST_COMPLETED)
            if outgoing.done():
                yield ServerCommand(outgoing.result())
                outgoing = None
                continue
            if not reading.done():
                return
            try:
                command = reading.result()
            except StopAsyncIteration:
                return
            reading = None
            yield command
    finally:
        for pending in (reading, outgoing, *ending):
            if pending is not None:
                pending.cancel()


def _outcome_seen(future: asyncio.Future) -> None:
    """Mark a finished read's exception as retrieved, so asyncio does not log it."""
    if not future.cancelled():
        future.exception()


async def _answer(edge: Edge, call: Call, stream: TelemetryStream,
                  settings: pb.Settings) -> rpc.TelemetryCommand:
    """The server's settings for a client's, or the client's echoed with the error's status
    (the clients apply settings only under status OK)."""
    try:
        if settings.WhichOneof("pub_sub") == "subscription":
            answer = await _consumer_settings(edge, call, settings)
        else:
            answer = _producer_settings(edge, call, settings)
            stream.publishing = frozenset(topic.name for topic in settings.publishing.topics)
        return rpc.TelemetryCommand(status=ok(), settings=answer)
    except Exception as error:  # noqa: BLE001 - reported on the stream, which stays open
        return rpc.TelemetryCommand(status=status_of(error), settings=settings)


def _producer_settings(edge: Edge, call: Call, settings: pb.Settings) -> pb.Settings:
    if call.client_id:
        edge.clients.get(call.client_id).client_type = settings.client_type
    return pb.Settings(
        client_type=settings.client_type, access_point=edge.endpoints(settings.access_point),
        backoff_policy=backoff_policy(PRODUCER_RETRY), request_timeout=settings.request_timeout,
        publishing=pb.Publishing(topics=settings.publishing.topics,
                                 max_body_size=edge.config.max_message_bytes,
                                 validate_message_type=True),
        metric=pb.Metric(on=False))


async def _consumer_settings(edge: Edge, call: Call, settings: pb.Settings) -> pb.Settings:
    client_id = call.require_client_id()
    group = settings.subscription.group.name
    subscriptions = [subscription(group, entry) for entry in settings.subscription.subscriptions]
    edge.clients.settle(client_id, settings.client_type, group, subscriptions)
    await edge.broker.heartbeat(call.principal, group, client_id, subscriptions)
    config = edge.broker.get_group(group)
    long_poll_s = max(1, edge.config.max_long_poll_ms // 1000)
    return pb.Settings(
        client_type=settings.client_type, access_point=edge.endpoints(settings.access_point),
        backoff_policy=backoff_policy(config.retry), request_timeout=settings.request_timeout,
        subscription=pb.Subscription(
            group=settings.subscription.group, subscriptions=settings.subscription.subscriptions,
            fifo=config.fifo, receive_batch_size=RECEIVE_BATCH_SIZE,
            long_polling_timeout=duration(long_poll_s * 1000),
            lite_subscription_quota=SUBSCRIPTION_QUOTA, max_lite_topic_size=MAX_LITE_TOPIC_LENGTH),
        metric=pb.Metric(on=False))


def backoff_policy(retry: RetryPolicy) -> pb.RetryPolicy:
    """A core RetryPolicy as RocketMQ's exponential backoff policy."""
    return pb.RetryPolicy(
        max_attempts=retry.max_attempts,
        exponential_backoff=pb.ExponentialBackoff(initial=duration(retry.initial_backoff_ms),
                                                  max=duration(retry.max_backoff_ms),
                                                  multiplier=retry.multiplier))
