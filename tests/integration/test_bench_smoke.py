"""`make bench` keeps working: every section runs end to end in its smoke mode."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_store_bench_smoke_run_prints_every_target(tmp_path):
    done = subprocess.run([sys.executable, "-m", "bench", "store", "--quick", "--data-dir", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    for line in ("raw sequential write", "sluice async: append_batch(64)", "batched per tick",
                 "catch-up read", "sync 64 batched 100 B / raw fsync-per-record"):
        assert line in done.stdout, line
    assert list(tmp_path.iterdir()) == [], "benchmark files are removed afterwards"


def test_native_bench_smoke_run_compares_or_says_why_not(tmp_path):
    """The native section runs in its smoke mode with or without rabbitmq-server installed."""
    done = subprocess.run([sys.executable, "-m", "bench", "native", "--quick", "--data-dir", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "RabbitMQ  confirm window" in out or "RabbitMQ skipped:" in out, out
    measured = re.search(r"^Sluice +256 sends in flight", out, re.MULTILINE) is not None
    assert measured or "Sluice native server not available" in out, out
    if "RabbitMQ  confirm window" in out and measured:
        assert "Sluice/RabbitMQ" in out, out
    assert "failed in round" not in out, out
    assert list(tmp_path.iterdir()) == [], "benchmark files are removed afterwards"


def test_mqtt_bench_smoke_run_measures_the_generator_and_says_what_it_skipped(tmp_path):
    """The mqtt section runs in its smoke mode with or without mosquitto and rabbitmq-server
    installed: the generator's ceiling and Sluice are always measured, with latency and losses in
    every scenario, and compared (with issue 15's targets) when the other brokers run."""
    done = subprocess.run([sys.executable, "-m", "bench", "mqtt", "--quick", "--data-dir", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "generator ceiling (discard server)" in out, out
    scenarios = ("QoS 0 fan-in 4 pub -> 1 sub", "QoS 1 fan-in 4 pub (window 64) -> 1 sub",
                 "QoS 1 1,000 device topics -> devices/+/telemetry",
                 "QoS 1 10,000 device topics -> devices/+/telemetry", "QoS 0 fan-out 1 pub -> 50 subs",
                 "latency QoS 0 at 1,000 msg/s", "latency QoS 1 at 1,000 msg/s")
    figures = r" +1 +[\d,]+ +[\d,]+\.\.[\d,]+ +[\d,]+ +[\d.]+ ms +[\d.]+ ms"  # runs, msg/s, range, lost, p50, p99
    for scenario in scenarios:
        assert re.search(rf"^Sluice +{re.escape(scenario)}{figures}", out, re.MULTILINE), scenario
    for broker in ("Mosquitto", "RabbitMQ"):
        measured = re.search(rf"^{broker} +latency QoS 1 at 1,000 msg/s", out, re.MULTILINE)
        assert measured or f"{broker} skipped:" in out, out
    if "Mosquitto skipped:" not in out:
        assert "Sluice/Mosquitto QoS 1 1,000 device topics" in out, out
    if "RabbitMQ skipped:" not in out:
        assert re.search(r"Sluice latency QoS 0 at 1,000 msg/s, p99 .*\(RabbitMQ\) +(PASS|MISS)", out), out
    assert re.search(r"Sluice QoS 1 10,000 device topics .* / 1,000 topics .* (PASS|MISS)", out), out
    assert not re.search(r"^note: Sluice .* lost [\d,]+ QoS 1 messages", out, re.MULTILINE), out
    assert "failed in round" not in out, out
    assert list(tmp_path.iterdir()) == [], "benchmark files are removed afterwards"


def test_analytics_bench_smoke_run_compares_the_source_with_read_json(tmp_path):
    """The source over local segments and over a fully tiered topic, each beside read.json; and
    a broker's MQTT QoS 1 load with tiering off and on, with the tiering throughput meanwhile."""
    done = subprocess.run([sys.executable, "-m", "bench", "analytics", "--quick", "--data-dir", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    for line in ("sluice source, .schema(body)", "a Python source decoding nothing", "spark.read.json"):
        assert line in done.stdout, done.stdout
    assert re.search(r"format\(sluice\) tiered, data\.\* +[\d,]+ rows/s +[\d.]+x +[\d.]+x parquet", done.stdout), done.stdout
    assert re.search(r"spark\.read\.parquet \(Spark-written\) *[\d,]+ rows/s", done.stdout), done.stdout
    assert re.search(r"load ratio tiering on / off: [\d.]+ \(target >= 0\.9: (PASS|MISS)\)", done.stdout), done.stdout
    assert re.search(r"tiering throughput while loaded: [\d.]+ MB/s", done.stdout), done.stdout
    assert list(tmp_path.iterdir()) == [], "benchmark files are removed afterwards"


def test_latency_bench_smoke_run_measures_publish_to_dashboard(tmp_path):
    """However long Spark takes to start on a loaded machine, the run measures once results flow."""
    done = subprocess.run([sys.executable, "-m", "bench", "latency", "--quick", "--data-dir", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "publish -> dashboard   p50" in done.stdout, done.stdout
    assert "results micro-batch    p50" in done.stdout, done.stdout
    assert list(tmp_path.iterdir()) == [], "benchmark files are removed afterwards"


def test_hardening_bench_smoke_run_times_property_decoding_and_counts_session_descriptors(tmp_path):
    """The hardening section decodes PUBLISH packets with 1, 1,000 and 100,000 user
    properties and reports the time per property, which a linear decoder keeps flat; and it
    measures the descriptors and memory of a broker holding many persistent sessions."""
    done = subprocess.run([sys.executable, "-m", "bench", "hardening", "--quick", "--data-dir", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    for count in ("1 user property ", "1,000 user properties", "100,000 user properties"):
        assert re.search(rf"{count}.*us/property", out), out
    assert re.search(r"varies [\d.]+x: linear", out), out
    assert "500 persistent MQTT sessions" in out, out
    assert re.search(r"descriptors grew by -?\d+ \(cache of queue files: \d+\): bounded", out), out
    assert list(tmp_path.iterdir()) == [], "benchmark files are removed afterwards"


def test_amqp_bench_smoke_run_compares_with_rabbitmq_or_says_why_not(tmp_path):
    """The amqp section runs in its smoke mode with or without rabbitmq-server installed:
    Sluice is always measured in every scenario, and compared when RabbitMQ runs."""
    done = subprocess.run([sys.executable, "-m", "bench", "amqp", "--quick", "--data-dir", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    for scenario in ("1 durable queue, 1 pub -> 1 consumer", "16 durable queues, 4 pub -> 2 consumers",
                     "topic exchange -> 10 queues", "latency at 1,000 msg/s"):
        assert re.search(rf"^Sluice +{re.escape(scenario)} +1 ", out, re.MULTILINE), scenario
    assert "RabbitMQ  latency at 1,000 msg/s" in out or "RabbitMQ skipped:" in out, out
    if "RabbitMQ  latency at 1,000 msg/s" in out:
        assert "Sluice/RabbitMQ" in out and "broker CPU per message" in out, out
    assert "failed in round" not in out, out
    assert list(tmp_path.iterdir()) == [], "benchmark files are removed afterwards"


def test_features_bench_smoke_run_measures_delays_and_filters(tmp_path):
    """The features section runs in its smoke mode: delayed sends beside plain ones, delivery
    against due time with nothing early or missing, FIFO consumption beside plain, SQL92
    cost per subscription count, and transactional sends beside plain ones."""
    done = subprocess.run([sys.executable, "-m", "bench", "features", "--quick", "--data-dir", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert re.search(r"delayed sends +[\d,]+ msg/s \([\d.]+x plain\)", out), out
    assert re.search(r"p50 \d+ ms, p99 \d+ ms, max \d+ ms; early 0, missing 0", out), out
    assert re.search(r"FIFO group, 1,000 message groups +[\d,]+ msg/s \([\d.]+x plain\)", out), out
    for count in (1, 10, 100):
        assert re.search(rf"{count} subscription\(s\): SQL92 +[\d.]+ us, tag +[\d.]+ us", out), out
    assert re.search(r"sent and committed +[\d,]+ msg/s \([\d.]+x plain\)", out), out
    assert list(tmp_path.iterdir()) == [], "benchmark files are removed afterwards"
