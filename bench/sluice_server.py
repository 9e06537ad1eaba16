"""A Sluice broker for the native benchmark: ``sluice serve`` as a child process, sync flush.

Every listener port the ``serve`` command accepts (``--native-port``, ``--admin-port``, and any
other ``--*-port`` that ``serve --help`` lists) gets a free loopback port, so the benchmark never
clashes with a broker already running on the default ports. The data directory is fresh and
deleted afterwards; the broker creates its default user there with a password made for this run
(``SLUICE_AUTH_DEFAULT_USER``/``_PASSWORD``), and topics are created through the admin API.
"""
from __future__ import annotations

import base64
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from .processes import LOOPBACK, ServerUnavailable, free_ports, stop_process_group, tail, wait_for_port

Log = Callable[[str], None]

REPO_ROOT = Path(__file__).resolve().parent.parent
START_TIMEOUT = 60.0
STOP_TIMEOUT = 30.0
SDK_NAMES = ("Producer", "SimpleConsumer", "PullConsumer", "ClientConfig", "Message")
_PORT_FLAG = re.compile(r"(--[a-z0-9-]+-port)\b")


USER = "bench"


@dataclass(frozen=True)
class SluiceServer:
    """A running broker: where its native (gRPC) listener and admin API are, and who may log in."""

    native_port: int
    admin_port: int
    password: str
    directory: Path
    pid: int

    @property
    def endpoint(self) -> str:
        return f"{LOOPBACK}:{self.native_port}"

    @property
    def credentials(self) -> tuple[str, str]:
        """Access key and secret key of the broker's (admin) default user."""
        return USER, self.password

    def create_topic(self, name: str, queues: int = 1, message_type: str = "normal") -> None:
        """Create topic ``name`` with ``queues`` queues through the admin API."""
        self._admin("POST", "/topics", {"name": name, "queue_count": queues,
                                        "message_type": message_type})

    def create_group(self, name: str, fifo: bool = False) -> None:
        """Create consumer group ``name`` (``fifo``: consumes each message group in order)."""
        self._admin("POST", "/groups", {"name": name, "fifo": fifo})

    def delete_topic(self, name: str) -> None:
        self._admin("DELETE", f"/topics/{name}")

    def _admin(self, method: str, path: str, body: object = None) -> None:
        token = base64.b64encode(f"{USER}:{self.password}".encode()).decode()
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"http://{LOOPBACK}:{self.admin_port}{path}", data=data,
                                         method=method, headers={"Authorization": f"Basic {token}",
                                                                 "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30):
            pass


def _serve_command() -> list[str]:
    return [sys.executable, "-m", "sluice.cli", "serve"]


def unavailable_reason() -> str | None:
    """Why the native benchmark cannot run against Sluice, or None when it can.

    Needs the SDK (``sluice.client`` with the producer and both consumers) and a
    ``sluice serve`` that starts the native listener with sync flush.
    """
    try:
        import sluice.client as sdk
    except Exception as error:  # noqa: BLE001 - any import failure means "not there yet"
        return f"the native SDK does not import ({type(error).__name__}: {error})"
    missing = [name for name in SDK_NAMES if not hasattr(sdk, name)]
    if missing:
        return f"the native SDK has no {', '.join(missing)} yet"
    flags = _serve_flags()
    if isinstance(flags, str):
        return flags
    missing = [flag for flag in ("--native-port", "--admin-port", "--data-dir", "--flush")
               if flag not in flags]
    if missing:
        return f"`sluice serve` takes no {', '.join(missing)} yet"
    return None


def _serve_flags() -> set[str] | str:
    """The flags ``sluice serve --help`` lists, or why it could not be asked."""
    try:
        done = subprocess.run([*_serve_command(), "--help"], cwd=REPO_ROOT, capture_output=True,
                              text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"`sluice serve --help` failed: {error}"
    if done.returncode != 0:
        return f"`sluice serve --help` exited with {done.returncode}: {done.stderr.strip()[-300:]}"
    return set(re.findall(r"--[a-z0-9-]+", done.stdout))


@dataclass(frozen=True)
class ServeProcess:
    """A running ``sluice serve`` child: its ports by flag, default user's password, data and pid."""

    ports: dict[str, int]
    password: str
    directory: Path
    pid: int
    started: float


@contextmanager
def serve_process(parent: Path, *, wait_for: tuple[str, ...], extra: tuple[str, ...] = (),
                  flush: str = "sync", prefix: str = "sluice-", password: str | None = None,
                  timeout: float = START_TIMEOUT) -> Iterator[ServeProcess]:
    """Run ``sluice serve`` on a fresh data directory under ``parent``, every ``--*-port`` flag
    on a free loopback port, until the ports named in ``wait_for`` accept connections; stop it
    and delete its data on exit. The default user gets ``password`` (a fresh random one if
    None). Raises ServerUnavailable with the server's output if it fails."""
    flags = _serve_flags()
    assert isinstance(flags, set)
    port_flags = sorted(flag for flag in flags if _PORT_FLAG.fullmatch(flag))
    ports = dict(zip(port_flags, free_ports(len(port_flags))))
    parent.mkdir(parents=True, exist_ok=True)
    directory = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    with ExitStack() as cleanup:
        cleanup.callback(shutil.rmtree, directory, True)
        output_path = directory / "server-output.log"
        output = open(output_path, "wb")
        cleanup.callback(output.close)
        (directory / "data").mkdir()
        command = [*_serve_command(), "--data-dir", str(directory / "data"), "--flush", flush, *extra]
        for flag, port in ports.items():
            command += [flag, str(port)]
        password = password or secrets.token_hex(8)
        env = {key: value for key, value in os.environ.items() if not key.startswith("SLUICE_")}
        env.update(SLUICE_AUTH_DEFAULT_USER=USER, SLUICE_AUTH_DEFAULT_PASSWORD=password,
                   SLUICE_STORE_PREALLOCATE="eager")  # measured as a server runs
        started = time.monotonic()
        process = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL,
                                   stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
        cleanup.callback(stop_process_group, process, STOP_TIMEOUT)
        try:
            for flag in wait_for:
                wait_for_port(ports[flag], started + timeout, process, "sluice serve")
        except ServerUnavailable as error:
            raise ServerUnavailable(f"sluice serve did not start: {error}\n{tail([output_path])}") from None
        yield ServeProcess(ports, password, directory, process.pid, started)


@contextmanager
def sluice_server(parent: Path, log: Log, timeout: float = START_TIMEOUT) -> Iterator[SluiceServer]:
    """Start ``sluice serve --flush sync`` under ``parent``; stop it and delete its data on exit."""
    reason = unavailable_reason()
    if reason is not None:
        raise ServerUnavailable(f"Sluice native server not available: {reason}")
    with serve_process(parent, wait_for=("--native-port", "--admin-port"), timeout=timeout) as running:
        server = SluiceServer(running.ports["--native-port"], running.ports["--admin-port"],
                              running.password, running.directory, running.pid)
        log(f"Sluice up with sync flush, native gRPC on {server.endpoint} "
            f"after {time.monotonic() - running.started:.1f}s")
        yield server
