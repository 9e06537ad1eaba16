"""Sluice's MQTT listener for the MQTT benchmark: ``sluice serve`` as a child process.

Used once ``sluice serve --help`` lists ``--mqtt-port``; until then ``unavailable_reason`` says
so and the benchmark reports Mosquitto and the generator ceiling only. Like the native
benchmark's server, every ``--*-port`` flag gets a free loopback port and the data directory is
fresh and deleted afterwards. Sluice runs with ``--flush sync``: a PUBACK means the message is
on disk, which Mosquitto (``persistence false``) does not promise, so the comparison favours
Mosquitto. The load generator logs in as the default user sluice/sluice.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from . import mqtt_wire as wire
from .processes import LOOPBACK, ServerUnavailable
from .sluice_server import START_TIMEOUT, _serve_flags, serve_process

Log = Callable[[str], None]

NOT_YET = "Sluice MQTT listener not available yet"


@dataclass(frozen=True)
class SluiceMqtt:
    port: int
    directory: Path
    pid: int

    @property
    def output(self) -> Path:
        return self.directory / "server-output.log"


def unavailable_reason() -> str | None:
    """Why Sluice cannot be benchmarked over MQTT yet, or None when it can."""
    flags = _serve_flags()
    if isinstance(flags, str):
        return flags
    if "--mqtt-port" not in flags:
        return "`sluice serve --help` lists no --mqtt-port flag"
    return None


@contextmanager
def sluice_mqtt_server(parent: Path, log: Log, flush: str = "sync",
                       timeout: float = START_TIMEOUT) -> Iterator[SluiceMqtt]:
    """Start ``sluice serve`` with its MQTT listener under ``parent``; stop it and delete its data on exit."""
    reason = unavailable_reason()
    if reason is not None:
        raise ServerUnavailable(f"{NOT_YET}: {reason}")
    with serve_process(parent, wait_for=("--mqtt-port",), flush=flush, password=wire.PASSWORD,
                       prefix="sluice-mqtt-", timeout=timeout) as running:
        server = SluiceMqtt(running.ports["--mqtt-port"], running.directory, running.pid)
        log(f"Sluice up with --flush {flush}, MQTT on {LOOPBACK}:{server.port} "
            f"after {time.monotonic() - running.started:.1f}s")
        yield server
