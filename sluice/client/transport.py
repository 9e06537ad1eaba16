"""One gRPC channel to the broker, replaced by a fresh one when the broker becomes unreachable.

Calls that fail with UNAVAILABLE are retried on a new channel with a growing pause (50 ms up to
1 s) until ``ClientConfig.reconnect_timeout`` has passed, so a client survives a broker restart.
With several endpoints (a cluster's nodes), each new channel goes to the next one, so sends
carry on through any node while the group elects a new leader.
A retried send may store a message twice (the broker may have stored it before the connection
dropped): delivery is at least once. Every method runs on the event loop that first used the
transport and must not be called from another thread.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc
from google.protobuf.message import Message as ProtoMessage
from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub

from .auth import request_metadata
from .config import ClientConfig
from .errors import ClientClosedError, UnavailableError, error_from_rpc

log = logging.getLogger(__name__)
T = TypeVar("T")

CHANNEL_OPTIONS = (
    ("grpc.max_receive_message_length", 256 << 20),
    ("grpc.enable_retries", 0),
    # A fresh channel must mean a fresh connection, not a pooled subchannel in backoff.
    ("grpc.use_local_subchannel_pool", 1),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
)
_FIRST_PAUSE = 0.05
_MAX_PAUSE = 1.0
_RETIRE_GRACE = 60.0
"""Calls still running on a replaced channel get this long to finish before it closes."""


class Transport:
    """The channel, the stub and request signing for one client."""

    def __init__(self, config: ClientConfig, client_id: str) -> None:
        self._config = config
        self._client_id = client_id
        self._channel: grpc.aio.Channel | None = None
        self._stub: MessagingServiceStub | None = None
        self._generation = 0
        self._endpoint = 0
        """Index of the endpoint the current channel goes to."""
        self._closed = False
        self._retiring: set[asyncio.Task[None]] = set()
        self._tls: grpc.ChannelCredentials | None = None

    def metadata(self) -> tuple[tuple[str, str], ...]:
        """Freshly signed metadata for one request."""
        return request_metadata(self._config, self._client_id)

    def stub(self) -> tuple[MessagingServiceStub, int]:
        """The current stub and its channel's generation (opening the channel if needed)."""
        if self._closed:
            raise ClientClosedError("the client is closed")
        if self._stub is None:
            endpoint = self._config.endpoints[self._endpoint]
            if self._config.secure:
                self._channel = grpc.aio.secure_channel(endpoint, self._credentials(),
                                                        options=CHANNEL_OPTIONS)
            else:
                self._channel = grpc.aio.insecure_channel(endpoint, options=CHANNEL_OPTIONS)
            self._stub = MessagingServiceStub(self._channel)
        return self._stub, self._generation

    def _credentials(self) -> grpc.ChannelCredentials:
        """TLS credentials trusting ``ca_file`` (read once), else the system's CAs."""
        if self._tls is None:
            roots = None
            if self._config.ca_file is not None:
                with open(self._config.ca_file, "rb") as handle:
                    roots = handle.read()
            self._tls = grpc.ssl_channel_credentials(root_certificates=roots)
        return self._tls

    def renew(self, generation: int) -> None:
        """Drop the channel of ``generation`` if it is still current; the next call opens another."""
        if generation != self._generation or self._channel is None:
            return
        channel, self._channel, self._stub = self._channel, None, None
        self._generation += 1
        self._endpoint = (self._endpoint + 1) % len(self._config.endpoints)
        task = asyncio.get_running_loop().create_task(_retire(channel))
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def unary(self, method: str, request: ProtoMessage, timeout: float | None = None,
                    headers: tuple[tuple[str, str], ...] = ()) -> Any:
        """Call unary RPC ``method`` (e.g. ``"SendMessage"``) and return its response."""
        deadline = timeout or self._config.request_timeout

        def call(stub: MessagingServiceStub) -> Awaitable[Any]:
            return getattr(stub, method)(request, timeout=deadline, metadata=self.metadata() + headers)
        return await self._retrying(call, method)

    async def server_stream(self, method: str, request: ProtoMessage, timeout: float) -> list[Any]:
        """Call server-streaming RPC ``method`` and return every response it streamed."""
        async def call(stub: MessagingServiceStub) -> list[Any]:
            stream = getattr(stub, method)(request, timeout=timeout, metadata=self.metadata())
            try:
                return [response async for response in stream]
            finally:
                stream.cancel()  # no-op once finished; stops the RPC if this task was cancelled
        return await self._retrying(call, method)

    async def _retrying(self, call: Callable[[MessagingServiceStub], Awaitable[T]], what: str) -> T:
        """Run ``call`` (the RPC ``what``) on the current stub, reconnecting while the broker is
        unreachable.

        gRPC errors become SluiceClientError subclasses; UnavailableError once reconnecting
        has lasted ``reconnect_timeout``.
        """
        loop = asyncio.get_running_loop()
        give_up = loop.time() + self._config.reconnect_timeout
        pause = _FIRST_PAUSE
        while True:
            stub, generation = self.stub()
            try:
                return await call(stub)
            except grpc.aio.AioRpcError as error:
                if not self._reconnectable(error, generation):
                    if error.code() == grpc.StatusCode.DEADLINE_EXCEEDED and len(self._config.endpoints) > 1:
                        self.renew(generation)  # a node that stopped answering: the next call tries the next one
                    raise error_from_rpc(error) from None
                if loop.time() + pause > give_up:
                    raise UnavailableError(
                        f"broker at {self._config.endpoint} unreachable for "
                        f"{self._config.reconnect_timeout:g}s: {error.details()}") from None
                log.debug("%s failed (%s); reconnecting in %.2fs", what, error.code().name, pause)
                self.renew(generation)
                await asyncio.sleep(pause)
                pause = min(pause * 2, _MAX_PAUSE)

    def _reconnectable(self, error: grpc.aio.AioRpcError, generation: int) -> bool:
        code = error.code()
        # CANCELLED without our asking means the channel was replaced under the call.
        return code == grpc.StatusCode.UNAVAILABLE or (
            code == grpc.StatusCode.CANCELLED and generation != self._generation)

    async def close(self) -> None:
        """Close the channel; calls still running fail. Idempotent."""
        self._closed = True
        channel, self._channel, self._stub = self._channel, None, None
        if channel is not None:
            await channel.close()
        for task in list(self._retiring):
            task.cancel()
        await asyncio.gather(*self._retiring, return_exceptions=True)


async def _retire(channel: grpc.aio.Channel) -> None:
    """Close a replaced channel once its calls finish (at most _RETIRE_GRACE); at once if cancelled."""
    try:
        await channel.close(grace=_RETIRE_GRACE)
    except asyncio.CancelledError:
        await channel.close()
        raise
