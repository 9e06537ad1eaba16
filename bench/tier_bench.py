"""Tiering under load: what copying sealed segments to the tier costs a broker that takes a
sustained MQTT QoS 1 load, and how fast it tiers meanwhile.

Each round runs the same load (``mqtt_load``: publisher processes, each with a bounded window
of unacknowledged QoS 1 publishes, bounded by nothing else) twice against a fresh `sluice serve
--flush sync`: once with tiering off, once tiering to a local directory with small segments
(``segment_size``), so that segments seal and are tiered throughout the measured window. Which
of the two goes first alternates by round. Reported: the median acknowledged publishes per
second each way, their ratio (on / off, target at least 0.9), and the median tiering
throughput while loaded: commit-log bytes tiered per second over the measured window (how far
the tier's ``tiered_end`` moved, from the admin API's ``GET /tier``), and, labelled apart, the Parquet
bytes written for them (``sluice_tier_bytes_total``).

``measure`` is the whole measurement; ``figure_lines`` its result lines, for any section that
reports them (``analytics`` as well as ``tier``).
"""
from __future__ import annotations

import base64
import json
import re
import statistics
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from . import mqtt_wire as wire
from .mqtt_load import PubSpec, Schedule, run_load
from .processes import LOOPBACK
from .report import MeasuredSection
from .sluice_server import serve_process

Log = Callable[[str], None]
TARGET_RATIO = 0.9
_TIER_BYTES = re.compile(r"^sluice_tier_bytes_total(?:\{[^}]*\})?\s+(\S+)$", re.MULTILINE)


@dataclass(frozen=True)
class Settings:
    rounds: int = 3
    publishers: int = 4
    window: int = 64
    size: int = 1024
    segment_size: int = 4 << 20
    warmup: float = 2.0
    measured: float = 10.0
    check_interval_ms: int = 500
    timeout: float = 120.0

    @classmethod
    def smoke(cls) -> Settings:
        return cls(rounds=1, publishers=2, segment_size=1 << 20, warmup=0.5, measured=3.0)


@dataclass(frozen=True)
class TieringFigures:
    """Medians over the rounds."""

    off_msg_per_s: float
    on_msg_per_s: float
    tier_mb_per_s: float
    """Commit-log bytes tiered per second (the input), MB/s."""
    parquet_mb_per_s: float
    """Parquet bytes written per second (the output), MB/s."""
    rounds: int

    @property
    def ratio(self) -> float:
        return self.on_msg_per_s / self.off_msg_per_s if self.off_msg_per_s else 0.0


def measure(settings: Settings, workdir: Path, log: Log) -> TieringFigures:
    """Alternating rounds of the load with tiering off and on; the medians."""
    off: list[float] = []
    on: list[float] = []
    tiered: list[float] = []
    parquet: list[float] = []
    for round_ in range(settings.rounds):
        for tiering in ((False, True) if round_ % 2 == 0 else (True, False)):
            rate, log_mb, parquet_mb = _run(settings, workdir / f"round{round_}-{'on' if tiering else 'off'}",
                                            tiering)
            log(f"round {round_ + 1}: tiering {'on' if tiering else 'off'}: {rate:,.0f} msg/s"
                + (f", tiered {log_mb:.1f} MB/s of log ({parquet_mb:.2f} MB/s of Parquet)" if tiering else ""))
            (on if tiering else off).append(rate)
            if tiering:
                tiered.append(log_mb)
                parquet.append(parquet_mb)
    return TieringFigures(statistics.median(off), statistics.median(on), statistics.median(tiered),
                          statistics.median(parquet), settings.rounds)


def figure_lines(figures: TieringFigures) -> list[str]:
    """The two lines the issue asks for, and the rates they come from."""
    verdict = "PASS" if figures.ratio >= TARGET_RATIO else "MISS"
    return [f"MQTT QoS 1 load with tiering off: {figures.off_msg_per_s:,.0f} msg/s; on: "
            f"{figures.on_msg_per_s:,.0f} msg/s (medians of {figures.rounds} rounds)",
            f"load ratio tiering on / off: {figures.ratio:.2f} (target >= {TARGET_RATIO}: {verdict})",
            f"tiering throughput while loaded: {figures.tier_mb_per_s:.1f} MB/s of commit log tiered "
            f"({figures.parquet_mb_per_s:.2f} MB/s of Parquet written) to a local-directory tier"]


def run_section(settings: Settings, workdir: Path, log: Log) -> MeasuredSection:
    figures = measure(settings, workdir, log)
    return MeasuredSection("Tiering under MQTT QoS 1 load", [(
        f"{settings.publishers} publishers x window {settings.window}, {settings.size}-byte "
        f"messages, {settings.segment_size >> 20} MiB segments", figure_lines(figures))])


def _run(settings: Settings, directory: Path, tiering: bool) -> tuple[float, float, float]:
    """One load run on a fresh broker: (acknowledged publishes/s, MB/s of log tiered and of
    Parquet written in the measured window)."""
    directory.mkdir(parents=True)
    config = directory / "sluice.toml"
    tier = f'[tier]\nurl = "file://{directory / "tier"}"\ncheck_interval_ms = ' \
           f'{settings.check_interval_ms}\n' if tiering else ""
    config.write_text(f"[store]\nsegment_size = {settings.segment_size}\n{tier}")
    with serve_process(directory, wait_for=("--mqtt-port", "--admin-port"),
                       extra=("--config", str(config)), password=wire.PASSWORD,
                       prefix="sluice-tier-") as running:
        admin = f"http://{LOOPBACK}:{running.ports['--admin-port']}"
        publishers = [PubSpec(f"tier-pub{i}", (f"tiered/dev{i}/reading",), 1, size=settings.size,
                              window=settings.window) for i in range(settings.publishers)]
        parquet: list[float] = []

        def probe() -> float:
            parquet.append(_parquet_bytes(admin, running.password))
            return float(json.loads(_get(admin, "/tier", running.password)).get("tiered_end") or 0)
        run = run_load(running.ports["--mqtt-port"], publishers, [], settings.timeout,
                       Schedule(settings.warmup, settings.measured), probe=probe if tiering else None)
    if not tiering or not run.seconds:
        return run.publish_msg_per_s, 0.0, 0.0
    parquet_bytes = parquet[-1] - parquet[0] if len(parquet) >= 2 else 0.0
    return run.publish_msg_per_s, (run.probed or 0.0) / run.seconds / 1e6, parquet_bytes / run.seconds / 1e6


def _parquet_bytes(admin: str, password: str) -> float:
    """``sluice_tier_bytes_total`` (Parquet uploaded) from the broker's metrics."""
    found = _TIER_BYTES.search(_get(admin, "/metrics", password))
    return float(found.group(1)) if found else 0.0


def _get(admin: str, path: str, password: str) -> str:
    """The admin API's answer to ``GET path`` as the default user."""
    request = urllib.request.Request(f"{admin}{path}")
    token = base64.b64encode(f"{wire.USERNAME}:{password}".encode()).decode()
    request.add_header("Authorization", f"Basic {token}")
    with urllib.request.urlopen(request, timeout=30) as response:
        return response.read().decode()
