"""``option("endpoint", ...)`` reads a running broker over the native pull API: the same rows
as reading its data directory."""
from __future__ import annotations

import base64
import json
import urllib.request

from sluice.client import ClientConfig, Message, SyncProducer

COLUMNS = ("topic", "queue", "offset", "batch_index", "msg_id", "keys", "tag", "subject", "body")


def create_topic(admin: str, name: str, queues: int) -> None:
    request = urllib.request.Request(
        f"{admin}/topics", data=json.dumps({"name": name, "queue_count": queues}).encode(),
        headers={"Content-Type": "application/json",
                 "Authorization": "Basic " + base64.b64encode(b"sluice:sluice").decode()})
    urllib.request.urlopen(request, timeout=10).read()


def rows(frame) -> list[tuple]:
    return sorted(tuple(bytes(v) if isinstance(v, (bytes, bytearray)) else
                        tuple(v) if isinstance(v, list) else v for v in row)
                  for row in frame.select(*COLUMNS).collect())


def test_remote_mode_reads_the_same_rows_as_local_mode(spark, sluice_server, tmp_path):
    server = sluice_server(tmp_path / "data")
    server.wait_ready()
    create_topic(server.admin, "devices", 2)
    config = ClientConfig(server.native, access_key="sluice", secret_key="sluice")
    with SyncProducer(config, ["devices"]) as producer:
        for number in range(40):
            producer.send(Message("devices", b"reading %d" % number, tag="t", keys=[f"d{number % 3}"],
                                  properties={"sluice.subject": f"devices/d{number % 3}/telemetry"}))
        producer.send_packed("devices", [b"a", b"b"])
    remote = rows(spark.read.format("sluice").option("endpoint", server.native)
                  .option("subscribe", "devices").load())
    assert server.stop() == 0
    local = rows(spark.read.format("sluice").option("subscribe", "devices").load(str(tmp_path / "data")))
    assert len(local) == 42 and remote == local
