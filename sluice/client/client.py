"""What every Sluice client shares: start and close, the Telemetry settings exchange, heartbeats,
topic routes and the termination notice.

A client lives on one event loop: create, start, use and close it there. Nothing here is
thread-safe; the sync facade (``sync.py``) runs a client on a loop of its own.
"""

from __future__ import annotations

import asyncio
import logging
import platform
import socket
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any, ClassVar, Self

import grpc
from rocketmq.grpc_protocol.definition_pb2 import (UA, ClientType, Language, MessageQueue,
                                                   Permission, Resource, Settings)
from rocketmq.grpc_protocol.service_pb2 import (HeartbeatRequest, NotifyClientTerminationRequest,
                                                QueryAssignmentRequest, QueryRouteRequest,
                                                RecoverOrphanedTransactionCommand, TelemetryCommand)

from .config import ClientConfig, new_client_id, sdk_version
from .convert import duration, endpoints, resource, tag_filter
from .errors import (OK_CODES, ClientClosedError, SluiceClientError, code_name,
                     raise_for_status)
from .transport import Transport

log = logging.getLogger(__name__)

ROUTE_TTL = 30.0
"""Seconds a topic's route is reused before it is queried again."""
_TELEMETRY_MAX_PAUSE = 5.0


class Client:
    """Base of the producer and the consumers. Runs on one event loop; not thread-safe."""

    client_type: ClassVar[ClientType.ValueType]

    def __init__(self, config: ClientConfig, group: str = "") -> None:
        self.config = config
        self.client_id = config.client_id or new_client_id()
        self.group = group
        self._transport = Transport(config, self.client_id)
        self._access_point = endpoints(config)
        self._server_settings: Settings | None = None
        self._settings_received = asyncio.Event()
        self._routes: dict[str, tuple[float, list[MessageQueue]]] = {}
        self._background: set[asyncio.Task[Any]] = set()
        self._running = False
        self._closed = False

    async def start(self) -> None:
        """Connect: one heartbeat (proving the broker is reachable and the credentials good),
        then telemetry and heartbeats in the background, then what the kind of client needs.

        Raises UnavailableError if the broker stays unreachable for ``reconnect_timeout``. A
        client whose start failed is closed; make a new one to try again.
        """
        if self._closed:
            raise ClientClosedError("a closed client cannot be started again; make a new one")
        if self._running:
            return
        try:
            await self._heartbeat()
            self._running = True
            self.spawn(self._telemetry_loop())
            self.spawn(self._heartbeat_loop())
            await self.on_start()
        except BaseException:
            await self.close()
            raise

    async def on_start(self) -> None:
        """What this kind of client does once connected (look up routes, take an assignment)."""

    async def close(self) -> None:
        """Stop background work, tell the broker this client is leaving, close the channel."""
        if self._closed:
            return
        self._closed = True
        await self._stop_background()
        if self._running:
            self._running = False
            request = NotifyClientTerminationRequest()
            if self.group:
                request.group.CopyFrom(self.resource(self.group))
            try:
                await self._transport.unary("NotifyClientTermination", request)
            except SluiceClientError as error:
                log.info("%s: termination notice not delivered: %s", self.client_id, error)
        await self._transport.close()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def resource(self, name: str) -> Resource:
        """``name`` (a topic or group) in the configured namespace."""
        return resource(self.config.namespace, name)

    def check_running(self) -> None:
        """Raise ClientClosedError unless the client is started and not closed."""
        if not self._running:
            state = "closed" if self._closed else "not started; call start() first"
            raise ClientClosedError(f"{type(self).__name__} {self.client_id} is {state}")

    def spawn(self, coroutine: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run ``coroutine`` in the background until it ends or the client closes."""
        task = asyncio.get_running_loop().create_task(coroutine)
        self._background.add(task)
        task.add_done_callback(self._finished)
        return task

    def _finished(self, task: asyncio.Task[Any]) -> None:
        self._background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("%s: background task %s failed", self.client_id, task.get_coro(),
                      exc_info=task.exception())

    async def _stop_background(self) -> None:
        tasks = list(self._background)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # --- settings (Telemetry) ---

    def describe(self, settings: Settings) -> None:
        """Fill in what this kind of client tells the broker (publishing or subscription)."""
        raise NotImplementedError

    def settings_command(self) -> TelemetryCommand:
        """The Settings this client announces on its Telemetry stream."""
        settings = Settings(client_type=self.client_type, access_point=self._access_point,
                            request_timeout=duration(self.config.request_timeout),
                            user_agent=UA(language=Language.PYTHON, version=sdk_version(),
                                          platform=platform.platform(), hostname=socket.gethostname()))
        self.describe(settings)
        return TelemetryCommand(settings=settings)

    def on_transaction_check(self, command: RecoverOrphanedTransactionCommand) -> None:
        """The broker asks about an open transaction; producers with a checker answer."""
        log.debug("%s: ignoring a transaction check (not a producer with a checker)", self.client_id)

    async def server_settings(self, timeout: float) -> Settings | None:
        """The broker's answer to our Settings, waiting up to ``timeout``; None if none came."""
        try:
            await asyncio.wait_for(self._settings_received.wait(), timeout)
        except asyncio.TimeoutError:
            log.info("%s: no settings from the broker within %.1fs; using defaults",
                     self.client_id, timeout)
        return self._server_settings

    async def _telemetry_loop(self) -> None:
        """Keep a Telemetry stream open: send our Settings, apply the broker's. Reopens on error."""
        pause = 0.1
        while True:
            stub, generation = self._transport.stub()
            stream = stub.Telemetry(metadata=self._transport.metadata())
            try:
                await stream.write(self.settings_command())
                async for command in stream:
                    if command.HasField("status") and command.status.code not in OK_CODES:
                        log.warning("%s: telemetry: %s %s", self.client_id,
                                    code_name(command.status.code), command.status.message)
                    elif command.HasField("settings"):
                        self._server_settings = command.settings
                        self._settings_received.set()
                        pause = 0.1
                    elif command.HasField("recover_orphaned_transaction_command"):
                        self.on_transaction_check(command.recover_orphaned_transaction_command)
            except grpc.aio.AioRpcError as error:
                log.debug("%s: telemetry stream ended: %s", self.client_id, error.code().name)
                if error.code() == grpc.StatusCode.UNAVAILABLE:
                    self._transport.renew(generation)
            except asyncio.InvalidStateError:  # the broker ended the stream before our write
                log.debug("%s: telemetry stream ended before the settings were sent", self.client_id)
            finally:
                stream.cancel()
            await asyncio.sleep(pause)
            pause = min(pause * 2, _TELEMETRY_MAX_PAUSE)

    # --- heartbeats ---

    async def _heartbeat(self) -> None:
        request = HeartbeatRequest(client_type=self.client_type)
        if self.group:
            request.group.CopyFrom(self.resource(self.group))
        response = await self._transport.unary("Heartbeat", request)
        raise_for_status(response.status)

    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.heartbeat_interval)
            try:
                await self._heartbeat()
            except SluiceClientError as error:
                log.warning("%s: heartbeat failed: %s", self.client_id, error)

    # --- routes ---

    async def route(self, topic: str) -> list[MessageQueue]:
        """The queues of ``topic`` (QueryRoute), cached for ROUTE_TTL seconds. A topic that
        does not exist yet (write-only queues: its first send creates it) is not cached, so
        its consumers see it as soon as it is created."""
        now = asyncio.get_running_loop().time()
        cached = self._routes.get(topic)
        if cached is not None and now - cached[0] < ROUTE_TTL:
            return cached[1]
        request = QueryRouteRequest(topic=self.resource(topic), endpoints=self._access_point)
        response = await self._transport.unary("QueryRoute", request)
        raise_for_status(response.status)
        queues = list(response.message_queues)
        if readable(queues):
            self._routes[topic] = (now, queues)
        return queues

    async def rebalance_loop(self, rebalance: Callable[[], Awaitable[None]], interval: float,
                             wake: asyncio.Event) -> None:
        """Run ``rebalance`` every ``interval`` seconds, and early whenever ``wake`` is set."""
        while True:
            wake.clear()
            try:
                await asyncio.wait_for(wake.wait(), interval)
            except asyncio.TimeoutError:
                pass
            try:
                await rebalance()
            except SluiceClientError as error:
                log.warning("%s: assignment in group %s failed: %s", self.client_id, self.group, error)

    async def assigned_queues(self, topic: str) -> list[MessageQueue]:
        """The queues of ``topic`` the broker assigns to this member of the group (QueryAssignment)."""
        request = QueryAssignmentRequest(topic=self.resource(topic), group=self.resource(self.group),
                                         endpoints=self._access_point)
        response = await self._transport.unary("QueryAssignment", request)
        raise_for_status(response.status)
        return [assignment.message_queue for assignment in response.assignments]


_WRITABLE = frozenset({Permission.WRITE, Permission.READ_WRITE})
_READABLE = frozenset({Permission.READ, Permission.READ_WRITE})


def writable(queues: list[MessageQueue]) -> list[MessageQueue]:
    """The queues a producer may send to."""
    return [q for q in queues if q.permission in _WRITABLE]


def readable(queues: list[MessageQueue]) -> list[MessageQueue]:
    """The queues a consumer may read from."""
    return [q for q in queues if q.permission in _READABLE]


def describe_subscription(client: Client, settings: Settings, subscriptions: Mapping[str, str],
                          long_polling_timeout: float | None = None) -> None:
    """Fill ``settings.subscription`` with the client's group and filters."""
    subscription = settings.subscription
    subscription.group.CopyFrom(client.resource(client.group))
    for topic, expression in subscriptions.items():
        entry = subscription.subscriptions.add()
        entry.topic.CopyFrom(client.resource(topic))
        entry.expression.CopyFrom(tag_filter(expression))
    if long_polling_timeout is not None:
        subscription.long_polling_timeout.CopyFrom(duration(long_polling_timeout))
