"""Blocking facades for scripts and the CLI: SyncProducer and SyncSimpleConsumer.

Each runs its asyncio client on an event loop in a daemon thread of its own; methods may be
called from any thread and block until the broker answers.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from typing import Any, Generic, Self, TypeVar

from .client import Client
from .config import ClientConfig
from .model import Message, ReceivedMessage, SendReceipt
from .producer import Producer
from .simple_consumer import SimpleConsumer

T = TypeVar("T")
C = TypeVar("C", bound=Client)


class _LoopThread:
    """An event loop running in a daemon thread."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run ``coroutine`` on the loop and wait for its result (or exception)."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()

    def stop(self) -> None:
        """Stop the loop and join its thread."""
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


class _SyncClient(Generic[C]):
    """Owns a loop thread and one async client made on it."""

    def __init__(self, make: Callable[[], C]) -> None:
        self._loop = _LoopThread(f"sluice-{type(self).__name__}")

        async def build() -> C:  # made on its loop: asyncio objects bind to the loop using them
            return make()
        try:
            self._client = self._loop.run(build())
        except BaseException:
            self._loop.stop()
            raise

    @property
    def client_id(self) -> str:
        """The client's id, as the broker sees it."""
        return self._client.client_id

    def start(self) -> None:
        """Connect; see the async client's ``start``. If it fails, the client is closed."""
        try:
            self._loop.run(self._client.start())
        except BaseException:
            self._loop.stop()
            raise

    def close(self) -> None:
        """Disconnect and stop the loop thread. Idempotent."""
        if self._loop.loop.is_closed():
            return
        try:
            self._loop.run(self._client.close())
        finally:
            self._loop.stop()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class SyncProducer(_SyncClient[Producer]):
    """A blocking ``Producer``: ``with SyncProducer(config) as p: p.send(Message(...))``."""

    def __init__(self, config: ClientConfig, topics: Iterable[str] = ()) -> None:
        super().__init__(lambda: Producer(config, topics))

    def send(self, message: Message) -> SendReceipt:
        """Send one message; see ``Producer.send``."""
        return self._loop.run(self._client.send(message))

    def send_batch(self, messages: Sequence[Message]) -> list[SendReceipt]:
        """Send messages in one request; see ``Producer.send_batch``."""
        return self._loop.run(self._client.send_batch(messages))

    def send_packed(self, topic: str, bodies: Sequence[bytes], tag: str = "",
                    properties: Mapping[str, str] | None = None) -> SendReceipt:
        """Send bodies packed into one message; see ``Producer.send_packed``."""
        return self._loop.run(self._client.send_packed(topic, bodies, tag, properties))


class SyncSimpleConsumer(_SyncClient[SimpleConsumer]):
    """A blocking ``SimpleConsumer``."""

    def __init__(self, config: ClientConfig, group: str, subscriptions: Mapping[str, str],
                 invisible_duration: float = 30.0, await_duration: float = 20.0) -> None:
        super().__init__(lambda: SimpleConsumer(config, group, subscriptions,
                                                invisible_duration, await_duration))

    def receive(self, max_messages: int = 16,
                invisible_duration: float | None = None) -> list[ReceivedMessage]:
        """Receive messages; see ``SimpleConsumer.receive``."""
        return self._loop.run(self._client.receive(max_messages, invisible_duration))

    def ack(self, message: ReceivedMessage) -> None:
        """Acknowledge a message; see ``SimpleConsumer.ack``."""
        self._loop.run(self._client.ack(message))

    def change_invisible_duration(self, message: ReceivedMessage, seconds: float) -> None:
        """Change a message's invisible duration; updates its receipt handle."""
        self._loop.run(self._client.change_invisible_duration(message, seconds))
