"""A push subscription's lag counts what its topic holds before the subscription has read a
message: one paused before its first poll shows every pending message, not 0."""
from __future__ import annotations

from core.model import SYSTEM
from core.push_model import PushSubscription
from core.service import Broker
from protocols.push.sources import TopicSource
from tests.unit.core.test_broker import run, send, topic


def test_lag_of_a_subscription_that_has_not_read_yet_counts_every_message(tmp_path):
    async def scenario(broker: Broker) -> None:
        await topic(broker, "orders", queues=4)
        await send(broker, 10, "orders")
        source = TopicSource(broker, PushSubscription("fn", SYSTEM.user, "http://127.0.0.1:9/", topic="orders"))
        await source.prepare()
        assert source.lag() == 10
        popped = await source.pop(SYSTEM, 4, 30_000)
        for message in popped:
            await source.settle(message, message.receipt_handle)
        assert source.lag() == 10 - len(popped)
    run(tmp_path, scenario)
