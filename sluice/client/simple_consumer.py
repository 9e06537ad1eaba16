"""SimpleConsumer: the caller pops messages and acks each one itself. Runs on one event loop."""

from __future__ import annotations

from collections.abc import Mapping

from rocketmq.grpc_protocol.definition_pb2 import ClientType, MessageQueue

from .client import readable
from .config import ClientConfig
from .errors import NotFoundError
from .model import ReceivedMessage
from .pop import PopConsumer


class SimpleConsumer(PopConsumer):
    """Pops messages of ``subscriptions`` (``{topic: filter}``, a filter being ``"*"``,
    ``"TagA || TagB"`` or ``Sql92("a > 5")``) for ``group``.

    A received message stays invisible to the group for ``invisible_duration`` seconds; ack it
    before then, or it is delivered again. ``receive`` long-polls up to ``await_duration``.
    Packed batches arrive as one message; ``unpack_bodies(message.body)`` splits them.
    """

    client_type = ClientType.SIMPLE_CONSUMER

    def __init__(self, config: ClientConfig, group: str, subscriptions: Mapping[str, str],
                 invisible_duration: float = 30.0, await_duration: float = 20.0) -> None:
        super().__init__(config, group, subscriptions, invisible_duration, await_duration)
        self._turn = 0

    async def receive(self, max_messages: int = 16,
                      invisible_duration: float | None = None) -> list[ReceivedMessage]:
        """Up to ``max_messages`` messages; empty if none arrived within ``await_duration``.

        Each call reads the next subscribed topic and, within it, the next queue, in turn.
        """
        self.check_running()
        if max_messages <= 0:
            raise ValueError(f"max_messages must be positive, got {max_messages}")
        queue = await self._next_queue()
        return await self.receive_from(queue, max_messages, invisible_duration or self.invisible_duration)

    async def _next_queue(self) -> MessageQueue:
        topics = list(self.subscriptions)
        topic = topics[self._turn % len(topics)]
        queues = readable(await self.route(topic))
        if not queues:
            raise NotFoundError(f"topic {topic!r} does not exist (or has no readable queue)")
        queue = queues[(self._turn // len(topics)) % len(queues)]
        self._turn += 1
        return queue
