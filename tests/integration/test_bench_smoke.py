"""`make bench` keeps working: the store and native sections run end to end in their smoke modes."""
from __future__ import annotations

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
    assert "Sluice    " in out or "Sluice native server not available" in out, out
    if "RabbitMQ  confirm window" in out and "Sluice    " in out:
        assert "Sluice/RabbitMQ" in out, out
    assert "failed in round" not in out, out
    assert list(tmp_path.iterdir()) == [], "benchmark files are removed afterwards"
