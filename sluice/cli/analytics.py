"""`sluice analytics telemetry`: run the telemetry streaming job on a local Spark."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from typing import Any


def add_analytics_commands(commands: argparse._SubParsersAction) -> None:
    """Register `analytics telemetry` under ``commands``."""
    analytics = commands.add_parser("analytics", help="Spark jobs over Sluice topics.",
                                    description="Spark jobs over Sluice topics.")
    jobs = analytics.add_subparsers(dest="job", required=True, metavar="JOB")
    text = ("Read device telemetry (JSON on topic devices, e.g. from `sluice simulate`) with "
            "Structured Streaming; write per-device window aggregates to OUTPUT/aggregates "
            "(Parquet, by date), unreadable payloads with the reason to OUTPUT/quarantine, and "
            "with --results-topic the aggregates back into Sluice. Restarting with the same "
            "--checkpoint resumes where it stopped.")
    job = jobs.add_parser("telemetry", help="Per-device window aggregates and anomalies.",
                          description=text)
    source = job.add_mutually_exclusive_group(required=True)
    source.add_argument("--data-dir", metavar="DIR", help="read the store in DIR directly")
    source.add_argument("--endpoint", metavar="HOST:PORT", help="read a running broker (native port)")
    job.add_argument("--topic", default="devices", help="topic to read (default: %(default)s)")
    job.add_argument("--output", required=True, metavar="DIR", help="where Parquet output goes")
    job.add_argument("--checkpoint", required=True, metavar="DIR", help="Spark checkpoint directory")
    job.add_argument("--window", default="1 minute", help="tumbling window (default: %(default)s)")
    job.add_argument("--watermark", default="30 seconds",
                     help="how late a reading may arrive (default: %(default)s)")
    job.add_argument("--anomaly-threshold", type=float, default=10.0, metavar="DEGREES",
                     help="window extremes this far from its average are an anomaly (default: %(default)s)")
    job.add_argument("--archive-every", default="1 minute", metavar="INTERVAL",
                     help="how often the Parquet queries run; the results query runs as often "
                     "as it can (default: %(default)s)")
    job.add_argument("--results-topic", metavar="TOPIC",
                     help="also publish aggregates to TOPIC (needs --endpoint or --results-endpoint)")
    job.add_argument("--results-endpoint", metavar="HOST:PORT", help="broker for --results-topic")
    job.add_argument("--user", default=os.environ.get("SLUICE_USER", "sluice"))
    job.add_argument("--password", default=os.environ.get("SLUICE_PASSWORD", "sluice"))
    job.add_argument("--available-now", action="store_true",
                     help="process what is there, then stop (default: run until Ctrl+C)")
    job.set_defaults(handler=_telemetry)


def _telemetry(args: argparse.Namespace) -> int:
    results_endpoint = args.results_endpoint or args.endpoint
    if args.results_topic and not results_endpoint:
        print("error: --results-topic needs --endpoint or --results-endpoint", file=sys.stderr)
        return 2
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # Spark's workers: this Python
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        print("error: the Spark job needs PySpark, which the broker's own install leaves out: "
              "install the analytics extra (.venv/bin/pip install -e '.[analytics]', or run "
              "`make demo` once); Spark also needs Java 17 or later", file=sys.stderr)
        return 2

    from analytics.telemetry_job import JobSettings, ResultsTopic, start

    spark = (SparkSession.builder.master("local[*]").appName("sluice-telemetry")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .getOrCreate())
    stop = _stop_requested()  # after getOrCreate, which installs a SIGINT handler of its own
    spark.sparkContext.setLogLevel("WARN")
    source = {"subscribe": args.topic, "user": args.user, "password": args.password}
    source.update({"path": args.data_dir} if args.data_dir else {"endpoint": args.endpoint})
    results = (ResultsTopic(results_endpoint, args.results_topic, args.user, args.password)
               if args.results_topic else None)
    print(f"starting the queries, each once the one before has read messages from {args.topic}",
          flush=True)
    try:
        queries = start(spark, source, args.output, args.checkpoint,
                        JobSettings(args.window, args.watermark, args.anomaly_threshold,
                                    args.archive_every),
                        available_now=args.available_now, results=results, cancel=stop)
        if not stop.is_set():
            print(f"telemetry job running: {len(queries)} queries, output in {args.output}",
                  flush=True)
        return _watch(queries, stop)
    finally:
        if stop.is_set():
            print("stopping the telemetry job", flush=True)
            spark.sparkContext.setLogLevel("OFF")  # queries stopped mid-batch are not errors
        for query in spark.streams.active:
            query.stop()
        spark.stop()


def _stop_requested() -> threading.Event:
    """An event SIGINT (Ctrl+C) and SIGTERM set. PySpark's own SIGINT handler calls into the
    JVM from inside the signal handler, in the middle of whatever call the main thread is
    making, and both sides print pages of tracebacks; this one only sets the event, which the
    main thread checks between its (short) calls."""
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    return stop


def _watch(queries: list[Any], stop: threading.Event) -> int:
    """Wait for the queries to end (or ``stop``), printing progress every 10 s; 1 if one failed."""
    reported = time.monotonic()
    for query in queries:
        while not stop.is_set() and not query.awaitTermination(1):
            if time.monotonic() - reported >= 10 and (progress := query.lastProgress):
                reported = time.monotonic()
                print(f"  {query.name}: batch {progress['batchId']}, "
                      f"{progress['numInputRows']} rows", flush=True)
        if stop.is_set():
            return 0
        if query.exception() is not None:
            print(f"error: {query.name} failed: {query.exception()}", file=sys.stderr)
            return 1
    return 0
