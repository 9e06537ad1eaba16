"""`make bench` keeps working: the store section runs end to end in its smoke mode."""
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
