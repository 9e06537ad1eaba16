"""Lite-topic quotas through the SDK against a real broker: a user that filled its quota is
refused with TOO_MANY_REQUESTS naming the quota, while another user goes on creating lite
topics; a parent topic that filled its quota does not stop another parent topic."""
from __future__ import annotations

import asyncio

import pytest

from core.model import Action, MessageType, Permission, ResourceKind
from sluice.client import ClientConfig, Message, Producer, TooManyRequestsError

PASSWORD = "secret-1"


def user_with_publish(native_broker, name: str, pattern: str) -> ClientConfig:
    native_broker.create_user(name, PASSWORD)
    permission = Permission(name, ResourceKind.TOPIC, pattern, frozenset({Action.PUBLISH}))
    native_broker.run(lambda b: asyncio.to_thread(b.users.grant, permission))
    return ClientConfig(native_broker.endpoint, name, PASSWORD, request_timeout=5)


def test_one_user_filling_its_lite_topic_quota_does_not_stop_another(native_broker_factory):
    native_broker = native_broker_factory(core={"max_lite_topics_per_user": 3,
                                                "max_lite_topics_per_topic": 5})
    for parent in ("chats", "tasks"):
        native_broker.create_topic(parent, queues=2, message_type=MessageType.LITE)
    alice = user_with_publish(native_broker, "alice", "*")
    bob = user_with_publish(native_broker, "bob", "*")

    async def test() -> None:
        async with Producer(alice, ["chats"]) as producer:
            for i in range(3):
                await producer.send(Message("chats", b"hi", lite_topic=f"alice-{i}"))
            with pytest.raises(TooManyRequestsError, match="core.max_lite_topics_per_user"):
                await producer.send(Message("chats", b"hi", lite_topic="alice-3"))
            await producer.send(Message("chats", b"again", lite_topic="alice-0"))
        async with Producer(bob, ["chats", "tasks"]) as producer:
            for i in range(2):
                await producer.send(Message("chats", b"hi", lite_topic=f"bob-{i}"))
            with pytest.raises(TooManyRequestsError, match="core.max_lite_topics_per_topic"):
                await producer.send(Message("chats", b"hi", lite_topic="bob-2"))
            await producer.send(Message("tasks", b"hi", lite_topic="bob-2"))
    asyncio.run(asyncio.wait_for(test(), 120))
    lite = native_broker.core.engine.lite
    assert native_broker.run(lambda _: (dict(lite.per_user), dict(lite.per_topic))) == (
        {"alice": 3, "bob": 3}, {"chats": 5, "tasks": 1})
