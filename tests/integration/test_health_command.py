"""`sluice health`, the container images' health check, against real brokers: exit 0 when
/health says ok; 1, saying why, when the broker is degraded, unreachable or its certificate is
not trusted. Over HTTPS it trusts --ca, else on loopback the broker's own certificate named by
SLUICE_TLS_CERT, and asks an http URL over HTTPS when that certificate is configured."""
from __future__ import annotations

import subprocess

import pytest

from bench.processes import free_ports
from sluice.cli.dev_cert import DevCerts, write_dev_certs
from tests.conftest import CONFIG, SLUICE, clean_env

WAIT_S = 60


def health(*flags: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*SLUICE, "health", *flags], capture_output=True, text=True,
                          env=clean_env() | (env or {}), timeout=WAIT_S)


def https(admin: str) -> str:
    assert admin.startswith("https://"), admin
    return admin


@pytest.fixture
def certs(tmp_path) -> DevCerts:
    return write_dev_certs(tmp_path / "certs")


@pytest.fixture
def tls_server(sluice_server, tmp_path, certs):
    server = sluice_server(tmp_path / "data", "--tls-cert", certs.cert, "--tls-key", certs.key,
                           "--mqtt-tls-port", "0", "--mqtt-wss-port", "0")
    server.wait_ready()
    return server


def test_ok_exits_0_and_a_stopped_broker_exits_1_saying_it_is_unreachable(sluice_server, tmp_path):
    server = sluice_server(tmp_path / "data")
    server.wait_ready()
    done = health(env={"SLUICE_ADMIN_URL": server.admin})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"{server.admin}/health: ok"
    server.kill()
    done = health("--admin", server.admin)
    assert done.returncode == 1
    assert "unhealthy" in done.stderr and "unreachable" in done.stderr and "sluice serve" in done.stderr


def test_a_degraded_broker_exits_1_saying_what_is_wrong(sluice_server, tmp_path):
    # a high watermark far below any process's memory: the memory alarm is on from the start
    server = sluice_server(tmp_path / "data", config=CONFIG + "[core]\nmemory_high_watermark = 0.000001\n")
    server.wait_ready()
    done = health("--admin", server.admin)
    assert done.returncode == 1, done.stdout
    assert "degraded" in done.stderr and "memory" in done.stderr and "alarm" in done.stderr


def test_nothing_listening_exits_1():
    [port] = free_ports(1)
    done = health("--admin", f"http://127.0.0.1:{port}")
    assert done.returncode == 1 and "unreachable" in done.stderr


def test_https_is_verified_against_the_ca_given(tls_server, certs, tmp_path):
    admin = https(tls_server.admin)
    assert health("--admin", admin, "--ca", certs.ca).returncode == 0
    assert health("--admin", admin, env={"SLUICE_CA": certs.ca}).returncode == 0
    done = health("--admin", admin)  # the system's CAs do not know the development CA
    assert done.returncode == 1 and "not trusted" in done.stderr and "--ca" in done.stderr
    other = write_dev_certs(tmp_path / "other")
    done = health("--admin", admin, "--ca", other.ca)
    assert done.returncode == 1 and "not trusted" in done.stderr


def test_beside_the_broker_its_own_certificate_is_trusted_and_http_is_asked_over_https(tls_server, certs):
    admin = https(tls_server.admin)
    beside = {"SLUICE_TLS_CERT": certs.cert, "SLUICE_TLS_KEY": certs.key}
    done = health("--admin", admin, env=beside)
    assert done.returncode == 0, done.stderr
    plain = "http://" + admin.removeprefix("https://")  # the image's SLUICE_ADMIN_URL is http
    done = health(env=beside | {"SLUICE_ADMIN_URL": plain})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"{admin}/health: ok"
    done = health("--admin", plain)  # without the certificate's setting: plain HTTP to an HTTPS port
    assert done.returncode == 1 and "unhealthy" in done.stderr


def test_only_the_configured_certificate_is_trusted(tls_server, tmp_path):
    other = write_dev_certs(tmp_path / "other")  # same names, another key: not this broker's
    done = health("--admin", https(tls_server.admin), env={"SLUICE_TLS_CERT": other.cert,
                                                           "SLUICE_TLS_KEY": other.key})
    assert done.returncode == 1 and "not trusted" in done.stderr


def test_an_unreadable_ca_file_says_so(tls_server, tmp_path):
    done = health("--admin", https(tls_server.admin), "--ca", str(tmp_path / "missing.pem"))
    assert done.returncode == 1 and "missing.pem" in done.stderr and "cannot read" in done.stderr
