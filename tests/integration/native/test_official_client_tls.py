"""The official RocketMQ 5 Python client over TLS against `sluice serve` with a certificate.

The client makes its secure channel with ``grpc.ssl_channel_credentials()`` and grpc's default
roots, so it trusts a private CA through grpc's ``GRPC_DEFAULT_SSL_ROOTS_FILE_PATH``, read when
grpc starts: each client runs in a child process with that variable set."""
from __future__ import annotations

import subprocess
import sys

from sluice.cli.dev_cert import write_dev_certs
from tests.conftest import ROOT, clean_env

PRODUCER = """
import sys
from rocketmq import ClientConfiguration, Credentials, Message, Producer
endpoint, topic = sys.argv[1:3]
config = ClientConfiguration(endpoint, Credentials("sluice", "sluice"), request_timeout=10)
producer = Producer(config, (topic,), tls_enable=True)
producer.startup()
message = Message()
message.topic = topic
message.body = b"over tls"
print(producer.send(message).message_id, flush=True)
producer.shutdown()
"""


def run_producer(endpoint: str, topic: str, ca: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", PRODUCER, endpoint, topic], cwd=ROOT,
                          env={**clean_env(), "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH": ca},
                          capture_output=True, text=True, timeout=120)


def test_the_official_client_sends_over_tls_trusting_the_ca(sluice_server, tmp_path):
    certs = write_dev_certs(tmp_path / "certs")
    server = sluice_server(tmp_path / "data", "--tls-cert", certs.cert, "--tls-key", certs.key)
    server.wait_ready()
    created = subprocess.run([sys.executable, "-m", "sluice.cli", "topic", "create", "secure",
                              "--admin", server.admin, "--ca", certs.ca], cwd=ROOT,
                             env=clean_env(), capture_output=True, text=True, timeout=60)
    assert created.returncode == 0, created.stderr
    sent = run_producer(server.native, "secure", certs.ca)
    assert sent.returncode == 0 and sent.stdout.strip(), sent.stderr[-3000:]
    other = write_dev_certs(tmp_path / "other")  # a CA the broker's certificate is not from
    refused = run_producer(server.native, "secure", other.ca)
    assert refused.returncode != 0
