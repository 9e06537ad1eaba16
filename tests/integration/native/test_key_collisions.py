"""Forged key-index collisions through the SDK: one user's keys in their own topic never make
another user's lite-topic consumer miss messages.

A lite topic's messages are found through the key index (key ``%LITE%<lite topic>`` in the
parent topic). The attacker sends, to a topic of their own, more messages than one lite lookup
takes candidates, with keys forged so that a CRC32C-only index would file them with the
victim's lite topic (``tests/crc32c_collisions.py``).
"""
from __future__ import annotations

import asyncio
import itertools
import time

from crc32c import crc32c

from core.model import Action, MessageType, Permission, ResourceKind
from sluice.client import ClientConfig, LiteSimpleConsumer, Message, Producer, ReceivedMessage
from tests.crc32c_collisions import colliding_strings

TIMEOUT = 20
FORGED = 4_200
"""More than the candidates one lite lookup took from a CRC32C-only index (4 x 1024)."""


def grant(native_broker, user: str, kind: ResourceKind, name: str, *actions: Action) -> None:
    native_broker.run(lambda b: b.users.grant(Permission(user, kind, name, frozenset(actions))))


def config(native_broker, user: str) -> ClientConfig:
    return ClientConfig(native_broker.endpoint, user, f"{user}-secret", request_timeout=10)


def forged_keys(victim_topic: str, lite_topic: str, attacker_topic: str) -> list[str]:
    """Keys of ``attacker_topic`` whose index keys have the CRC32C of the victim's lite key."""
    target = crc32c(b"\x02" + victim_topic.encode() + b"\x00%LITE%" + lite_topic.encode())
    found = colliding_strings(lambda s: b"\x02" + attacker_topic.encode() + b"\x00" + s.encode(), target)
    return list(itertools.islice(found, FORGED))


async def receive_until(consumer: LiteSimpleConsumer, last: bytes) -> list[ReceivedMessage]:
    """Receive and ack until the message with body ``last`` came; fail after TIMEOUT seconds."""
    got: list[ReceivedMessage] = []
    deadline = time.monotonic() + TIMEOUT
    while not got or got[-1].body != last:
        assert time.monotonic() < deadline, [m.body for m in got]
        for message in await consumer.receive(32):
            got.append(message)
            await consumer.ack(message)
    return got


def test_forged_colliding_keys_do_not_make_a_lite_consumer_skip_messages(native_broker):
    native_broker.create_topic("chats", queues=4, message_type=MessageType.LITE)
    native_broker.create_topic("spam", queues=4)
    for user in ("victim", "attacker"):
        native_broker.create_user(user, f"{user}-secret")
    grant(native_broker, "victim", ResourceKind.TOPIC, "chats", Action.PUBLISH, Action.SUBSCRIBE)
    grant(native_broker, "victim", ResourceKind.GROUP, "assistants", Action.SUBSCRIBE)
    grant(native_broker, "attacker", ResourceKind.TOPIC, "spam", Action.PUBLISH)
    keys = forged_keys("chats", "s1", "spam")

    async def test() -> None:
        async with Producer(config(native_broker, "victim"), ["chats"]) as victim:
            for i in range(3):
                await victim.send(Message("chats", b"s1-%d" % i, lite_topic="s1"))
            async with Producer(config(native_broker, "attacker"), ["spam"]) as attacker:
                for start in range(0, FORGED, 200):
                    await attacker.send_batch([Message("spam", b"x", keys=[key])
                                               for key in keys[start:start + 200]])
            got: list[ReceivedMessage] = []
            async with LiteSimpleConsumer(config(native_broker, "victim"), "assistants", "chats",
                                          ["s1"], await_duration=1) as consumer:
                for message in await consumer.receive(32):  # what waits before the next send
                    got.append(message)
                    await consumer.ack(message)
                await victim.send(Message("chats", b"s1-3", lite_topic="s1"))
                got += await receive_until(consumer, b"s1-3")
        assert [m.body for m in got] == [b"s1-%d" % i for i in range(4)]
        assert {m.lite_topic for m in got} == {"s1"}
    asyncio.run(asyncio.wait_for(test(), 120))
