"""PushConsumer: long-polls its assigned queues and hands each message to a listener.

Runs on one event loop. A sync listener runs in the loop's default thread pool, so it may
block; an async listener runs on the loop and must not.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any, Union

from rocketmq.grpc_protocol.definition_pb2 import ClientType, MessageQueue, Settings

from .config import ClientConfig
from .errors import (ClientTimeoutError, ServerError, SluiceClientError, TooManyRequestsError,
                     UnavailableError)
from .model import ReceivedMessage, TopicQueue
from .pop import PopConsumer

log = logging.getLogger(__name__)

Listener = Callable[[ReceivedMessage], Union[Awaitable[Any], Any]]
_TRANSIENT = (UnavailableError, ServerError, ClientTimeoutError, TooManyRequestsError)
_SETTLE_ATTEMPTS = 3
_MAX_RECEIVE_PAUSE = 10.0


@dataclass(frozen=True)
class RetryPolicy:
    """When a failed message is delivered again, and after how many attempts it is dead-lettered.

    Taken from the broker's Telemetry settings; these defaults apply until (or unless) it sends
    one: exponential backoff from 1 s doubling up to 60 s, 16 attempts.
    """

    max_attempts: int = 16
    initial_backoff: float = 1.0
    max_backoff: float = 60.0
    multiplier: float = 2.0
    customized: tuple[float, ...] = ()
    """If set, the delay after attempt n is ``customized[n - 1]`` (the last one repeating)."""

    def backoff(self, attempt: int) -> float:
        """Seconds to keep a message invisible after its ``attempt``-th delivery failed."""
        if self.customized:
            return self.customized[min(attempt, len(self.customized)) - 1]
        return min(self.initial_backoff * self.multiplier ** max(0, attempt - 1), self.max_backoff)

    @classmethod
    def from_settings(cls, settings: Settings | None) -> RetryPolicy:
        """The policy in the broker's settings; defaults for whatever it leaves out."""
        if settings is None or not settings.HasField("backoff_policy"):
            return cls()
        policy = settings.backoff_policy
        max_attempts = policy.max_attempts or cls.max_attempts
        strategy = policy.WhichOneof("strategy")
        if strategy == "customized_backoff" and policy.customized_backoff.next:
            return cls(max_attempts, customized=tuple(
                d.ToNanoseconds() / 1e9 for d in policy.customized_backoff.next))
        if strategy == "exponential_backoff":
            exp = policy.exponential_backoff
            return cls(max_attempts, exp.initial.ToNanoseconds() / 1e9 or cls.initial_backoff,
                       exp.max.ToNanoseconds() / 1e9 or cls.max_backoff,
                       exp.multiplier or cls.multiplier)
        return cls(max_attempts)


class PushConsumer(PopConsumer):
    """Consumes ``subscriptions`` (``{topic: filter}``, a filter being ``"*"``,
    ``"TagA || TagB"`` or ``Sql92("a > 5")``) for ``group`` by calling ``listener(message)``
    for each message, at most ``max_concurrency`` at a time.

    Success (the listener returns) acks the message. An exception makes it invisible for the
    retry policy's backoff, so it is delivered again; once ``delivery_attempt`` reaches the
    policy's ``max_attempts`` the message goes to the group's dead-letter queue instead. Queue
    ownership comes from QueryAssignment, refreshed every ``assignment_interval`` seconds and
    after receive errors.
    """

    client_type = ClientType.PUSH_CONSUMER

    def __init__(self, config: ClientConfig, group: str, subscriptions: Mapping[str, str],
                 listener: Listener, *, max_concurrency: int = 16, invisible_duration: float = 30.0,
                 await_duration: float = 20.0, batch_size: int = 32,
                 assignment_interval: float = 5.0) -> None:
        if max_concurrency < 1 or batch_size < 1:
            raise ValueError("max_concurrency and batch_size must be at least 1")
        super().__init__(config, group, subscriptions, invisible_duration, await_duration)
        self.listener = listener
        self.max_concurrency = max_concurrency
        self.batch_size = batch_size
        self.assignment_interval = assignment_interval
        self._listener_is_async = (inspect.iscoroutinefunction(listener)
                                   or inspect.iscoroutinefunction(getattr(listener, "__call__", None)))
        self._slots = asyncio.Semaphore(max_concurrency)
        self._room = asyncio.Event()
        self._room.set()
        self._consuming: set[asyncio.Task[None]] = set()
        self._queues: dict[TopicQueue, asyncio.Task[None]] = {}
        self._reassign = asyncio.Event()

    @property
    def retry_policy(self) -> RetryPolicy:
        """The retry policy in force: the broker's, or the defaults."""
        return RetryPolicy.from_settings(self._server_settings)

    def assignment(self) -> list[TopicQueue]:
        """The queues this consumer is receiving from."""
        return sorted(self._queues)

    async def on_start(self) -> None:
        """Wait briefly for the broker's settings (retry policy), take the first assignment,
        start consuming."""
        await self.server_settings(self.config.request_timeout)
        await self._rebalance()
        self.spawn(self.rebalance_loop(self._rebalance, self.assignment_interval, self._reassign))

    async def close(self) -> None:
        """Stop receiving, let running listeners finish (at most ``invisible_duration``, after
        which their messages are redelivered anyway) and settle them, then disconnect."""
        if self._running and not self._closed:
            await self._stop_background()
            self._queues.clear()
            if self._consuming:
                await asyncio.wait(self._consuming, timeout=self.invisible_duration)
            for task in self._consuming:
                task.cancel()
            await asyncio.gather(*self._consuming, return_exceptions=True)
        await super().close()

    async def _rebalance(self) -> None:
        wanted: dict[TopicQueue, MessageQueue] = {}
        for topic in self.subscriptions:
            for queue in await self.assigned_queues(topic):
                wanted[TopicQueue(topic, queue.id)] = queue
        for key in self._queues.keys() - wanted.keys():
            self._queues.pop(key).cancel()
        for key in wanted.keys() - self._queues.keys():
            self._queues[key] = self.spawn(self._receive_loop(wanted[key]))

    async def _receive_loop(self, queue: MessageQueue) -> None:
        """Long-poll one queue while there is room for more messages in flight."""
        pause = 0.0
        while True:
            await self._room.wait()
            room = max(1, self.max_concurrency - len(self._consuming))
            try:
                messages = await self.receive_from(queue, min(self.batch_size, room),
                                                   self.invisible_duration)
            except SluiceClientError as error:
                pause = min(max(pause * 2, 0.5), _MAX_RECEIVE_PAUSE)
                log.warning("%s: receive from %s/%d failed (retrying in %.1fs): %s",
                            self.client_id, queue.topic.name, queue.id, pause, error)
                self._reassign.set()
                await asyncio.sleep(pause)
                continue
            pause = 0.0
            for message in messages:
                self._dispatch(message)

    def _dispatch(self, message: ReceivedMessage) -> None:
        task = asyncio.get_running_loop().create_task(self._consume(message))
        self._consuming.add(task)
        task.add_done_callback(self._consumed)
        if len(self._consuming) >= self.max_concurrency:
            self._room.clear()

    def _consumed(self, task: asyncio.Task[None]) -> None:
        self._consuming.discard(task)
        if len(self._consuming) < self.max_concurrency:
            self._room.set()

    async def _consume(self, message: ReceivedMessage) -> None:
        policy = self.retry_policy
        if message.delivery_attempt <= policy.max_attempts:
            async with self._slots:
                succeeded = await self._call_listener(message)
            if succeeded:
                await self._settle("ack", message, partial(self.ack, message))
                return
            if message.delivery_attempt < policy.max_attempts:
                delay = policy.backoff(message.delivery_attempt)
                await self._settle("retry", message,
                                   partial(self.change_invisible_duration, message, delay))
                return
        await self._settle("dead-letter", message,
                           partial(self.forward_to_dead_letter_queue, message, policy.max_attempts))

    async def _call_listener(self, message: ReceivedMessage) -> bool:
        try:
            if self._listener_is_async:
                await self.listener(message)
            else:
                await asyncio.to_thread(self.listener, message)
            return True
        except Exception:  # the listener's failure is reported, then retried by redelivery
            log.exception("%s: listener failed on message %s (attempt %d)", self.client_id,
                          message.message_id, message.delivery_attempt)
            return False

    async def _settle(self, what: str, message: ReceivedMessage,
                      action: Callable[[], Awaitable[None]]) -> None:
        """Run ``action`` (the ack, retry or dead-letter call), again after transient errors.

        Giving up is safe: the broker redelivers the message after its invisible duration.
        """
        for attempt in range(1, _SETTLE_ATTEMPTS + 1):
            try:
                await action()
                return
            except _TRANSIENT as error:
                problem: SluiceClientError = error
                if attempt < _SETTLE_ATTEMPTS:
                    await asyncio.sleep(attempt)
            except SluiceClientError as error:
                problem = error
                break
        log.warning("%s: %s of message %s failed, the broker will redeliver it: %s",
                    self.client_id, what, message.message_id, problem)
