"""docker/Dockerfile built and run by a real container engine: Docker's daemon (Debian's
docker.io, which .ci/run installs), started by the test as root on a data root of its own.

No registry is reachable here, so the base image is Debian bookworm with its Python 3.11, made by
mmdebstrap from Debian's packages and imported (the Dockerfile's PYTHON_IMAGE build argument),
and pip installs from a wheelhouse of this repository and its dependencies, served on loopback
(the PIP_FIND_LINKS and PIP_NO_INDEX build arguments). The daemon makes no bridge network: the
container shares the host's network and listens on 127.0.0.1 on free ports.

The container must run as a non-root user, turn healthy by its own HEALTHCHECK, take a message
from a client, stop on `docker stop` with exit status 0, and still hold the message when
started again on the same volume. Skipped where no engine can be had (CI fails instead).
"""
from __future__ import annotations

import functools
import http.server
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from bench.processes import free_ports
from sluice.client import ClientConfig, Message, SyncProducer
from tests.cluster.test_compose_file import _read_back, build_context
from tests.cluster.test_compose_single import PORT_FLAGS

BASE_IMAGE = "sluice-test-python:bookworm"
IMAGE = "sluice:engine-test"
WAIT_S = 180.0
"""Guards against hanging only (the health check runs every 10 s)."""


def _missing(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (.ci/run installs docker.io and mmdebstrap)")
    pytest.skip(reason)


@dataclass
class Engine:
    env: dict[str, str]

    def docker(self, *arguments: str, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess:
        done = subprocess.run(["docker", *arguments], env=self.env, capture_output=True, text=True, timeout=timeout)
        if check:
            assert done.returncode == 0, f"docker {' '.join(arguments)}: {done.stderr[-3000:]}"
        return done


def _serve(directory: Path) -> tuple[http.server.ThreadingHTTPServer, int]:
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, server.server_address[1]


@pytest.fixture(scope="module")
def engine(tmp_path_factory) -> Iterator[Engine]:
    if shutil.which("dockerd") is None or shutil.which("docker") is None:
        _missing("no Docker daemon here (apt-get install docker.io)")
    if shutil.which("mmdebstrap") is None:
        _missing("no mmdebstrap to make the base image (apt-get install mmdebstrap)")
    if os.geteuid() != 0:
        pytest.skip("starting Docker's daemon needs root")
    work = tmp_path_factory.mktemp("engine")
    socket = work / "docker.sock"
    env = {**os.environ, "DOCKER_HOST": f"unix://{socket}"}
    log = (work / "dockerd.log").open("wb")
    daemon = subprocess.Popen(
        ["dockerd", "--data-root", str(work / "root"), "--exec-root", str(work / "exec"),
         "--pidfile", str(work / "dockerd.pid"), "-H", f"unix://{socket}", "--bridge=none",
         "--iptables=false", "--ip6tables=false", "--ip-forward=false", "--ip-masq=false"],
        stdout=log, stderr=log, start_new_session=True)
    found = Engine(env)
    server = None
    try:
        deadline = time.monotonic() + WAIT_S
        while found.docker("version", check=False, timeout=30).returncode != 0:
            assert daemon.poll() is None and time.monotonic() < deadline, \
                (work / "dockerd.log").read_text()[-3000:]
            time.sleep(0.5)
        rootfs = work / "base.tar"
        done = subprocess.run(["mmdebstrap", "--variant=minbase", "--include=python3,python3-venv",
                               "bookworm", str(rootfs)], capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stderr[-3000:]
        with rootfs.open("rb") as tar:
            imported = subprocess.run(["docker", "import", "-", BASE_IMAGE], stdin=tar, env=env,
                                      capture_output=True, text=True, timeout=600)
        assert imported.returncode == 0, imported.stderr
        context = build_context(work / "context")  # pip's build leaves nothing in the repository
        wheels = work / "wheels"
        done = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", str(context), "-w", str(wheels)],
                              capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stderr[-3000:]
        server, port = _serve(wheels)
        found.docker("build", "--network", "host", "-f", str(context / "docker" / "Dockerfile"), "-t", IMAGE,
                     "--build-arg", f"PYTHON_IMAGE={BASE_IMAGE}",
                     "--build-arg", f"PIP_FIND_LINKS=http://127.0.0.1:{port}/",
                     "--build-arg", "PIP_NO_INDEX=1", str(context), timeout=1200)
        yield found
    finally:
        if server is not None:
            server.shutdown()
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(60)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()
        log.close()
        _unmount_under(work)


def _unmount_under(folder: Path) -> None:
    """Unmount what the daemon left mounted under ``folder`` (its default network namespace),
    so the test's directory can be deleted."""
    with open("/proc/self/mounts") as mounts:
        points = [line.split()[1] for line in mounts]
    for point in sorted((p for p in points if p.startswith(str(folder) + "/")), reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True, timeout=30)


def _state(engine: Engine, name: str) -> dict:
    return json.loads(engine.docker("inspect", "--format", "{{json .State}}", name).stdout)


def _wait_healthy(engine: Engine, name: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while (state := _state(engine, name)).get("Health", {}).get("Status") != "healthy":
        assert state["Running"] and time.monotonic() < deadline, \
            f"{state}\n{engine.docker('logs', name, check=False).stderr[-3000:]}"
        time.sleep(1)


def test_the_image_runs_healthy_as_non_root_and_keeps_a_message_across_docker_stop(engine):
    name, volume = f"sluice-{uuid.uuid4().hex[:8]}", f"sluice-data-{uuid.uuid4().hex[:8]}"
    ports = dict(zip(PORT_FLAGS, free_ports(len(PORT_FLAGS))))
    flags = [word for key, flag in PORT_FLAGS.items() for word in (flag, str(ports[key]))]
    engine.docker("run", "-d", "--name", name, "--network", "host", "-v", f"{volume}:/var/lib/sluice",
                  "-e", f"SLUICE_ADMIN_URL=http://127.0.0.1:{ports['admin.port']}",
                  IMAGE, "serve", "--host", "127.0.0.1", *flags)
    try:
        _wait_healthy(engine, name)
        assert engine.docker("exec", name, "id", "-u").stdout.strip() != "0", "the broker runs as non-root"
        config = ClientConfig(f"127.0.0.1:{ports['native.port']}", "sluice", "sluice", request_timeout=10)
        with SyncProducer(config) as producer:
            producer.send(Message("engine-durable", b"stored before docker stop"))
        engine.docker("stop", "-t", "30", name, timeout=120)
        state = _state(engine, name)
        assert not state["Running"] and state["ExitCode"] == 0, \
            f"{state}\n{engine.docker('logs', name, check=False).stderr[-3000:]}"
        engine.docker("start", name)
        _wait_healthy(engine, name)
        _read_back(config, "engine-durable", b"stored before docker stop")
    finally:
        engine.docker("rm", "-f", name, check=False)
        engine.docker("volume", "rm", volume, check=False)
