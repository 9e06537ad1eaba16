"""``python -m bench [SECTION ...]``: run benchmark sections and print a results table.

Sections: ``store`` (the store beside the disk's raw limits), ``native`` (Sluice beside
RabbitMQ: durable sends and acked consumption, and Sluice's packed stream), ``mqtt`` (Sluice's
MQTT listener beside Mosquitto and RabbitMQ's MQTT plugin, with the load generator's own
ceiling), ``amqp`` (Sluice's AMQP 0-9-1 listener beside RabbitMQ: confirms and acks, 256 queues,
topic fan-out, latency), ``analytics`` (the Spark source beside ``spark.read.json``), ``latency``
(MQTT publish to a window aggregate on the dashboard stream, at 1,000 readings/s) and
``cluster`` (a three-node Sluice group beside single-node Sluice and a three-node RabbitMQ
cluster's quorum queue, AMQP with confirms), ``hardening`` (what hostile input costs: decoding
packets with 1, 1,000 and 100,000 user properties) and ``features`` (delayed messages: send rate and delivery against due time at
100,000 pending; FIFO groups; SQL92 filter cost at 1, 10 and 100 subscriptions; transactional
sends beside plain ones), ``push`` (push subscriptions to a local HTTP receiver: events/s at
concurrency 1, 16 and 64, publish-to-receiver latency at 1,000 events/s) and ``tier`` (an MQTT
QoS 1 load with tiering off and on: the load's ratio and the tiering throughput meanwhile). With no section named, all of them run.
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol

from . import (amqp_bench, analytics_bench, cluster_bench, features_bench, hardening_bench, latency_bench, mqtt_bench,
               native_bench, push_bench, store_bench, tier_bench)

REPO_ROOT = Path(__file__).resolve().parent.parent


class Rendered(Protocol):
    """A section's results: ``render()`` gives the text printed at the end."""

    def render(self) -> str: ...


Section = Callable[[argparse.Namespace, Path, Callable[[str], None]], Rendered]


def _store_section(options: argparse.Namespace, workdir: Path, log: Callable[[str], None]) -> Rendered:
    settings = _store_settings(options)
    return store_bench.run_section(settings, workdir / "store", log)


def _store_settings(options: argparse.Namespace) -> store_bench.Settings:
    """Settings of the store section from the command line (``--quick`` shrinks every count)."""
    settings = store_bench.Settings.smoke(options.records) if options.quick else store_bench.Settings()
    overrides = {name: value for name, value in (("records", options.records), ("seconds", options.seconds),
                                                 ("repeats", options.repeats)) if value is not None}
    return store_bench.Settings(**{**settings.__dict__, **overrides})


def _native_section(options: argparse.Namespace, workdir: Path, log: Callable[[str], None]) -> Rendered:
    return native_bench.run_section(_native_settings(options), workdir / "native", log)


def _native_settings(options: argparse.Namespace) -> native_bench.Settings:
    """Settings of the native section from the command line (``--quick`` shrinks every count)."""
    settings = native_bench.Settings.smoke(options.messages) if options.quick else native_bench.Settings()
    overrides = {name: value for name, value in (("messages", options.messages), ("rounds", options.repeats),
                                                 ("window", options.window)) if value is not None}
    return native_bench.Settings(**{**settings.__dict__, **overrides})


def _mqtt_section(options: argparse.Namespace, workdir: Path, log: Callable[[str], None]) -> Rendered:
    settings = mqtt_bench.Settings.smoke() if options.quick else mqtt_bench.Settings()
    overrides = {name: value for name, value in (("rounds", options.repeats), ("measured", options.seconds))
                 if value is not None}
    settings = mqtt_bench.Settings(**{**settings.__dict__, **overrides})
    return mqtt_bench.run_section(settings, workdir / "mqtt", log)


def _amqp_section(options: argparse.Namespace, workdir: Path, log: Callable[[str], None]) -> Rendered:
    settings = amqp_bench.Settings.smoke() if options.quick else amqp_bench.Settings()
    if options.repeats is not None:
        settings = amqp_bench.Settings(**{**settings.__dict__, "rounds": options.repeats})
    return amqp_bench.run_section(settings, workdir / "amqp", log)


def _analytics_section(options: argparse.Namespace, workdir: Path, log: Callable[[str], None]) -> Rendered:
    settings = analytics_bench.Settings.smoke() if options.quick else analytics_bench.Settings()
    if options.repeats is not None:
        settings = analytics_bench.Settings(**{**settings.__dict__, "rounds": options.repeats})
    return analytics_bench.run_section(settings, workdir / "analytics", log)


def _latency_section(options: argparse.Namespace, workdir: Path, log: Callable[[str], None]) -> Rendered:
    settings = latency_bench.Settings.smoke() if options.quick else latency_bench.Settings()
    if options.seconds is not None:
        settings = latency_bench.Settings(**{**settings.__dict__, "seconds": int(options.seconds)})
    return latency_bench.run_section(settings, workdir / "latency", log)


def _hardening_section(options: argparse.Namespace, workdir: Path, log: Callable[[str], None]) -> Rendered:
    settings = hardening_bench.Settings.smoke() if options.quick else hardening_bench.Settings()
    if options.repeats is not None:
        settings = hardening_bench.Settings(**{**settings.__dict__, "repeats": options.repeats})
    return hardening_bench.run_section(settings, workdir / "hardening", log)


def _features_section(options: argparse.Namespace, workdir: Path, log: Callable[[str], None]) -> Rendered:
    settings = features_bench.Settings.smoke() if options.quick else features_bench.Settings()
    if options.repeats is not None:
        settings = features_bench.Settings(**{**settings.__dict__, "rounds": options.repeats})
    return features_bench.run_section(settings, workdir / "features", log)


def _cluster_section(options: argparse.Namespace, workdir: Path, log: Callable[[str], None]) -> Rendered:
    settings = cluster_bench.Settings.smoke() if options.quick else cluster_bench.Settings()
    if options.repeats is not None:
        settings = cluster_bench.Settings(**{**settings.__dict__, "rounds": options.repeats})
    return cluster_bench.run_section(settings, workdir / "cluster", log)


def _push_section(options: argparse.Namespace, workdir: Path, log: Callable[[str], None]) -> Rendered:
    settings = push_bench.Settings.smoke() if options.quick else push_bench.Settings()
    return push_bench.run_section(settings, workdir / "push", log)


def _tier_section(options: argparse.Namespace, workdir: Path, log: Callable[[str], None]) -> Rendered:
    settings = tier_bench.Settings.smoke() if options.quick else tier_bench.Settings()
    overrides = {name: value for name, value in (("rounds", options.repeats), ("measured", options.seconds))
                 if value is not None}
    return tier_bench.run_section(tier_bench.Settings(**{**settings.__dict__, **overrides}), workdir / "tier", log)


SECTIONS: dict[str, Section] = {"push": _push_section, "tier": _tier_section, "store": _store_section, "native": _native_section, "mqtt": _mqtt_section,
                                "amqp": _amqp_section, "cluster": _cluster_section,
                                "analytics": _analytics_section, "latency": _latency_section,
                                "hardening": _hardening_section, "features": _features_section}
DEFAULT_SECTIONS = ("store", "native", "mqtt", "amqp", "cluster", "analytics", "latency", "hardening", "features",
                    "push", "tier")
"""Run when no section is named (``make bench``); on a 2-core machine the amqp section takes about
3 minutes and the mqtt one about 8."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="Sluice benchmarks. Prints progress as it goes and a results table at the end.")
    parser.add_argument("sections", nargs="*", metavar="SECTION",
                        help=f"sections to run, of: {', '.join(SECTIONS)} (default: {', '.join(DEFAULT_SECTIONS)})")
    parser.add_argument("--data-dir", help="where benchmark files go; a fresh subdirectory is made in it "
                        "and removed afterwards (default: under the repo's bench-data/, else the temp dir)")
    parser.add_argument("--quick", action="store_true",
                        help="short smoke run with small counts (native: 100-byte bodies only; "
                             "mqtt: one round of short runs)")
    parser.add_argument("--records", type=_positive_int, default=None,
                        help="store: records written and read back by the catch-up read (default 1,000,000; "
                             "20,000 with --quick)")
    parser.add_argument("--seconds", type=float, default=None,
                        help="store: time bound of each timed run (default 3; 0.25 with --quick); "
                             "latency: seconds measured after warm-up (default 60; 5 with --quick); "
                             "mqtt: seconds measured in each run after its warm-up (default 4; 0.3 with --quick)")
    parser.add_argument("--repeats", type=_positive_int, default=None,
                        help="runs of each measurement, medians reported; the native, mqtt and amqp sections' rounds "
                             "(default 3; 1 with --quick)")
    parser.add_argument("--messages", type=_positive_int, default=None,
                        help="native: messages per send/ack run (default 20,000; 1,000 with --quick)")
    parser.add_argument("--window", type=_positive_int, default=None,
                        help="native: sends in flight, RabbitMQ's unconfirmed publishes and Sluice's "
                             "concurrent sends (default 256)")
    options = parser.parse_args(argv)
    unknown = [name for name in options.sections if name not in SECTIONS]
    if unknown:
        parser.error(f"unknown section(s) {', '.join(unknown)}; choose from {', '.join(SECTIONS)}")
    options.sections = list(dict.fromkeys(options.sections)) or list(DEFAULT_SECTIONS)
    return options


def _positive_int(text: str) -> int:
    value = int(text.replace(",", "").replace("_", ""))
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text} is not a positive integer")
    return value


@contextmanager
def bench_directory(data_dir: str | None) -> Iterator[Path]:
    """A fresh directory for one benchmark run, removed afterwards."""
    parent = Path(data_dir) if data_dir else _default_parent()
    parent.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix="run-", dir=parent))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _default_parent() -> Path:
    """The repo's bench-data/ when it can be created, else the temp directory."""
    candidate = REPO_ROOT / "bench-data"
    if (REPO_ROOT / "pyproject.toml").exists():
        try:
            candidate.mkdir(exist_ok=True)
            return candidate
        except OSError:
            pass
    return Path(tempfile.gettempdir())


def _log(line: str) -> None:
    print(line, flush=True)


def main(argv: list[str] | None = None) -> int:
    options = parse_args(argv)
    started = time.perf_counter()
    reports: list[Rendered] = []
    with bench_directory(options.data_dir) as workdir:
        for name in options.sections:
            _log(f"== {name} ==")
            reports.append(SECTIONS[name](options, workdir, _log))
    print()
    for report in reports:
        print(report.render())
        print()
    print(f"total run time: {time.perf_counter() - started:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
