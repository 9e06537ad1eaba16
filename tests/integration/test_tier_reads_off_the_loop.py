"""A stalled object store holds up only the readers of tiered history: with the S3 service
frozen (SIGSTOP: connections open, nothing answers), a client reading the tier from the
earliest offset waits or is told to retry later, while MQTT clients publishing and receiving
new messages are served as before; once the service answers again, the tiered read succeeds."""
from __future__ import annotations

import queue
import subprocess

import paho.mqtt.client as mqtt

from tests.conftest import ROOT, SLUICE, clean_env
from tests.integration.mqtt.test_robustness import PahoClient
from tests.integration.test_tiering import (SHORT_LOCAL_RETENTION, SMALL_SEGMENTS, WAIT_S, consume_all,
                                            publish, tier_env, tiered, wait_for)
from tests.integration.tier_world import local_segments
from tests.tier_support import SeaweedFS

HOT = 20


def test_a_frozen_object_store_blocks_no_client_of_local_messages(sluice_server, tmp_path,
                                                                 seaweedfs_server: SeaweedFS):
    s3 = seaweedfs_server.info
    data = tmp_path / "data"
    env = tier_env(f"s3://{s3.bucket}/{tmp_path.name}", SLUICE_TIER_S3_ENDPOINT=s3.endpoint,
                   SLUICE_TIER_S3_ACCESS_KEY=s3.access_key, SLUICE_TIER_S3_SECRET_KEY=s3.secret_key,
                   SLUICE_CORE_RETENTION_CHECK_INTERVAL_MS="200", **SHORT_LOCAL_RETENTION)
    server = sluice_server(data, config=SMALL_SEGMENTS, env=env)
    server.wait_ready()
    publish(server, 300)
    status = wait_for(lambda: (s := tiered(server))["tiered_end"] > 0 and s, "a first segment tiered")
    wait_for(lambda: local_segments(data)[0] >= status["tiered_end"],
             "local retention deleting what is tiered: the oldest messages are in S3 only")

    seaweedfs_server.pause()
    try:
        cold = subprocess.Popen(
            [*SLUICE, "consume", "devices", "--earliest", "--count", "300", "--wait", "5", "--json",
             "--server", server.native], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, env=clean_env())
        subscriber = PahoClient(server.mqtt, "hot-subscriber", version=mqtt.MQTTv311)
        publisher = PahoClient(server.mqtt, "hot-publisher", version=mqtt.MQTTv311)
        try:
            subscriber.subscribe("hot/#", 1)
            for n in range(HOT):  # each acknowledged, then delivered, while S3 answers nothing
                info = publisher.client.publish("hot/now", f"hot-{n}".encode(), 1)
                info.wait_for_publish(WAIT_S)
                assert info.is_published(), f"hot publish {n} was not acknowledged"
                try:
                    got = subscriber.messages.get(timeout=WAIT_S)
                except queue.Empty:
                    raise AssertionError(f"hot message {n} was not delivered") from None
                assert got.payload == f"hot-{n}".encode()
        finally:
            for client in (subscriber, publisher):
                client.client.disconnect()
                client.client.loop_stop()
        # the cold reader is still waiting for S3, or was told to retry later
        if cold.poll() is not None:
            out, err = cold.communicate()
            assert "retry later" in err + out, f"cold reader: {out[-2000:]}{err[-2000:]}"
    finally:
        seaweedfs_server.resume()
    cold.communicate(timeout=WAIT_S)
    assert consume_all(server, 300) == list(range(300))  # from S3 once it answers again
