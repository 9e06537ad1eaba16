"""Lite-topic quotas per parent topic and per user keep one tenant from taking every lite topic
(the broker-wide ``core.max_lite_topics`` stays as a backstop), survive a restart and free up as
lite topics expire; and what a live lite topic costs in memory, counted in bytes."""
from __future__ import annotations

import dataclasses
import gc
import tracemalloc

import pytest

from core import clock
from core.errors import QuotaExceeded
from core.lite import REGISTRY_TOPIC
from core.model import SYSTEM, MessageType, OutgoingMessage, Principal, SendResult, TopicConfig
from tests.unit.core.test_broker import CONFIG, run_core

ALICE, BOB = Principal("alice", admin=True), Principal("bob", admin=True)
QUOTAS = dataclasses.replace(CONFIG, max_lite_topics=100, max_lite_topics_per_topic=5,
                             max_lite_topics_per_user=3)


def to(parent: str, lite: str) -> OutgoingMessage:
    return OutgoingMessage(parent, lite.encode(), lite_topic=lite)


async def parents(broker, *names: str) -> None:
    for name in names:
        await broker.create_topic(SYSTEM, TopicConfig(name, 2, MessageType.LITE))


def test_one_user_filling_its_quota_does_not_stop_another(tmp_path):
    async def scenario(core) -> None:
        broker = core.broker
        await parents(broker, "chats")
        await broker.send(ALICE, [to("chats", f"a{i}") for i in range(3)])
        with pytest.raises(QuotaExceeded, match=r"user 'alice' created 3 .*quota is 3 "
                                                r"\(core\.max_lite_topics_per_user\)"):
            await broker.send(ALICE, [to("chats", "a3")])
        await broker.send(ALICE, [to("chats", "a0")])  # her lite topics still take messages
        await broker.send(BOB, [to("chats", "b0"), to("chats", "a1")])
        assert core.engine.lite.per_user == {"alice": 3, "bob": 1}
        with pytest.raises(QuotaExceeded, match="max_lite_topics_per_user"):
            await broker.send(BOB, [to("chats", f"b{i}") for i in range(1, 4)])  # all or none
        assert ("chats", "b1") not in core.engine.lite.live
    run_core(tmp_path, scenario, config=dataclasses.replace(QUOTAS, max_lite_topics_per_topic=10))


def test_one_parent_topic_filling_its_quota_does_not_stop_another(tmp_path):
    async def scenario(core) -> None:
        broker = core.broker
        await parents(broker, "chats", "tasks")
        await broker.send(ALICE, [to("chats", f"a{i}") for i in range(3)])
        await broker.send(BOB, [to("chats", f"b{i}") for i in range(2)])
        with pytest.raises(QuotaExceeded, match=r"topic 'chats' has 5 live lite topics, the quota "
                                                r"is 5 \(core\.max_lite_topics_per_topic\)"):
            await broker.send(BOB, [to("chats", "b2")])
        await broker.send(BOB, [to("tasks", "t0")])
        assert core.engine.lite.per_topic == {"chats": 5, "tasks": 1}
    run_core(tmp_path, scenario, config=QUOTAS)


def test_quotas_free_up_as_lite_topics_expire_and_hold_across_a_restart(tmp_path):
    config = dataclasses.replace(QUOTAS, lite_topic_ttl_ms=60_000)

    async def before(core) -> None:
        await parents(core.broker, "chats")
        await core.broker.send(ALICE, [to("chats", f"a{i}") for i in range(3)])

    async def after(core) -> None:
        lite = core.engine.lite
        assert lite.per_user == {"alice": 3} and lite.per_topic == {"chats": 3}
        with pytest.raises(QuotaExceeded, match="max_lite_topics_per_user"):
            await core.broker.send(ALICE, [to("chats", "a3")])
        await lite.expire(clock.now_ms() + 3 * config.lite_topic_ttl_ms)
        assert lite.per_user == {} and lite.per_topic == {}
        await core.broker.send(ALICE, [to("chats", "a3")])

    run_core(tmp_path, before, store="file", config=config)
    run_core(tmp_path, after, store="file", config=config)


def test_lite_topics_recorded_without_an_owner_load_as_nobodys(tmp_path):
    async def before(core) -> None:
        await parents(core.broker, "chats")
        now = clock.now_ms()
        await core.engine.producer.send(core.engine.topics.get, [OutgoingMessage(
            REGISTRY_TOPIC, f"{now}:{now}".encode(), keys=("chats\0old",), queue_id=0)])

    async def after(core) -> None:
        assert core.engine.lite.live["chats", "old"].owner == ""
        assert core.engine.lite.per_user == {"": 1}
        await core.broker.send(ALICE, [to("chats", f"a{i}") for i in range(3)])

    run_core(tmp_path, before, store="file", config=QUOTAS)
    run_core(tmp_path, after, store="file", config=QUOTAS)


MEASURED = 20_000
REGISTRY_BYTES = 300
"""What one live lite topic may cost the registry: about 250 bytes measured (a 16-character
name; its parent topic's and its owner's names are shared by all); docs/features.md says so."""
CHANNEL_BYTES = 320
"""What each group consuming a lite topic adds: about 280 bytes measured."""


def retained(action) -> float:
    """Bytes per lite topic still allocated after ``action`` made ``MEASURED`` of them."""
    gc.collect()
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        action()
        gc.collect()
        return (tracemalloc.get_traced_memory()[0] - start) / MEASURED
    finally:
        tracemalloc.stop()


def test_a_live_lite_topic_costs_about_250_bytes_and_280_per_consuming_group(tmp_path):
    async def scenario(core) -> None:
        await parents(core.broker, "chats")
        lite = core.engine.lite

        def create() -> None:  # names arrive as new strings, as a request decodes them
            for first in range(0, MEASURED, 100):
                batch = [OutgoingMessage("".join(("cha", "ts")), b"", lite_topic="".join(
                    ("session-", f"{i:08d}"))) for i in range(first, first + 100)]
                lite.registry_records(batch, "".join(("ali", "ce")))
                lite.sent(batch, [SendResult("", "chats", 0, 1_000_000 + i, 0)
                                  for i in range(first, first + 100)])

        def consume() -> None:
            for (parent, name), state in lite.live.items():
                lite.channel("".join(("gro", "up")), parent, name, state)

        registry = retained(create)
        channels = retained(consume)
        assert len(lite.live) == MEASURED
        print(f"registry {registry:.0f} bytes, channel {channels:.0f} bytes per lite topic")
        assert registry <= REGISTRY_BYTES
        assert channels <= CHANNEL_BYTES
    run_core(tmp_path, scenario, config=dataclasses.replace(CONFIG, max_lite_topics_per_user=10**6))
