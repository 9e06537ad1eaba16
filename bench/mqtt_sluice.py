"""Sluice's MQTT listener for the MQTT benchmark: ``sluice serve`` as a child process.

Used once ``sluice serve --help`` lists ``--mqtt-port``; until then ``unavailable_reason`` says
so and the benchmark reports Mosquitto and the generator ceiling only. Like the native
benchmark's server, every ``--*-port`` flag gets a free loopback port and the data directory is
fresh and deleted afterwards. Sluice runs with ``--flush sync``: a PUBACK means the message is
on disk, which Mosquitto (``persistence false``) does not promise, so the comparison favours
Mosquitto. ``--allow-anonymous`` is passed when offered, since the load generator sends no
credentials.
"""
from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from .processes import LOOPBACK, ServerUnavailable, free_ports, stop_process_group, tail, wait_for_port
from .sluice_server import _PORT_FLAG, REPO_ROOT, USER, _serve_command, _serve_flags

Log = Callable[[str], None]

START_TIMEOUT = 60.0
STOP_TIMEOUT = 30.0
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
    flags = _serve_flags()
    assert isinstance(flags, set)
    port_flags = sorted(flag for flag in flags if _PORT_FLAG.fullmatch(flag))
    ports = dict(zip(port_flags, free_ports(len(port_flags))))
    parent.mkdir(parents=True, exist_ok=True)
    directory = Path(tempfile.mkdtemp(prefix="sluice-mqtt-", dir=parent))
    with ExitStack() as cleanup:
        cleanup.callback(shutil.rmtree, directory, True)
        output_path = directory / "server-output.log"
        output = open(output_path, "wb")
        cleanup.callback(output.close)
        (directory / "data").mkdir()
        command = [*_serve_command(), "--data-dir", str(directory / "data"), "--flush", flush]
        if "--allow-anonymous" in flags:
            command.append("--allow-anonymous")
        for flag, port in ports.items():
            command += [flag, str(port)]
        env = {key: value for key, value in os.environ.items() if not key.startswith("SLUICE_")}
        env.update(SLUICE_AUTH_DEFAULT_USER=USER, SLUICE_AUTH_DEFAULT_PASSWORD=secrets.token_hex(8))
        started = time.monotonic()
        process = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL,
                                   stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
        cleanup.callback(stop_process_group, process, STOP_TIMEOUT)
        try:
            wait_for_port(ports["--mqtt-port"], started + timeout, process, "sluice serve")
        except ServerUnavailable as error:
            raise ServerUnavailable(f"Sluice MQTT listener did not start: {error}\n{tail([output_path])}") from None
        server = SluiceMqtt(ports["--mqtt-port"], directory, process.pid)
        log(f"Sluice up with --flush {flush}, MQTT on {LOOPBACK}:{server.port} "
            f"after {time.monotonic() - started:.1f}s")
        yield server
