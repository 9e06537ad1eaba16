"""The object store down for a while, against a real `sluice serve` tiering to a real SeaweedFS
S3 gateway that the test stops and starts again: publishing goes on and every MQTT QoS 1
publish is acknowledged; local segments stay past local retention while they are not tiered;
`GET /api/tier` shows the last error and `/health` says degraded (HTTP 200: clients are still
served). Once the gateway is back, tiering catches up, local retention deletes what was tiered,
the health check is ok again, and all history reads back through the tier, each record once."""
from __future__ import annotations

import uuid
from collections import Counter
from pathlib import Path

from tests.integration.tier_world import (SEGMENT, TierTarget, admin, create_topic,
                                          local_segments, publish_mqtt, read_native,
                                          tier_config, tier_status, wait_history_tiered)
from tests.waiting import wait_for

BEFORE, DURING = 1500, 3000
"""MQTT publishes of 1 KB before the outage (one sealed segment) and during it (three)."""


def health(server) -> dict:
    status, body, _ = admin(server)("GET", "/health")
    assert status == 200, (status, body)
    return body


def test_publishing_goes_on_while_the_object_store_is_down_and_tiering_catches_up(
        sluice_server, tmp_path: Path, seaweedfs_server):
    data = tmp_path / "data"
    s3 = seaweedfs_server
    target = TierTarget(f"s3://{s3.bucket}/outage-{uuid.uuid4().hex[:8]}", s3.endpoint,
                        s3.access_key, s3.secret_key)
    server = sluice_server(data, config=tier_config(target, extra="max_lag_ms = 1000"))
    server.wait_ready()
    create_topic(server)
    sent = publish_mqtt(server, BEFORE, client_id="before")
    tiered_before = wait_history_tiered(server, data, at_least=SEGMENT // 2)  # segment ends: record bounds
    wait_for(lambda: health(server)["status"] == "ok", "/health ok", 120, seen=lambda: health(server))

    with seaweedfs_server.down():  # started again at the end of the block, failed or not
        sent.update(publish_mqtt(server, DURING, client_id="during", first=BEFORE))  # every one acknowledged
        wait_for(lambda: tier_status(server).get("last_error"), "the tier's last error", 120,
                 seen=lambda: tier_status(server))
        degraded = wait_for(lambda: (h := health(server))["status"] == "degraded" and h,
                            "/health degraded", 120, seen=lambda: health(server))
        assert degraded["tier"]["status"] == "degraded" and degraded["tier"]["problems"], degraded
        kept = local_segments(data)
        assert kept[0] <= tiered_before and len(kept) >= 3, \
            f"untiered segments past local retention were deleted: {kept}"
        assert tier_status(server).get("tiered_end", 0) == tiered_before
    wait_history_tiered(server, data, at_least=4 * SEGMENT - SEGMENT // 2)
    wait_for(lambda: health(server)["status"] == "ok", "/health ok again", 120,
             seen=lambda: health(server))
    assert not tier_status(server)["failing"]

    read = Counter(r.body for r in read_native(server, len(sent)))
    assert set(read) == set(sent), f"{len(set(sent) - set(read))} acknowledged publishes lost"
    assert max(read.values()) == 1
    assert server.stop() == 0
