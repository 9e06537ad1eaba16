"""AMQP over TLS against a real `sluice serve`: the listener on ``amqp.tls_port`` serves the
certificate of ``--tls-cert`` / ``--tls-key`` (MQTT's TLS settings) to pika."""
from __future__ import annotations

import re
import ssl

import pika
import pytest

WAIT_S = 10


def tls_address(server) -> tuple[str, int]:
    host, port = re.search(r"AMQP TLS\s+(\S+)", "".join(server.output)).group(1).rsplit(":", 1)
    return host, int(port)


def tls_parameters(server, ca_file: str) -> pika.ConnectionParameters:
    context = ssl.create_default_context(cafile=ca_file)
    host, port = tls_address(server)
    return pika.ConnectionParameters(host, port, "/", pika.PlainCredentials("guest", "guest"),
                                     ssl_options=pika.SSLOptions(context, host),
                                     connection_attempts=1, socket_timeout=WAIT_S)


def test_pika_publishes_and_consumes_over_tls(sluice_server, tmp_path, cert_files):
    server = sluice_server(tmp_path / "data", "--tls-cert", cert_files.cert,
                           "--tls-key", cert_files.key)
    server.wait_ready()
    connection = pika.BlockingConnection(tls_parameters(server, cert_files.cert))
    channel = connection.channel()
    channel.confirm_delivery()
    channel.queue_declare("over-tls")
    channel.basic_publish("", "over-tls", b"secret", pika.BasicProperties(delivery_mode=2))
    method, _, body = channel.basic_get("over-tls", auto_ack=True)
    assert body == b"secret" and method.routing_key == "over-tls"
    connection.close()


def test_a_client_that_does_not_trust_the_certificate_is_refused(sluice_server, tmp_path,
                                                                 make_cert_files):
    served, other = make_cert_files("served"), make_cert_files("other")
    server = sluice_server(tmp_path / "data", "--tls-cert", served.cert, "--tls-key", served.key)
    server.wait_ready()
    with pytest.raises(ssl.SSLCertVerificationError):  # pika raises the handshake's error
        pika.BlockingConnection(tls_parameters(server, other.cert))
    good = pika.BlockingConnection(tls_parameters(server, served.cert))  # the listener goes on
    assert good.is_open
    good.close()


def test_without_a_certificate_there_is_no_tls_listener(amqp_server):
    assert "AMQP TLS" not in "".join(amqp_server.output)
