"""The telemetry job: window aggregates equal a plain-Python computation on the same readings;
bad payloads go to the quarantine with a reason, and the job goes on."""
from __future__ import annotations

import json
import statistics
from collections import defaultdict

import pytest

from analytics.telemetry_job import JobSettings, aggregate, parse, start
from store import FileStore, StoreConfig

BASE_MS = 1_767_225_600_000  # 2026-01-01 00:00:00 UTC, on a minute boundary
BAD = [b"not json at all", json.dumps({"device": "d1", "temperature": 20.0}).encode()]


@pytest.fixture(scope="module")
def telemetry(tmp_path_factory) -> dict:
    """Readings of 3 devices over 4 minutes (one a spike), and two bad payloads."""
    directory = tmp_path_factory.mktemp("telemetry")
    store = FileStore(str(directory), StoreConfig(segment_size=1 << 20))
    readings = []
    for second in range(0, 240, 5):
        for index, device in enumerate(("d0", "d1", "d2")):
            temperature = 20 + index + (second % 17) / 10 + (30 if (device, second) == ("d2", 65) else 0)
            readings.append({"device": device, "ts": BASE_MS + second * 1000,
                             "temperature": temperature, "humidity": 50.0, "battery": 90.0 - second / 100})
    last = None
    for reading in readings:
        last = store.append("devices", json.dumps(reading).encode(), queue_id=int(reading["device"][1]) % 2,
                            properties={"sluice.subject": f"devices/{reading['device']}/telemetry"})
    for body in BAD:
        last = store.append("devices", body, queue_id=0)
    store.wait_durable(last.end_offset)
    store.checkpoint()
    store.close()
    return {"path": str(directory), "readings": readings}


def expected_windows(readings: list[dict]) -> dict[tuple[str, int], tuple]:
    """(device, window start ms) -> (avg, min, max, count) of temperature, by plain Python."""
    groups: dict[tuple[str, int], list[float]] = defaultdict(list)
    for reading in readings:
        groups[(reading["device"], reading["ts"] - reading["ts"] % 60_000)].append(reading["temperature"])
    return {key: (statistics.fmean(values), min(values), max(values), len(values))
            for key, values in groups.items()}


def window_rows(frame) -> dict[tuple[str, int], tuple]:
    return {(r.device, int(r.window_start.timestamp() * 1000)):
            (r.avg_temperature, r.min_temperature, r.max_temperature, r.readings)
            for r in frame.collect()}


def test_batch_aggregates_match_plain_python(spark, telemetry):
    messages = spark.read.format("sluice").option("subscribe", "devices").load(telemetry["path"])
    readings, quarantine = parse(messages)
    rows = aggregate(readings, JobSettings(window="1 minute")).collect()
    got = {(r.device, int(r.window_start.timestamp() * 1000)):
           (r.avg_temperature, r.min_temperature, r.max_temperature, r.readings) for r in rows}
    expected = expected_windows(telemetry["readings"])
    assert got.keys() == expected.keys()
    for key, (avg, low, high, count) in expected.items():
        assert got[key][0] == pytest.approx(avg) and got[key][1:] == (low, high, count)
    flagged = {(r.device, int(r.window_start.timestamp() * 1000)) for r in rows if r.anomaly}
    assert flagged == {("d2", BASE_MS + 60_000)}  # the one spike
    reasons = sorted(r.reason for r in quarantine.collect())
    assert reasons == ["missing ts", "not a JSON object"]


def test_the_streaming_job_writes_closed_windows_and_the_quarantine(spark, telemetry, tmp_path):
    queries = start(spark, {"path": telemetry["path"], "subscribe": "devices"},
                    str(tmp_path / "out"), str(tmp_path / "checkpoint"), available_now=True)
    for query in queries:
        query.awaitTermination(180)
        assert query.exception() is None, query.exception()
    written = window_rows(spark.read.parquet(str(tmp_path / "out" / "aggregates")))
    expected = expected_windows(telemetry["readings"])
    assert written, "no window was closed by the watermark"
    for key, row in written.items():  # windows the watermark closed: exactly the Python values
        assert row[0] == pytest.approx(expected[key][0]) and row[1:] == expected[key][1:]
    quarantined = spark.read.parquet(str(tmp_path / "out" / "quarantine")).collect()
    assert sorted(r.reason for r in quarantined) == ["missing ts", "not a JSON object"]


def test_aggregates_are_published_back_into_a_sluice_topic(spark, telemetry, tmp_path, sluice_server):
    from analytics.telemetry_job import ResultsTopic
    from store.reader import StoreReader
    from tests.analytics.test_remote import create_topic

    server = sluice_server(tmp_path / "broker")
    server.wait_ready()
    create_topic(server.admin, "analytics.telemetry_job", 1)
    queries = start(spark, {"path": telemetry["path"], "subscribe": "devices"},
                    str(tmp_path / "out"), str(tmp_path / "checkpoint"), available_now=True,
                    results=ResultsTopic(server.native, "analytics.telemetry_job"))
    for query in queries:
        query.awaitTermination(180)
        assert query.exception() is None, query.exception()
    assert server.stop() == 0
    reader = StoreReader(str(tmp_path / "broker"))
    messages = reader.read("analytics.telemetry_job", 0, 0, 1000)
    reader.close()
    newest = {}  # the newest message per key is the window's value (update mode)
    for message in messages:
        result = json.loads(message.body)
        assert message.keys == (f"{result['device']}@{result['window_start']}",)
        newest[(result["device"], result["window_start_ms"])] = result
    expected = expected_windows(telemetry["readings"])
    assert newest.keys() == expected.keys()  # open windows too, not only those the watermark closed
    for key, result in newest.items():
        avg, low, high, count = expected[key]
        assert (result["min_temperature"], result["max_temperature"], result["readings"]) == (low, high, count)
        assert result["avg_temperature"] == pytest.approx(avg)
        assert result["latest_ts"] == max(r["ts"] for r in telemetry["readings"]
                                          if (r["device"], r["ts"] - r["ts"] % 60_000) == key)


def test_the_cli_job_writes_parquet_and_ctrl_c_stops_it_with_one_line(telemetry, tmp_path):
    """The job the CLI starts on a data directory writes closed windows and the quarantine as
    Parquet; SIGINT to its process group, as Ctrl+C in a terminal sends it, stops it: no
    tracebacks from Python or the JVM, only the job's progress lines and one last line, exit
    status 0."""
    import os
    import signal
    import subprocess
    import sys
    import threading
    import time

    out = tmp_path / "out"
    job = subprocess.Popen(
        [sys.executable, "-m", "sluice.cli", "analytics", "telemetry", "--data-dir",
         telemetry["path"], "--output", str(out), "--checkpoint", str(tmp_path / "cp")],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    lines: list[str] = []
    running = threading.Event()

    def read_output() -> None:
        for line in job.stdout:
            lines.append(line.rstrip("\n"))
            if line.startswith("telemetry job running: 2 queries"):
                running.set()
        running.set()

    reader = threading.Thread(target=read_output, daemon=True)
    reader.start()
    try:
        assert running.wait(300) and job.poll() is None, "\n".join(lines)[-3000:]
        started = len(lines)
        deadline = time.monotonic() + 300
        while not (list((out / "aggregates").glob("date=*/*.parquet")) and list((out / "quarantine").glob("*.parquet"))):
            assert time.monotonic() < deadline and job.poll() is None, "\n".join(lines)[-3000:]
            time.sleep(0.2)
        os.killpg(job.pid, signal.SIGINT)
        assert job.wait(timeout=120) == 0, "\n".join(lines)[-3000:]
        reader.join(30)
    finally:
        if job.poll() is None:
            job.kill()
    after = lines[started:]
    assert after and after[-1] == "stopping the telemetry job", "\n".join(lines)[-3000:]
    assert all(line.startswith("  telemetry-") for line in after[:-1]), "\n".join(after)[-3000:]
