"""Tiered storage end to end, as a user sees it, against a real `sluice serve` tiering its 1 MiB
segments to a local directory or a SeaweedFS bucket (S3) and deleting them locally a second
later: history published over MQTT 5 and the native SDK (plain, keyed and packed sends) reads
back whole once it lives only in the tier, every record exactly once and identical to what the
same reader saw while it was local, through the native pull API from the earliest offset and
from a time, an AMQP stream queue (``x-stream-offset`` first and an offset), `sluice consume
--earliest`, and the admin API's lookups by id, by key (every page) and by time range; and
again after a restart."""
from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from protocols.mqtt.mapping import USER_PROPERTIES_PROPERTY
from tests.integration.tier_world import (END, SEGMENT, TOPIC, Published, Record, TierTarget,
                                          admin, api_body, create_topic, declare_stream,
                                          local_segments, lookup_id, lookup_key, publish_end,
                                          publish_mqtt, publish_native, read_cli, read_native,
                                          read_stream, tier_config, tier_status,
                                          wait_history_tiered)

MQTT_COUNT, NATIVE_COUNT, PACKS = 2500, 2500, 20
TOTAL = MQTT_COUNT + NATIVE_COUNT + PACKS * 25 + 1  # the end marker too


@pytest.fixture(params=["directory", "s3"])
def tier_target(request, tmp_path: Path) -> TierTarget:
    if request.param == "directory":
        return TierTarget(f"file://{tmp_path / 'tier'}")
    s3 = request.getfixturevalue("seaweedfs")
    return TierTarget(f"s3://{s3.bucket}/{uuid.uuid4().hex[:8]}", s3.endpoint, s3.access_key,
                      s3.secret_key)


def test_tiered_history_reads_back_whole_and_identical_through_every_reader(
        sluice_server, tmp_path: Path, tier_target: TierTarget):
    data = tmp_path / "data"
    config = tier_config(tier_target, check_interval_ms=3_600_000)  # tiers on POST /tier/run
    server = sluice_server(data, config=config)
    server.wait_ready()
    create_topic(server)
    declare_stream(server)
    mqtt_sent = publish_mqtt(server, MQTT_COUNT)
    native_sent, packed = publish_native(server, NATIVE_COUNT, PACKS)
    publish_end(server)
    published = Published(mqtt_sent, native_sent, packed)

    local = read_native(server, TOTAL)
    check_as_published(local, published)
    stream = read_stream(server)

    status, answer, _ = admin(server)("POST", "/tier/run")
    assert status in (200, 202), answer
    tiered_end = wait_history_tiered(server, data, at_least=3 * SEGMENT)
    assert local_segments(data)[0] >= tiered_end > 0, "tiered history is off the local disk"

    assert read_native(server, TOTAL, group="tier-after") == local
    assert read_stream(server) == stream
    assert read_stream(server, stream[1500].offset) == stream[1500:]
    check_cli(read_cli(server, TOTAL), local)
    check_lookups(server, local, published)
    check_time_reads(server, local)

    assert server.stop() == 0
    again = sluice_server(data, config=config)
    again.wait_ready()
    assert tier_status(again).get("tiered_end", tiered_end) >= tiered_end  # absent: not opened yet
    assert read_native(again, TOTAL, group="tier-restarted") == local
    assert read_stream(again) == stream


def check_as_published(records: list[Record], published: Published) -> None:
    """Each body once, with the properties, keys and ids it was sent with."""
    bodies = [r.body for r in records]
    assert sorted(bodies) == sorted([*published.bodies(), END])
    for r in records:
        properties = dict(r.properties)
        if r.body in published.mqtt:
            seq = published.mqtt[r.body]
            assert json.loads(properties[USER_PROPERTIES_PROPERTY]) == [["seq", seq]]
            assert properties["sluice.subject"].startswith(f"{TOPIC}/dev")
        elif r.body in published.native:
            msg_id, key = published.native[r.body]
            assert (r.msg_id, r.tag, r.keys) == (msg_id, "native", (key, "all"))
            assert properties["seq"] == key.removeprefix("key-")
        elif r.body != END:
            assert r.msg_id in published.packed and r.tag == "packed"
            assert published.packed[r.msg_id][r.batch_index] == r.body


def check_cli(lines: list[dict], local: list[Record]) -> None:
    def seen(queue, offset, msg_id, body, keys, properties, store_ts):
        return (queue, offset, msg_id, body, tuple(keys), tuple(sorted(properties.items())), store_ts)
    got = sorted(seen(m["queue_id"], m["offset"], m["msg_id"], api_body(m), m["keys"],
                      m["properties"], m["store_ts"]) for m in lines)
    assert got == sorted(seen(r.queue_id, r.offset, r.msg_id, r.body, r.keys, dict(r.properties),
                              r.store_ts) for r in local)


def check_lookups(server, local: list[Record], published: Published) -> None:
    """The earliest plain records (in deleted segments) by id, the earliest keys one by one,
    and the key every native send carries page by page."""
    by_body = {r.body: r for r in local}
    for payload in [*list(published.mqtt)[:10], *list(published.native)[:10]]:
        want = by_body[payload]
        status, found = lookup_id(server, want.msg_id)
        assert status == 200, found
        assert_same(found, want)
    for payload, (_, key) in list(published.native.items())[:5]:
        [found] = lookup_key(server, key)
        assert_same(found, by_body[payload])
    every = lookup_key(server, "all")
    assert sorted(m["msg_id"] for m in every) == sorted(i for i, _ in published.native.values())


def assert_same(found: dict, want: Record) -> None:
    assert (found["msg_id"], found["queue_id"], found["queue_offset"], api_body(found),
            tuple(found["keys"]), tuple(sorted(found["properties"].items())), found["store_ts"],
            found["born_ts"]) == (want.msg_id, want.queue_id, want.offset, want.body, want.keys,
                                  want.properties, want.store_ts, want.born_ts)


def check_time_reads(server, local: list[Record]) -> None:
    """A native pull from a time starts each queue at its first message stored then or later;
    the admin API's time range finds exactly the messages stored in it."""
    in_time = sorted(local, key=lambda r: (r.store_ts, r.queue_id, r.offset, r.batch_index))
    start = in_time[1000].store_ts
    later = [r for r in local if r.store_ts >= start]
    assert read_native(server, len(later), start_from=start, group="tier-time") == later

    first, last = in_time[100].store_ts, in_time[400].store_ts
    status, found, _ = admin(server)("GET", f"/topics/{TOPIC}/messages?from={first}&to={last}"
                                            "&limit=1000")
    assert status == 200, found
    assert sorted({m["msg_id"] for m in found}) == \
        sorted({r.msg_id for r in local if first <= r.store_ts <= last})
