"""LiteSimpleConsumer: pops the messages of the lite topics it subscribes to, at run time,
inside one parent topic (of message type LITE). Each lite topic is consumed in order: its next
messages come once those received are acked. Runs on one event loop."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

from rocketmq.grpc_protocol.definition_pb2 import ClientType, LiteSubscriptionAction
from rocketmq.grpc_protocol.service_pb2 import SyncLiteSubscriptionRequest

from .config import ClientConfig
from .errors import SluiceClientError, raise_for_status
from .simple_consumer import SimpleConsumer

log = logging.getLogger(__name__)

RESYNC_INTERVAL = 30.0
"""How often the whole set of lite topics is stated again (a restarted broker learns it)."""


class LiteSimpleConsumer(SimpleConsumer):
    """A member of ``group`` consuming lite topics of ``parent`` it subscribes to with
    ``subscribe_lite`` (and stops with ``unsubscribe_lite``); ``receive`` and ``ack`` as for a
    ``SimpleConsumer``. Received messages carry their ``lite_topic``."""

    client_type = ClientType.LITE_SIMPLE_CONSUMER

    def __init__(self, config: ClientConfig, group: str, parent: str, lite_topics: Iterable[str] = (),
                 invisible_duration: float = 30.0, await_duration: float = 20.0) -> None:
        super().__init__(config, group, {parent: "*"}, invisible_duration, await_duration)
        self.parent = parent
        self.lite_topics: set[str] = set(lite_topics)

    async def on_start(self) -> None:
        await super().on_start()
        await self._sync(LiteSubscriptionAction.COMPLETE_ADD, self.lite_topics)
        self.spawn(self._resync_loop())

    async def subscribe_lite(self, *lite_topics: str) -> None:
        """Start consuming ``lite_topics`` (their waiting messages included)."""
        self.check_running()
        await self._sync(LiteSubscriptionAction.PARTIAL_ADD, lite_topics)
        self.lite_topics.update(lite_topics)

    async def unsubscribe_lite(self, *lite_topics: str) -> None:
        """Stop consuming ``lite_topics``; their messages wait for another subscriber."""
        self.check_running()
        await self._sync(LiteSubscriptionAction.PARTIAL_REMOVE, lite_topics)
        self.lite_topics.difference_update(lite_topics)

    async def _sync(self, action: LiteSubscriptionAction.ValueType, lite_topics: Iterable[str]) -> None:
        request = SyncLiteSubscriptionRequest(
            action=action, topic=self.resource(self.parent), group=self.resource(self.group),
            lite_topic_set=sorted(lite_topics))
        raise_for_status((await self._transport.unary("SyncLiteSubscription", request)).status)

    async def _resync_loop(self) -> None:
        while True:
            await asyncio.sleep(RESYNC_INTERVAL)
            try:
                await self._sync(LiteSubscriptionAction.COMPLETE_ADD, self.lite_topics)
            except SluiceClientError as error:
                log.warning("%s: stating lite subscriptions failed: %s", self.client_id, error)
