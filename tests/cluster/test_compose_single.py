"""docker/compose.yaml (one node, every port), docker/compose.spark.yaml (a broker and the Spark
job beside it) and docker/Dockerfile.analytics, checked and then run as real processes.

The files are parsed and held to what the images promise (every port published, the data on a
named volume, the image's own health check, the analytics image with the `analytics` extra and
a Java runtime, the job reading the broker's volume read-only). Then each service's command runs
as a container would run it, outside a container: the image's ENTRYPOINT and ENV under the
service's environment and command, the container on 127.0.0.1, every container port moved to a
free one and every volume to a directory of the test. The broker must start, answer the
HEALTHCHECK's command (over HTTPS, trusting the broker's own certificate, once the compose file
names one) and fail it once stopped, open its TLS listeners with that certificate, stop
on SIGTERM (what `docker stop` sends) with status 0 within the stop grace period, and still have
the confirmed message after a restart on the same volume; the Spark service's job must turn
readings stored by such a broker into window aggregates.
"""
from __future__ import annotations

import json
import os
import queue
import re
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from bench.processes import free_ports
from sluice.cli.dev_cert import write_dev_certs
from sluice.client import ClientConfig, Message, SyncProducer
from sluice.server.app import READY_LINE
from sluice.server.config import load_config, unknown_variables
from tests.cluster.test_compose_file import (ROOT, MissingVariable, _read_back, as_run_here, base_image,
                                             exec_form, healthcheck, image_env, image_volume, instruction,
                                             interpolate)

SINGLE = ROOT / "docker" / "compose.yaml"
SPARK = ROOT / "docker" / "compose.spark.yaml"
DOCKERFILE = ROOT / "docker" / "Dockerfile"
ANALYTICS = ROOT / "docker" / "Dockerfile.analytics"
PORT_FLAGS = {"native.port": "--native-port", "admin.port": "--admin-port", "mqtt.port": "--mqtt-port",
              "mqtt.ws_port": "--mqtt-ws-port", "mqtt.tls_port": "--mqtt-tls-port",
              "mqtt.wss_port": "--mqtt-wss-port", "amqp.port": "--amqp-port", "amqp.tls_port": "--amqp-tls-port"}
"""Every client port of a node and the flag that moves it."""
WAIT_S = 60.0
"""Guards against hanging only."""


def services(path: Path, env: dict[str, str] | None = None) -> dict:
    return interpolate(yaml.safe_load(path.read_text()), env or {})["services"]


def standard_ports() -> dict[str, int]:
    """Each client port's container port: the image's defaults."""
    config = load_config(env=image_env())
    return {key: getattr(getattr(config, key.split(".")[0]), key.split(".")[1]) for key in PORT_FLAGS}


def grace_s(service: dict) -> int:
    return int(service["stop_grace_period"].removesuffix("s"))


def mounts(service: dict) -> dict[str, tuple[str, bool]]:
    """Where each volume of ``service`` is mounted: target -> (source, read-only)."""
    found = {}
    for mount in service["volumes"]:
        source, target, *mode = mount.split(":")
        found[target] = (source, mode == ["ro"])
    return found


# -- the files ----------------------------------------------------------------------------------

def test_the_single_node_compose_file_publishes_every_port_and_keeps_the_data_on_a_named_volume():
    raw = yaml.safe_load(SINGLE.read_text())
    [(name, service)] = services(SINGLE).items()
    assert service["build"] == {"context": "..", "dockerfile": "docker/Dockerfile"}
    published = {}
    for mapping in service["ports"]:
        address, host, container = mapping.rsplit(":", 2)
        assert address == "127.0.0.1", "published on this host only unless PUBLISH_ADDRESS says otherwise"
        published[int(container)] = int(host)
    assert set(published) == set(standard_ports().values()), "MQTT, MQTT TLS, WS, WSS, AMQP, AMQP TLS, native, admin"
    source, read_only = mounts(service)[image_volume()]
    assert source in raw["volumes"] and not read_only, "the data directory on a named volume"
    assert service["healthcheck"]["test"] == ["CMD", *healthcheck()], "the image's own health check"
    env = {key: value for key, value in service["environment"].items()}
    assert not unknown_variables(env), unknown_variables(env)
    assert exec_form(instruction("ENTRYPOINT")[0]) == ["sluice"] and service["command"][0] == "serve"
    assert grace_s(service) > 10, "longer than Docker's default, for the checkpoint"
    opened = services(SINGLE, {"PUBLISH_ADDRESS": "0.0.0.0"})[name]
    assert all(mapping.startswith("0.0.0.0:") for mapping in opened["ports"])


def test_the_analytics_image_adds_spark_s_python_and_java_to_a_non_root_sluice():
    assert base_image(ANALYTICS) == base_image(DOCKERFILE)
    [apt] = [rest for rest in instruction("RUN", ANALYTICS) if "apt-get install" in rest]
    assert "openjdk-17-jre-headless" in apt, "Spark runs on Java 17 or later"
    [run] = [rest for rest in instruction("RUN", ANALYTICS) if "pip install" in rest]
    assert 'pip install --no-cache-dir ".[analytics]"' in run and "useradd" in run
    assert instruction("USER", ANALYTICS) == ["sluice"]
    env = image_env(ANALYTICS)
    assert env["PYSPARK_PYTHON"] == "/opt/sluice/bin/python" and env["PATH"].startswith("/opt/sluice/bin:")
    assert image_volume(ANALYTICS) == "/var/lib/sluice-analytics"
    assert exec_form(instruction("ENTRYPOINT", ANALYTICS)[0]) == ["sluice"]


def test_the_spark_job_reads_the_broker_s_volume_read_only_once_the_broker_is_healthy():
    raw = yaml.safe_load(SPARK.read_text())
    found = services(SPARK)
    broker, job = found["sluice"], found["spark"]
    assert job["build"]["dockerfile"] == "docker/Dockerfile.analytics"
    assert job["depends_on"] == {"sluice": {"condition": "service_healthy"}}
    data, _ = mounts(broker)[image_volume()]
    job_mounts = mounts(job)
    assert job_mounts[image_volume()] == (data, True), "the broker's data volume, read-only"
    assert job_mounts[image_volume(ANALYTICS)][0] in raw["volumes"]
    arguments = dict(word.removeprefix("--").split("=", 1) for word in job["command"][2:])
    assert job["command"][:2] == ["analytics", "telemetry"]
    assert arguments["data-dir"] == image_volume()
    assert all(arguments[key].startswith(image_volume(ANALYTICS) + "/") for key in ("output", "checkpoint"))
    assert broker["healthcheck"]["test"] == ["CMD", *healthcheck()]


def test_an_unset_tls_variable_leaves_the_tls_listeners_shut():
    [service] = services(SINGLE).values()
    config = load_config(env=image_env() | service["environment"])
    assert config.tls.cert is None and config.tls.key is None
    with pytest.raises(MissingVariable):
        interpolate({"x": "${SLUICE_CLUSTER_SECRET:?set it}"}, {})


# -- the services, run --------------------------------------------------------------------------

@dataclass
class Container:
    """A service's process with the container's view moved onto this machine."""

    command: list[str]
    env: dict[str, str]
    ports: dict[str, int]
    """Client port by config key, as moved."""
    log: Path

    def start(self) -> subprocess.Popen:
        lines: queue.Queue[str | None] = queue.Queue()
        log = self.log.open("ab")
        process = subprocess.Popen(self.command, env=self.env, cwd=self.env.get("SLUICE_DATA_DIR"),
                                   stdout=subprocess.PIPE, stderr=log, text=True)

        def pump() -> None:
            for line in process.stdout:
                lines.put(line)
            lines.put(None)
        threading.Thread(target=pump, daemon=True).start()
        deadline = time.monotonic() + WAIT_S
        while True:
            line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            assert line is not None, f"the broker exited ({process.wait()}):\n{self.log.read_text()[-3000:]}"
            if line.startswith(READY_LINE):
                return process


def container(service: dict, dockerfile: Path, volumes: dict[str, Path], log: Path) -> Container:
    """The service's command under the image's ENTRYPOINT, its environment over the image's, on
    127.0.0.1 and free ports, its volumes at ``volumes`` (by target)."""
    def moved(value: str) -> str:
        for target, path in volumes.items():
            if value == target or value.startswith(target + "/"):
                return str(path) + value[len(target):]
        return value
    standard = standard_ports()
    ports = dict(zip(PORT_FLAGS, free_ports(len(PORT_FLAGS))))
    env = {key: moved(value) for key, value in (image_env(dockerfile) | service.get("environment", {})).items()}
    if "SLUICE_ADMIN_URL" in env:  # the container's own admin port, as moved
        env["SLUICE_ADMIN_URL"] = env["SLUICE_ADMIN_URL"].replace(f":{standard['admin.port']}", f":{ports['admin.port']}")
    base = {key: value for key, value in os.environ.items() if not key.startswith("SLUICE_")}
    arguments = [moved(word.split("=", 1)[0]) + ("=" + moved(word.split("=", 1)[1]) if "=" in word else "")
                 for word in service["command"]]
    if arguments[0] == "serve":
        for index, word in enumerate(arguments[:-1]):
            if word == "--host":
                assert arguments[index + 1] == "0.0.0.0", "alone, the node listens on every address"
                arguments[index + 1] = "127.0.0.1"  # the container's every address, here
        for key, flag in PORT_FLAGS.items():
            assert flag not in arguments, f"the service sets {flag}: the test moves only the standard ports"
            arguments += [flag, str(ports[key])]
    assert exec_form(instruction("ENTRYPOINT", dockerfile)[0]) == ["sluice"]
    # the image's PATH leads to its venv; here the venv is this interpreter's
    return Container([sys.executable, "-m", "sluice.cli", *arguments],
                     base | {key: value for key, value in env.items() if key != "PATH"}, ports, log)


def _run_healthcheck(node: Container, dockerfile: Path = DOCKERFILE) -> subprocess.CompletedProcess:
    return subprocess.run(as_run_here(healthcheck(dockerfile)), env=node.env, capture_output=True, text=True,
                          timeout=30)


def _tls_handshake(port: int) -> str:
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
            context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
        return tls.version() or ""


def _stop(process: subprocess.Popen, grace: int, log: Path) -> None:
    """`docker stop`: SIGTERM, then the stop grace period before Docker would kill."""
    process.send_signal(signal.SIGTERM)
    try:
        code = process.wait(grace)
    except subprocess.TimeoutExpired:
        process.kill()
        raise AssertionError(f"the broker did not stop within {grace} s of SIGTERM") from None
    assert code == 0, f"the broker stopped with status {code}:\n{log.read_text()[-3000:]}"


def test_the_single_node_starts_answers_its_health_check_and_survives_a_docker_stop(tmp_path):
    tls_dir = tmp_path / "tls"  # docker/tls, mounted at /etc/sluice/tls
    tls_dir.mkdir()
    certs = write_dev_certs(tls_dir)  # `sluice dev-cert --dir docker/tls`: signed by its own CA
    shell = {"SLUICE_TLS_CERT": f"/etc/sluice/tls/{Path(certs.cert).name}",
             "SLUICE_TLS_KEY": f"/etc/sluice/tls/{Path(certs.key).name}"}
    [service] = services(SINGLE, shell).values()
    volume = tmp_path / "volumes" / mounts(service)[image_volume()][0]
    volume.mkdir(parents=True)  # the named volume, there before the container starts
    node = container(service, DOCKERFILE, {image_volume(): volume, "/etc/sluice/tls": tls_dir},
                     tmp_path / "sluice.log")
    process = node.start()
    try:
        assert node.env["SLUICE_ADMIN_URL"].startswith("http://"), "the image's URL, as it is"
        done = _run_healthcheck(node)  # no CA given: the broker's own certificate is trusted
        assert done.returncode == 0, f"HEALTHCHECK: {done.stderr}"
        assert f"https://127.0.0.1:{node.ports['admin.port']}/health: ok" in done.stdout
        for key in ("mqtt.tls_port", "mqtt.wss_port", "amqp.tls_port", "admin.port", "native.port"):
            assert _tls_handshake(node.ports[key]).startswith("TLS"), key
        config = ClientConfig(f"127.0.0.1:{node.ports['native.port']}", "sluice", "sluice", request_timeout=10,
                              ca_file=certs.ca)
        with SyncProducer(config) as producer:
            producer.send(Message("compose-durable", b"stored before docker stop"))
        _stop(process, grace_s(service), node.log)
        done = _run_healthcheck(node)
        assert done.returncode == 1 and "unhealthy" in done.stderr and "unreachable" in done.stderr, \
            f"the health check fails once the broker is gone: {done.returncode} {done.stderr}"
        process = node.start()  # docker start: the same volume
        _read_back(config, "compose-durable", b"stored before docker stop")
        _stop(process, grace_s(service), node.log)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_the_spark_service_s_job_aggregates_what_the_broker_beside_it_stored(tmp_path):
    pytest.importorskip("pyspark", reason="the analytics extra is not installed")
    found = services(SPARK)
    broker_service, job_service = found["sluice"], found["spark"]
    volumes = {name: tmp_path / "volumes" / name for name in yaml.safe_load(SPARK.read_text())["volumes"]}
    for path in volumes.values():
        path.mkdir(parents=True)
    data = volumes[mounts(broker_service)[image_volume()][0]]
    broker = container(broker_service, DOCKERFILE, {image_volume(): data}, tmp_path / "sluice.log")
    process = broker.start()
    try:
        assert _run_healthcheck(broker).returncode == 0  # depends_on: service_healthy
        config = ClientConfig(f"127.0.0.1:{broker.ports['native.port']}", "sluice", "sluice", request_timeout=10)
        start_ms = (int(time.time()) // 60 - 10) * 60_000  # ten minutes ago, on a minute
        with SyncProducer(config) as producer:
            for second in range(0, 240, 10):
                for device in ("d0", "d1"):
                    reading = {"device": device, "ts": start_ms + second * 1000, "temperature": 20.0 + second / 60,
                               "humidity": 50.0, "battery": 90.0}
                    producer.send(Message("devices", json.dumps(reading).encode()))
        _stop(process, grace_s(broker_service), broker.log)  # every entry written out, whatever the timing
        job_volumes = {target: volumes[source] for target, (source, _) in mounts(job_service).items()}
        job = container(job_service, ANALYTICS, job_volumes, tmp_path / "spark.log")
        output = Path(next(w.split("=", 1)[1] for w in job.command if w.startswith("--output=")))
        env = job.env | {"PYSPARK_PYTHON": sys.executable}  # the image's venv Python, here this one
        done = subprocess.run([*job.command, "--available-now"], env=env, cwd=tmp_path, capture_output=True,
                              text=True, timeout=600)
        assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
        parquet = list((output / "aggregates").glob("date=*/*.parquet"))
        assert parquet, f"no window aggregates written:\n{done.stdout[-3000:]}"
        assert re.search(r"telemetry job", done.stdout), done.stdout[-2000:]
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
