"""Properties shared by many messages (`SharedProperties`, what MQTT publishes carry) are
checked and placed once, with the same outcome as a fresh mapping for every message."""
from __future__ import annotations

import pytest

from core.errors import InvalidArgument
from core.model import SUBJECT_PROPERTY, SYSTEM, OutgoingMessage, SharedProperties, TopicConfig
from tests.unit.core.test_broker import run


def test_messages_sharing_properties_go_where_fresh_ones_go(tmp_path):
    async def scenario(broker):
        await broker.create_topic(SYSTEM, TopicConfig("devices", queue_count=8))
        for device in range(20):
            subject = f"devices/{device}/telemetry"
            shared = SharedProperties({SUBJECT_PROPERTY: subject})
            placed = await broker.send(SYSTEM, [OutgoingMessage("devices", b"a", properties=shared),
                                                OutgoingMessage("devices", b"b", properties=shared)])
            fresh = await broker.send(SYSTEM, [OutgoingMessage("devices", b"c",
                                                               properties={SUBJECT_PROPERTY: subject})])
            assert {result.queue_id for result in placed + fresh} == {placed[0].queue_id}
    run(tmp_path, scenario)


def test_shared_properties_are_refused_as_fresh_ones_are(tmp_path):
    async def scenario(broker):
        await broker.create_topic(SYSTEM, TopicConfig("devices", queue_count=2))
        outside = SharedProperties({SUBJECT_PROPERTY: "other/1"})
        for _ in range(2):  # the second time from what was kept about the first
            with pytest.raises(InvalidArgument, match="does not belong to topic"):
                await broker.send(SYSTEM, [OutgoingMessage("devices", b"x", properties=outside)])
        huge = SharedProperties({SUBJECT_PROPERTY: "devices/1", "note": "x" * 20_000})
        with pytest.raises(InvalidArgument, match="properties exceed"):
            await broker.send(SYSTEM, [OutgoingMessage("devices", b"x", properties=huge)])
    run(tmp_path, scenario)
