"""`sluice simulate`: run the telemetry device simulator against a broker's MQTT port."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time

from .simulator import simulate


def add_simulate_command(commands: argparse._SubParsersAction) -> None:
    """Register `simulate` under ``commands``."""
    text = ("Publish IoT telemetry over MQTT: DEVICES devices report temperature, humidity and "
            "battery as JSON on devices/<id>/telemetry, with drift, noise, gaps and occasional "
            "anomalies. Prints progress every 10,000 messages and a summary.")
    sub = commands.add_parser("simulate", help="Publish simulated device telemetry over MQTT.",
                              description=text)
    sub.add_argument("--mqtt", default="127.0.0.1:1883", metavar="HOST:PORT",
                     help="the broker's MQTT listener (default: %(default)s)")
    sub.add_argument("--user", default=os.environ.get("SLUICE_USER", "sluice"),
                     help="user name (default: $SLUICE_USER, else sluice)")
    sub.add_argument("--password", default=os.environ.get("SLUICE_PASSWORD", "sluice"),
                     help="password (default: $SLUICE_PASSWORD, else sluice)")
    sub.add_argument("--devices", type=int, default=1000, help="fleet size (default: %(default)s)")
    sub.add_argument("--count", type=int, default=10_000,
                     help="readings to publish, 0 for until Ctrl+C (default: %(default)s)")
    sub.add_argument("--rate", type=float, default=1000.0,
                     help="readings per second, 0 for as fast as acknowledged (default: %(default)s)")
    sub.add_argument("--qos", type=int, choices=(0, 1), default=1, help="MQTT QoS (default: %(default)s)")
    sub.add_argument("--seed", type=int, default=1, help="random seed: same seed, same fleet")
    sub.set_defaults(handler=_simulate)


def _simulate(args: argparse.Namespace) -> int:
    host, _, port = args.mqtt.rpartition(":")
    if not host or not port.isdigit():
        print(f"error: --mqtt {args.mqtt!r} is not HOST:PORT", file=sys.stderr)
        return 2
    started = time.monotonic()

    def progress(done: int) -> None:
        print(f"  {done:,} readings published ({done / (time.monotonic() - started):,.0f}/s)", flush=True)

    try:
        done = asyncio.run(simulate(host, int(port), args.user, args.password, devices=args.devices,
                                    count=args.count, rate=args.rate, qos=args.qos, seed=args.seed,
                                    progress=progress))
    except OSError as error:
        print(f"error: cannot publish to {args.mqtt}: {error}; is `sluice serve` running there?",
              file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("simulator stopped", flush=True)
        return 0
    elapsed = time.monotonic() - started
    print(f"{done:,} readings from {args.devices:,} devices in {elapsed:.1f} s "
          f"({done / elapsed:,.0f}/s)")
    return 0
