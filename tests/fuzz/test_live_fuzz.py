"""The short live-fuzz pass CI runs: `python -m tests.fuzz.live_fuzz` for 20 s with a fixed
seed against a real `sluice serve` (``make fuzz`` runs it for minutes)."""
from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT, clean_env

SEED = 20_241_124


def test_a_short_live_fuzz_pass_keeps_the_broker_up_healthy_and_bounded():
    done = subprocess.run([sys.executable, "-m", "tests.fuzz.live_fuzz", "--seconds", "20",
                           "--seed", str(SEED), "--progress-every", "10"],
                          cwd=ROOT, capture_output=True, text=True, timeout=240, env=clean_env())
    out = done.stdout
    assert done.returncode == 0, f"{out[-6000:]}\n{done.stderr[-3000:]}"
    assert f"live fuzz summary (seed {SEED})" in out, out[-3000:]
    for kind in ("tcp-connect", "tcp-session", "ws-session", "ws-raw", "slow-drip", "huge-count",
                 "grpc", "amqp-connect", "amqp-session", "forged"):
        assert f"  {kind} " in out, f"no {kind} cases were sent:\n{out[-3000:]}"
    assert "healthy QoS 1 round trips:" in out and "passed:" in out, out[-3000:]
    assert "healthy AMQP round trips:" in out, out[-3000:]
