"""Fixtures shared by every test directory: ``sluice_server`` starts `sluice serve` as a real
process; ``cert_files`` makes a self-signed certificate for 127.0.0.1; ``mount_tmpfs`` mounts a
small real file system that fills up; ``faults`` injects disk faults under the store;
``seaweedfs`` runs a real S3 service (tier_support.py) for the tests of a session."""
from __future__ import annotations

import datetime
import errno
import ipaddress
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from sluice.server.app import READY_LINE
from store import fileops
from store.faults import FaultyFileOps
from tests.tier_support import S3Endpoint, SeaweedFS

ROOT = Path(__file__).resolve().parents[1]
SLUICE = [sys.executable, "-m", "sluice.cli"]
CONFIG = """
[store]
segment_size = 4_194_304
[auth]
default_password = "sluice"
"""


class Server:
    """A `sluice serve` child process and the endpoints it printed."""

    def __init__(self, data_dir: Path, *extra: str, config: str = CONFIG,
                 env: dict[str, str] | None = None) -> None:
        """Start `sluice serve` on ``data_dir``; ports are 0 unless ``extra`` names them.
        ``env``: variables to set besides the test's own environment (whose SLUICE_* are
        left out)."""
        config_file = data_dir.parent / "sluice.toml"
        config_file.write_text(config)
        ports = [] if "--native-port" in extra else ["--native-port", "0", "--admin-port", "0"]
        ports += [] if "--mqtt-port" in extra else ["--mqtt-port", "0"]
        ports += [] if "--mqtt-ws-port" in extra else ["--mqtt-ws-port", "0"]
        ports += [] if "--amqp-port" in extra else ["--amqp-port", "0"]
        ports += [] if "--amqp-tls-port" in extra else ["--amqp-tls-port", "0"]
        self.process = subprocess.Popen(
            [*SLUICE, "serve", "--config", str(config_file), "--data-dir", str(data_dir), *ports, *extra],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**clean_env(), **(env or {})})
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.output: list[str] = []
        self._log: list[str] = []
        self._log_ended = False
        self._log_grew = threading.Condition()
        threading.Thread(target=self._pump, daemon=True).start()
        threading.Thread(target=self._pump_log, daemon=True).start()

    def _pump(self) -> None:
        for line in self.process.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def _pump_log(self) -> None:
        """Read stderr as it is written: a broker logging more than a pipe holds must never
        block on a test that reads its log only at the end."""
        for line in self.process.stderr:
            with self._log_grew:
                self._log.append(line)
                self._log_grew.notify_all()
        with self._log_grew:
            self._log_ended = True
            self._log_grew.notify_all()

    def log(self) -> str:
        """What the broker wrote to stderr so far: all of it once the process has ended."""
        with self._log_grew:
            if self.process.poll() is not None:
                self._log_grew.wait_for(lambda: self._log_ended, timeout=10)
            return "".join(self._log)

    def follow_log(self) -> Iterator[str]:
        """The broker's stderr lines from the first, each as soon as it is written, until the
        process ends."""
        seen = 0
        while True:
            with self._log_grew:
                self._log_grew.wait_for(lambda: seen < len(self._log) or self._log_ended)
                lines = self._log[seen:]
                if not lines:
                    return
                seen = len(self._log)
            yield from lines

    def wait_ready(self, timeout: float = 60) -> None:
        """Read stdout until the ready line; fail with stderr if the process ends first."""
        while True:
            line = self.lines.get(timeout=timeout)
            if line is None:
                raise AssertionError(f"sluice serve exited early: {self.process.wait()}\n"
                                     f"{''.join(self.output)}{self.log()}")
            self.output.append(line)
            if line.startswith(READY_LINE):
                break
        text = "".join(self.output)
        self.native = re.search(r"native gRPC\s+(\S+)", text).group(1)
        self.admin = re.search(r"admin API\s+(\S+)", text).group(1)
        self.mqtt = re.search(r"MQTT TCP\s+(\S+)", text).group(1)
        """host:port of the MQTT TCP listener."""
        self.mqtt_ws = re.search(r"MQTT WS\s+(\S+)", text).group(1)
        """ws:// URL of the MQTT WebSocket listener."""
        amqp = re.search(r"AMQP\s+(\S+)", text)
        self.amqp = amqp.group(1) if amqp else None
        """host:port of the AMQP listener (None when it is off)."""

    def stop(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(timeout=60)
        while (line := self.lines.get(timeout=10)) is not None:
            self.output.append(line)
        return code

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def stop_with_stacks(self) -> str:
        """For a broker that seems stuck: have it print every thread's stack (SIGUSR1) and
        where its tasks wait (SIGUSR2), both handled before the SIGTERM that follows; stop it
        (killed if it cannot stop in 20 s) and return the end of its stderr."""
        if self.process.poll() is None:
            for signum in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM):
                self.process.send_signal(signum)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.log()[-12000:]


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}



@pytest.fixture
def sluice_server() -> Iterator[Callable[..., Server]]:
    """``start(data_dir, *flags, config=TOML, env=VARIABLES)`` runs `sluice serve`; all are
    killed at the end."""
    started: list[Server] = []

    def start(data_dir: Path, *extra: str, config: str = CONFIG,
              env: dict[str, str] | None = None) -> Server:
        server = Server(data_dir, *extra, config=config, env=env)
        started.append(server)
        return server
    yield start
    for server in started:
        server.kill()


class CertFiles(NamedTuple):
    cert: str
    key: str


def write_self_signed_cert(folder: Path) -> CertFiles:
    """Write ``cert.pem`` and ``key.pem`` for a self-signed 127.0.0.1 certificate into ``folder``."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder()
            .subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    files = CertFiles(str(folder / "cert.pem"), str(folder / "key.pem"))
    Path(files.cert).write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    Path(files.key).write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                  serialization.NoEncryption()))
    return files


@pytest.fixture
def make_cert_files(tmp_path: Path) -> Callable[[str], CertFiles]:
    """``make_cert_files(name)``: a fresh self-signed 127.0.0.1 certificate in ``tmp_path/name``."""
    def make(name: str) -> CertFiles:
        (tmp_path / name).mkdir()
        return write_self_signed_cert(tmp_path / name)
    return make


@pytest.fixture
def cert_files(make_cert_files: Callable[[str], CertFiles]) -> CertFiles:
    """A fresh self-signed certificate and key for 127.0.0.1, as PEM file paths."""
    return make_cert_files("tls")


@pytest.fixture
def mount_tmpfs(tmp_path: Path) -> Iterator[Callable[[str], Path]]:
    """``mount_tmpfs("24m")``: a fresh tmpfs of that size under ``tmp_path``, unmounted at the
    end; the test is skipped where mounting is not permitted (fault injection covers those)."""
    mounted: list[Path] = []

    def mount(size: str) -> Path:
        mountpoint = tmp_path / f"disk{len(mounted)}"
        mountpoint.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}",
                               f"sluice-test-{uuid.uuid4().hex[:8]}", str(mountpoint)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip() or done.returncode}); "
                        "the store's fault-injection tests cover a full disk")
        mounted.append(mountpoint)
        return mountpoint
    yield mount
    for mountpoint in mounted:
        subprocess.run(["umount", "-l", str(mountpoint)], check=False)


def fill_disk(path: Path) -> None:
    """Write ``path`` until its file system (a ``mount_tmpfs`` disk) has no room left."""
    with open(path, "wb", buffering=0) as filler:
        for chunk in (1 << 20, 4096):
            try:
                while True:
                    filler.write(bytes(chunk))
            except OSError as error:
                assert error.errno == errno.ENOSPC, error


@pytest.fixture
def faults() -> Iterator[FaultyFileOps]:
    """A ``FaultyFileOps`` serving every store file operation of this process for the test (no
    fault yet: ``faults.add(Fault(...))``)."""
    ops = FaultyFileOps()
    previous = fileops.install(ops)
    yield ops
    fileops.install(previous)


@pytest.fixture(scope="session")
def seaweedfs_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedFS]:
    """A SeaweedFS S3 service on 127.0.0.1 for the session; ``stop()``/``start()`` or
    ``with seaweedfs_server.down():`` take it down and bring it back on the same port."""
    server = SeaweedFS(tmp_path_factory.mktemp("seaweedfs"))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def seaweedfs(seaweedfs_server: SeaweedFS) -> S3Endpoint:
    """(endpoint, access_key, secret_key, bucket) of the session's SeaweedFS. A test that takes
    it down brings it back (``seaweedfs_server.down()`` does)."""
    return seaweedfs_server.info
