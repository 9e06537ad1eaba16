"""Tiered storage in a running `sluice serve`: MQTT publishes sealed into segments are tiered to
a directory and shown by `sluice tier status`; `sluice tier run` frees the local disk of what
is tiered and past local retention, and `sluice consume --earliest` still reads it all; a tier
that fails (its directory gone; test_tier_outage.py stops a real S3 service) makes /health degraded (still 200,
publishes still acknowledged) and ok again once it works, with nothing lost; the topic
settings round trip through the API and the CLI; the tier's metrics are documented."""
from __future__ import annotations

import json
import subprocess
import urllib.error
import urllib.request
from collections.abc import Callable

import paho.mqtt.client as mqtt

from tests import waiting
from tests.conftest import CONFIG, ROOT, SLUICE, clean_env
from tests.integration.mqtt.test_robustness import PahoClient
from tests.integration.tier_world import local_segments
from tests.integration.test_metrics_reference import TIER_SECTION, check_against_reference

WAIT_S = 120.0
SMALL_SEGMENTS = CONFIG.replace("segment_size = 4_194_304", "segment_size = 65_536")
"""Segments of 64 KiB: a few hundred publishes seal several."""
SCHEMA = {"type": "object", "properties": {"device": {"type": "string"},
                                           "temperature": {"type": "number"}}}


def tier_env(url: str, **more: str) -> dict[str, str]:
    return {"SLUICE_TIER_URL": url, "SLUICE_TIER_CHECK_INTERVAL_MS": "200",
            "SLUICE_TIER_RETRY_MAX_MS": "1000", **more}


SHORT_LOCAL_RETENTION = {"SLUICE_STORE_RETENTION_MAX_AGE_MS": "1"}
"""Local retention that deletes every sealed segment it may: only the tier floor keeps one."""


def sluice(server, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([*SLUICE, *args, "--admin", server.admin], cwd=ROOT,
                          capture_output=True, text=True, timeout=WAIT_S, env=clean_env())
    if check:
        assert done.returncode == 0, f"sluice {' '.join(args)}: {done.stdout}{done.stderr}"
    return done


def get(url: str, auth: bool = True) -> tuple[int, dict]:
    request = urllib.request.Request(url)
    if auth:
        request.add_header("Authorization", "Basic c2x1aWNlOnNsdWljZQ==")  # sluice:sluice
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def wait_for(check: Callable[[], object], what: str) -> object:
    """``check()`` once truthy, within the tests' generous ``WAIT_S``."""
    return waiting.wait_for(check, what, WAIT_S)


def publish(server, count: int, start: int = 0) -> None:
    """``count`` QoS 1 publishes to devices/d1/telemetry, each acknowledged (PUBACK)."""
    client = PahoClient(server.mqtt, f"tier-publisher-{start}", version=mqtt.MQTTv311)
    try:
        for n in range(start, start + count):
            body = json.dumps({"device": "d1", "temperature": n, "pad": "x" * 400}).encode()
            info = client.client.publish("devices/d1/telemetry", body, 1)
            info.wait_for_publish(WAIT_S)
            assert info.is_published(), f"publish {n} was not acknowledged"
    finally:
        client.client.disconnect()
        client.client.loop_stop()


def tiered(server) -> dict:
    return json.loads(sluice(server, "tier", "status", "--json").stdout)


def consume_all(server, count: int) -> list[int]:
    """The ``temperature`` of every message `sluice consume --earliest` reads from devices."""
    consumed = subprocess.run(
        [*SLUICE, "consume", "devices", "--earliest", "--count", str(count), "--wait", "30",
         "--json", "--server", server.native], cwd=ROOT, capture_output=True, text=True,
        timeout=WAIT_S, env=clean_env())
    found = [json.loads(json.loads(line)["body_text"])["temperature"]
             for line in consumed.stdout.splitlines() if line.startswith("{")]
    assert found, consumed.stderr[-2000:]
    return found


def health(server) -> tuple[int, dict]:
    return get(f"{server.admin}/health", auth=False)


def test_mqtt_publishes_are_tiered_to_a_directory_and_the_cli_shows_them(sluice_server, tmp_path):
    tier, data = tmp_path / "tier", tmp_path / "data"
    tier.mkdir()
    # local retention would delete every sealed segment, but runs only when asked (tier run)
    env = tier_env(tier.as_uri(), **SHORT_LOCAL_RETENTION,
                   SLUICE_CORE_RETENTION_CHECK_INTERVAL_MS="3600000")
    server = sluice_server(data, config=SMALL_SEGMENTS, env=env)
    server.wait_ready()
    publish(server, 600)
    status = wait_for(lambda: (s := tiered(server))["topics"].get("devices") and s,
                      "segments of topic devices tiered")
    assert status["description"] == tier.as_uri() and status["tiered_end"] > 0
    files = list((tier / "data" / "topic=devices").rglob("*.parquet"))
    assert files, f"no data file under {tier}: {sorted(tier.rglob('*'))}"
    assert json.loads((data / "tier.json").read_text())["url"] == tier.as_uri()
    assert f"tier           {tier.as_uri()}  (sluice tier status)" in "".join(server.output)
    text = sluice(server, "tier", "status").stdout
    assert f"location       {tier.as_uri()}" in text and "last error     none" in text
    row = next(line for line in text.splitlines() if line.startswith("devices "))
    assert int(row.split()[1]) >= 1 and int(row.split()[2]) >= 1, text  # files, messages

    local = local_segments(data)
    assert len(local) > 2, local
    ran = json.loads(sluice(server, "tier", "run", "--json").stdout)
    assert ran["pending_segments"] == 0 and ran["tiered_end"] >= status["tiered_end"]
    freed = ran["local_retention"]
    assert freed["deleted_segments"] == len(local) - 1 and freed["log_start"] == ran["tiered_end"], ran
    assert local_segments(data) == local[-1:]  # only the active segment is left on disk
    assert consume_all(server, 600) == list(range(600))  # the tier serves what the disk lost
    assert "local retention deleted" in sluice(server, "tier", "run").stdout
    metrics = urllib.request.urlopen(f"{server.admin}/metrics", timeout=30).read().decode()
    check_against_reference(metrics, section_only=TIER_SECTION)

    assert server.stop() == 0
    restarted = sluice_server(data, config=SMALL_SEGMENTS, env=env)
    restarted.wait_ready()  # tiered history is readable as soon as the broker serves
    assert consume_all(restarted, 600) == list(range(600))


def test_a_failing_tier_degrades_health_but_publishes_go_on_and_nothing_is_lost(sluice_server,
                                                                                  tmp_path):
    tier = tmp_path / "tier"
    tier.mkdir()
    server = sluice_server(tmp_path / "data", config=SMALL_SEGMENTS, env=tier_env(tier.as_uri()))
    server.wait_ready()
    publish(server, 300)
    wait_for(lambda: tiered(server)["tiered_end"] > 0, "a first segment tiered")
    status, health = get(f"{server.admin}/health", auth=False)
    assert status == 200 and health["status"] == "ok" and health["tier"]["status"] == "ok"

    moved = tmp_path / "tier-away"
    tier.rename(moved)  # the object store is gone: a file where its directory was
    tier.write_text("not a directory")
    publish(server, 300, start=300)  # every one acknowledged meanwhile
    health = wait_for(lambda: (h := get(f"{server.admin}/health", auth=False))[1]["status"]
                      == "degraded" and h, "/health degraded while the tier fails")
    assert health[0] == 200, health
    assert any("fails" in problem for problem in health[1]["tier"]["problems"]), health
    failing = tiered(server)
    assert failing["failing"] and failing["last_error"]
    assert "last error     none" not in sluice(server, "tier", "status").stdout
    assert "tiering to" in server.log()

    tier.unlink()
    moved.rename(tier)  # back: the broker catches up on its own
    wait_for(lambda: get(f"{server.admin}/health", auth=False)[1]["status"] == "ok",
             "/health ok again once the tier works")
    wait_for(lambda: tiered(server)["pending_segments"] == 0, "every sealed segment tiered")
    assert sorted(consume_all(server, 600)) == list(range(600))


def test_topic_tier_settings_round_trip_through_the_api_and_the_cli(sluice_server, tmp_path):
    server = sluice_server(tmp_path / "data")  # settings are kept with or without a tier
    server.wait_ready()
    schema = tmp_path / "telemetry.schema.json"
    schema.write_text(json.dumps(SCHEMA))
    sluice(server, "topic", "create", "telemetry", "--tier-retention-ms", "86400000",
           "--body-schema", str(schema))
    status, topic = get(f"{server.admin}/topics/telemetry")
    assert status == 200 and topic["tier_retention_ms"] == 86_400_000
    assert json.loads(topic["body_schema"]) == SCHEMA

    sluice(server, "topic", "update", "telemetry", "--tier-retention-ms", "3600000",
           "--clear", "body_schema")
    topic = get(f"{server.admin}/topics/telemetry")[1]
    assert topic["tier_retention_ms"] == 3_600_000 and topic["body_schema"] is None

    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"type": "object", "properties": {"at": {"type": "array"}}}))
    refused = sluice(server, "topic", "update", "telemetry", "--body-schema", str(bad),
                     check=False)
    assert refused.returncode != 0 and "400" in refused.stderr and "body_schema" in refused.stderr
    refused = sluice(server, "topic", "update", "telemetry", "--tier-retention-ms", "0",
                     check=False)
    assert refused.returncode != 0 and "tier_retention_ms" in refused.stderr
    assert get(f"{server.admin}/topics/telemetry")[1]["tier_retention_ms"] == 3_600_000


def test_without_a_tier_the_tier_commands_say_how_to_turn_it_on(sluice_server, tmp_path):
    server = sluice_server(tmp_path / "data")
    server.wait_ready()
    done = sluice(server, "tier", "status", check=False)
    assert done.returncode != 0 and "tier.url" in done.stderr
    assert "tier" not in get(f"{server.admin}/health", auth=False)[1]


def test_a_malformed_tier_url_stops_the_start_saying_what_to_write(sluice_server, tmp_path):
    server = sluice_server(tmp_path / "data", env={"SLUICE_TIER_URL": "ftp://host/x"})
    assert server.process.wait(timeout=WAIT_S) != 0
    assert "file:///absolute/directory or s3://bucket/prefix" in server.log()
    assert not (tmp_path / "data").exists()
