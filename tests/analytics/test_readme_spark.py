"""The Spark examples of README.md and docs/ (``<!-- test: spark NAME -->``), run as written in the session's
Spark, in a directory whose ``./data`` is a broker's data directory holding MQTT telemetry: the
batch read shows every queue's messages, bodies as text and parsed JSON; the stream reads them
all and stops. ``SparkSession.builder...getOrCreate()`` in a block returns the session Spark.

Spark resolves a relative path in its own processes, which a script's Spark starts in the
script's directory but the session Spark started in the test's: the blocks' ``"./..."`` paths
are made absolute in that directory, the one change to their text."""
from __future__ import annotations

import contextlib
import io
import re
from collections.abc import Iterator
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest

from tests.readme import every_block
from tests.waiting import wait_for

READINGS = {f"devices/d{n}/telemetry": f'{{"t": {20 + n}.5}}' for n in range(8)}
"""Enough devices that every one of the topic's four queues holds some."""
ROOM = ("rooms/kitchen/temperature", "21.5")
"""The README tour's MQTT reading, retained as it publishes it."""


def spark_block(name: str) -> str:
    found = [block.code for block in every_block() if block.action == "spark" and block.argument == name]
    assert len(found) == 1, f"no page has one Spark block {name!r}"
    return found[0]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A directory whose ``data`` a broker wrote READINGS into (over MQTT) and stopped."""
    from tests.conftest import Server

    work = tmp_path_factory.mktemp("readme-spark")
    server = Server(work / "data")
    try:
        server.wait_ready()
        client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="readme-spark")
        client.username_pw_set("sluice", "sluice")
        host, port = server.mqtt.rsplit(":", 1)
        client.connect(host, int(port))
        client.loop_start()
        try:
            for topic, payload in READINGS.items():
                client.publish(topic, payload, qos=1).wait_for_publish(30)
            client.publish(*ROOM, qos=1, retain=True).wait_for_publish(30)
        finally:
            client.disconnect()
            client.loop_stop()
        assert server.stop() == 0  # queue entries are on disk for the store reader
    finally:
        server.kill()
    yield work


def run(code: str, workdir: Path) -> tuple[dict, str]:
    """Run a block as a script in ``workdir`` would (``__main__``); its globals and what it
    printed."""
    code = re.sub(r'"\./([^"]*)"', lambda m: repr(str(workdir / m.group(1))), code)
    scope = {"__name__": "__main__"}
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, "example", "exec"), scope)
    return scope, printed.getvalue()


def test_the_batch_example_reads_every_queue_and_shows_bodies_as_text(spark, workdir):
    scope, printed = run(spark_block("spark-batch"), workdir)
    queues = [row.queue for row in scope["df"].select("queue").collect()]
    assert len(queues) == len(READINGS) and set(queues) == {0, 1, 2, 3}
    for topic, payload in READINGS.items():
        assert topic in printed and payload in printed, f"{topic} {payload} not shown as text"
    assert "{t -> 20.5}" in printed, "the JSON body parsed"


def test_the_streaming_example_reads_what_is_stored_and_stops(spark, workdir):
    scope, _ = run(spark_block("spark-stream"), workdir)
    query = scope["query"]
    assert not query.isActive
    assert sum(progress["numInputRows"] for progress in query.recentProgress) == len(READINGS)
    assert (workdir / "devices-checkpoint" / "offsets").is_dir(), "a restart would resume"


def test_the_tour_example_reads_the_mqtt_reading_as_text(spark, workdir):
    _, printed = run(spark_block("spark-tour"), workdir)
    assert ROOM[0] in printed and ROOM[1] in printed, printed


@pytest.fixture(scope="module")
def tiered_tour(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A directory where the README's tiering block ran against a broker started as `make run`
    starts it (tiering to ./tier, 8 MiB segments, 16 MiB kept locally), still running."""
    from tests.conftest import Server
    from tests.integration.test_readme_examples import Tour
    from tests.readme import make_run_env

    work = tmp_path_factory.mktemp("readme-tier")
    server = Server(work / "data", env=make_run_env(work))
    tour = Tour(work, server)
    try:
        server.wait_ready()
        tour.prepare()
        [block] = [b for b in every_block() if b.action == "run" and b.argument == "tour-tier"]
        tour.run(block)
        yield work
    finally:
        tour.stop_background_jobs()
        server.kill()


def test_the_tiering_example_reads_every_reading_though_local_retention_deleted_most(spark, tiered_tour):
    from store.tier.manifest import load_latest
    from store.tier.objects import load_location

    tier = load_location(str(tiered_tour / "data"))
    manifest = load_latest(tier.open())
    segments = sorted((tiered_tour / "data" / "commitlog").glob("0*"))
    assert manifest is not None and manifest.tiered_end > 0
    assert int(segments[0].name) > 0, "local retention deleted the oldest tiered segments"
    wait_for(lambda: readable(tiered_tour / "data", "devices") == 100_000,
             "a reader of the data directory to see every reading (the broker's next checkpoint)", 60)
    scope, printed = run(spark_block("spark-tier"), tiered_tour)
    assert "100000 readings" in printed, printed
    assert re.search(r"\|d\d+ *\| *-?\d+\.\d *\|", printed), printed  # a device and its mean
    plan = scope["readings"]._jdf.queryExecution().executedPlan().toString()
    assert "FileScan parquet" in plan, plan


def readable(data: Path, topic: str) -> int:
    """Messages of ``topic`` a reader of ``data`` sees now, tiered and local: a reader beside a
    running broker sees what its last checkpoint (every second) recorded."""
    from store import StoreReader

    reader = StoreReader(str(data))
    try:
        return sum(end - start for (name, queue) in reader.queues() if name == topic
                   for start, end in [reader.queue_range(name, queue)])
    finally:
        reader.close()
