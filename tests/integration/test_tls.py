"""TLS on every listener of a real `sluice serve`, with certificates made by `sluice dev-cert`'s
own code: each listener with a valid certificate (clients verifying against the CA work), with
an expired one (clients refuse it with a certificate error; the broker serves on), client
certificates logging in as their CN user (MQTT, AMQP EXTERNAL), native mixed mode both ways,
and SIGHUP reloading the certificate while open connections go on."""
from __future__ import annotations

import asyncio
import datetime
import queue
import re
import signal
import socket
import ssl
import subprocess
import urllib.error
import urllib.request

import paho.mqtt.client as mqtt
import pika
import pytest
from cryptography import x509
from paho.mqtt.enums import CallbackAPIVersion

from sluice.cli.dev_cert import DevCerts, write_dev_certs
from sluice.client import ClientConfig, Message, Producer, UnavailableError
from tests.conftest import SLUICE, clean_env

WAIT = 20


def endpoint(server, what: str) -> tuple[str, int]:
    """(host, port) of the endpoint line ``what`` printed by `sluice serve`."""
    found = re.search(rf"^  {what}\s+(?:\w+://)?([\d.]+):(\d+)", "".join(server.output), re.M)
    assert found, f"no {what} endpoint in {''.join(server.output)}"
    return found.group(1), int(found.group(2))


def serve_tls(sluice_server, tmp_path, certs: DevCerts, *extra: str, name: str = "data"):
    server = sluice_server(tmp_path / name, "--mqtt-tls-port", "0", "--mqtt-wss-port", "0",
                           "--tls-cert", certs.cert, "--tls-key", certs.key, *extra)
    server.wait_ready()
    return server


def cli(server, *args: str, ca: str | None = None) -> subprocess.CompletedProcess:
    flags = ["--admin", server.admin] + (["--ca", ca] if ca else [])
    return subprocess.run([*SLUICE, *args, *flags], capture_output=True, text=True,
                          env=clean_env(), timeout=60)


class Paho:
    """A paho client over TLS; ``code`` is its CONNACK's (None when the server ended the
    connection before one: with TLS 1.3 a refused client certificate shows only then)."""

    def __init__(self, host: str, port: int, ca: str, *, user: str | None = "sluice",
                 cert: tuple[str, str] | None = None, transport: str = "tcp") -> None:
        self.messages: queue.Queue = queue.Queue()
        self.events: queue.Queue = queue.Queue()
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, transport=transport)
        if user is not None:
            self.client.username_pw_set(user, "sluice")
        if transport == "websockets":
            self.client.ws_set_options(path="/mqtt")
        self.client.tls_set(ca_certs=ca, certfile=cert and cert[0], keyfile=cert and cert[1])
        self.client.on_connect = lambda _c, _u, _f, code, _p: self.events.put(code.value)
        self.client.on_subscribe = lambda _c, _u, _m, codes, _p: self.events.put(codes[0].value)
        self.client.on_message = lambda _c, _u, message: self.messages.put(message.payload)
        self.client.on_disconnect = lambda *_: self.events.put(None)
        self.client.connect(host, port)
        self.client.loop_start()
        self.code = self.events.get(timeout=WAIT)

    def subscribe(self, topic: str) -> int:
        self.client.subscribe(topic, 1)
        return self.events.get(timeout=WAIT)

    def stop(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def amqp_parameters(server, ca: str, credentials, cert: tuple[str, str] | None = None):
    context = ssl.create_default_context(cafile=ca)
    if cert is not None:
        context.load_cert_chain(*cert)
    host, port = endpoint(server, "AMQP TLS")
    return pika.ConnectionParameters(host, port, "/", credentials,
                                     ssl_options=pika.SSLOptions(context, host),
                                     connection_attempts=1, socket_timeout=WAIT)


async def send_native(address: str, topic: str, body: bytes, ca: str | None) -> None:
    config = ClientConfig(address, "sluice", "sluice", ca_file=ca, reconnect_timeout=5)
    async with Producer(config) as producer:
        await producer.send(Message(topic, body))


def peer_serial(host: str, port: int, ca: str, alpn: list[str] | None = None) -> int:
    """The serial number of the certificate a new TLS connection to ``host:port`` is served."""
    context = ssl.create_default_context(cafile=ca)
    if alpn:
        context.set_alpn_protocols(alpn)
    with socket.create_connection((host, port), timeout=WAIT) as raw, \
            context.wrap_socket(raw, server_hostname=host) as tls:
        return x509.load_der_x509_certificate(tls.getpeercert(binary_form=True)).serial_number


@pytest.fixture
def certs(tmp_path) -> DevCerts:
    return write_dev_certs(tmp_path / "certs", client="alice")


def test_every_listener_serves_the_certificate_to_clients_that_trust_the_ca(sluice_server,
                                                                             tmp_path, certs):
    server = serve_tls(sluice_server, tmp_path, certs)
    assert cli(server, "topic", "create", "tls-topic", ca=certs.ca).returncode == 0
    host, port = endpoint(server, "MQTT TLS")
    subscriber = Paho(host, port, certs.ca)
    assert subscriber.code == 0 and subscriber.subscribe("tls-topic/#") == 1
    publisher = Paho(*endpoint(server, "MQTT WSS"), certs.ca, transport="websockets")
    assert publisher.code == 0
    publisher.client.publish("tls-topic/a", b"over wss", 1).wait_for_publish(WAIT)
    assert subscriber.messages.get(timeout=WAIT) == b"over wss"
    asyncio.run(send_native(server.native, "tls-topic", b"over grpc tls", certs.ca))
    assert subscriber.messages.get(timeout=WAIT) == b"over grpc tls"
    connection = pika.BlockingConnection(amqp_parameters(server, certs.ca,
                                                         pika.PlainCredentials("sluice", "sluice")))
    channel = connection.channel()
    channel.basic_publish("amq.topic", "tls-topic.b", b"over amqps")
    assert subscriber.messages.get(timeout=WAIT) == b"over amqps"
    connection.close()
    assert server.admin.startswith("https://")
    health = urllib.request.urlopen(server.admin + "/health", timeout=WAIT,
                                    context=ssl.create_default_context(cafile=certs.ca))
    assert health.status == 200
    listed = cli(server, "topic", "list", ca=certs.ca)
    assert "tls-topic" in listed.stdout, listed.stderr
    untrusted = cli(server, "topic", "list")
    assert untrusted.returncode != 0 and "--ca" in untrusted.stderr
    for client in (subscriber, publisher):
        client.stop()


def test_an_expired_certificate_is_refused_by_every_client_and_the_broker_serves_on(
        sluice_server, tmp_path):
    long_ago = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(days=30)
    certs = write_dev_certs(tmp_path / "old", days=1, not_before=long_ago)
    server = serve_tls(sluice_server, tmp_path, certs)
    assert "outside its validity period" in server.log()
    with pytest.raises(ssl.SSLCertVerificationError, match="expired"):
        Paho(*endpoint(server, "MQTT TLS"), certs.ca)
    with pytest.raises(ssl.SSLCertVerificationError, match="expired"):
        Paho(*endpoint(server, "MQTT WSS"), certs.ca, transport="websockets")
    with pytest.raises(ssl.SSLCertVerificationError, match="expired"):
        pika.BlockingConnection(amqp_parameters(server, certs.ca,
                                                pika.PlainCredentials("sluice", "sluice")))
    with pytest.raises(urllib.error.URLError, match="expired"):
        urllib.request.urlopen(server.admin + "/health", timeout=WAIT,
                               context=ssl.create_default_context(cafile=certs.ca))
    with pytest.raises(UnavailableError):
        asyncio.run(send_native(server.native, "expired", b"x", certs.ca))
    host, port = endpoint(server, "MQTT TCP")  # the plaintext listener serves on
    plain = mqtt.Client(CallbackAPIVersion.VERSION2)
    plain.username_pw_set("sluice", "sluice")
    assert plain.connect(host, port) == 0
    plain.disconnect()
    assert server.process.poll() is None


def _alice(server, certs: DevCerts) -> None:
    for args in (("user", "create", "alice", "--new-password", "alice-secret"),
                 ("user", "grant", "alice", "topic", "alice", "publish", "subscribe")):
        done = cli(server, *args, ca=certs.ca)
        assert done.returncode == 0, done.stderr


def test_an_mqtt_client_certificate_logs_in_as_its_cn_user_with_that_users_rights(
        sluice_server, tmp_path, certs):
    server = serve_tls(sluice_server, tmp_path, certs, "--tls-client-ca", certs.ca,
                       "--tls-client-certs", "optional")
    _alice(server, certs)
    host, port = endpoint(server, "MQTT TLS")
    alice = Paho(host, port, certs.ca, user=None, cert=(certs.client_cert, certs.client_key))
    assert alice.code == 0
    assert alice.subscribe("alice/#") == 1
    assert alice.subscribe("secret/#") == 0x80  # her ACL applies, not the admin's
    alice.stop()
    password_user = Paho(host, port, certs.ca)  # optional: a password still logs in
    assert password_user.code == 0
    password_user.stop()
    other = write_dev_certs(tmp_path / "bob", client="bob")  # another CA: not verified
    assert tls_refused(lambda: Paho(host, port, certs.ca, user=None,
                                    cert=(other.client_cert, other.client_key)))
    unknown = write_dev_certs(tmp_path / "ghost", client="ghost")
    ghost = _same_ca_client(certs, unknown, tmp_path)
    refused = Paho(host, port, certs.ca, user=None, cert=ghost)
    assert refused.code in (0x86, 0x87)  # bad user name or password / not authorized
    assert "ghost" in server.log()


def tls_refused(connect) -> bool:
    """Whether the server refuses the TLS connection ``connect()`` opens: an error in the
    handshake (TLS 1.2) or the connection ended before any CONNACK (TLS 1.3)."""
    try:
        client = connect()
    except (ssl.SSLError, ConnectionError):
        return True
    client.client.loop_stop()
    return client.code is None


def _same_ca_client(certs: DevCerts, template: DevCerts, tmp_path) -> tuple[str, str]:
    """A client certificate for ``template``'s CN signed by ``certs``' CA."""
    from cryptography.hazmat.primitives import hashes, serialization

    ca_key = serialization.load_pem_private_key(open(certs.ca_key, "rb").read(), None)
    ca = x509.load_pem_x509_certificate(open(certs.ca, "rb").read())
    original = x509.load_pem_x509_certificate(open(template.client_cert, "rb").read())
    key = serialization.load_pem_private_key(open(template.client_key, "rb").read(), None)
    cert = (x509.CertificateBuilder().subject_name(original.subject).issuer_name(ca.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(original.not_valid_before_utc)
            .not_valid_after(original.not_valid_after_utc).sign(ca_key, hashes.SHA256()))
    path = tmp_path / "same-ca-client.pem"
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return str(path), template.client_key


def test_required_client_certificates_refuse_a_client_without_one(sluice_server, tmp_path,
                                                                   certs):
    server = serve_tls(sluice_server, tmp_path, certs, "--tls-client-ca", certs.ca,
                       "--tls-client-certs", "required")
    host, port = endpoint(server, "MQTT TLS")
    assert tls_refused(lambda: Paho(host, port, certs.ca))
    with_certificate = Paho(host, port, certs.ca, cert=(certs.client_cert, certs.client_key))
    assert with_certificate.code != 0  # admitted; alice does not exist, so not logged in
    with_certificate.stop()


def test_amqp_external_logs_in_as_the_certificate_user_and_an_unknown_one_is_refused(
        sluice_server, tmp_path, certs):
    server = serve_tls(sluice_server, tmp_path, certs, "--tls-client-ca", certs.ca,
                       "--tls-client-certs", "optional")
    _alice(server, certs)
    permitted = cli(server, "vhost", "permit", "alice", "/", "--configure", "^$", "--write",
                    "amq\\.topic", "--read", "^$", ca=certs.ca)
    assert permitted.returncode == 0, permitted.stderr
    connection = pika.BlockingConnection(amqp_parameters(
        server, certs.ca, pika.credentials.ExternalCredentials(),
        (certs.client_cert, certs.client_key)))
    channel = connection.channel()
    channel.confirm_delivery()
    channel.basic_publish("amq.topic", "alice.x", b"by certificate")
    connection.close()
    ghost = _same_ca_client(certs, write_dev_certs(tmp_path / "ghost", client="ghost"), tmp_path)
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        pika.BlockingConnection(amqp_parameters(server, certs.ca,
                                                pika.credentials.ExternalCredentials(), ghost))
    with pytest.raises(pika.exceptions.AMQPConnectionError):  # EXTERNAL needs a certificate
        pika.BlockingConnection(amqp_parameters(server, certs.ca,
                                                pika.credentials.ExternalCredentials()))


def test_native_mixed_mode_serves_tls_and_plaintext_on_one_port(sluice_server, tmp_path,
                                                                 certs):
    server = serve_tls(sluice_server, tmp_path, certs, "--native-tls", "mixed")
    assert "(TLS and plaintext)" in "".join(server.output)
    assert cli(server, "topic", "create", "mixed", ca=certs.ca).returncode == 0
    asyncio.run(send_native(server.native, "mixed", b"tls", certs.ca))
    asyncio.run(send_native(server.native, "mixed", b"plain", None))
    host, port = server.native.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=WAIT) as garbage:
        garbage.sendall(b"GET / HTTP/1.1\r\n\r\n")
        assert garbage.recv(100) == b""  # closed
    asyncio.run(send_native(server.native, "mixed", b"after garbage", None))  # serves on


def test_sighup_serves_the_new_certificate_to_new_connections_and_keeps_open_ones(
        sluice_server, tmp_path, certs):
    server = serve_tls(sluice_server, tmp_path, certs)
    host, port = endpoint(server, "MQTT TLS")
    native_host, native_port = server.native.rsplit(":", 1)
    old = x509.load_pem_x509_certificate(open(certs.cert, "rb").read()).serial_number
    assert peer_serial(host, port, certs.ca) == old
    before = Paho(host, port, certs.ca)
    assert before.subscribe("reload/#") == 1
    write_dev_certs(tmp_path / "certs", overwrite=True)  # a new CA and server certificate
    new = x509.load_pem_x509_certificate(open(certs.cert, "rb").read()).serial_number
    server.process.send_signal(signal.SIGHUP)
    for line in server.follow_log():
        if "reloaded the TLS certificate" in line:
            break
    assert peer_serial(host, port, certs.ca) == new
    assert peer_serial(*endpoint(server, "AMQP TLS"), certs.ca) == new
    assert peer_serial(*endpoint(server, "admin API"), certs.ca) == new
    assert peer_serial(native_host, int(native_port), certs.ca, ["h2"]) == new
    after = Paho(host, port, certs.ca)  # trusts only the new CA
    after.client.publish("reload/x", b"still here", 1).wait_for_publish(WAIT)
    assert before.messages.get(timeout=WAIT) == b"still here"  # opened before, goes on
    with open(certs.cert, "w") as broken:
        broken.write("not a certificate\n")
    server.process.send_signal(signal.SIGHUP)
    for line in server.follow_log():
        if "were not reloaded" in line:
            break
    assert peer_serial(host, port, certs.ca) == new  # the old one stays
    for client in (before, after):
        client.stop()


def logged(server, text: str, times: int = 1) -> None:
    """Wait until the broker has logged a line containing ``text`` ``times`` times."""
    for line in server.follow_log():
        times -= text in line
        if times == 0:
            return
    raise AssertionError(f"the broker ended without logging {text!r}")


def test_sighup_reloads_the_client_ca_for_new_handshakes_and_keeps_open_connections(
        sluice_server, tmp_path, certs):
    bob_certs = write_dev_certs(tmp_path / "bob", client="bob")  # another CA
    client_ca = tmp_path / "client-ca.pem"
    client_ca.write_bytes(open(certs.ca, "rb").read())
    server = serve_tls(sluice_server, tmp_path, certs, "--tls-client-ca", str(client_ca),
                       "--tls-client-certs", "optional")
    _alice(server, certs)
    assert cli(server, "user", "create", "bob", "--new-password", "bob-secret",
               ca=certs.ca).returncode == 0
    host, port = endpoint(server, "MQTT TLS")
    alice_cert, bob_cert = (certs.client_cert, certs.client_key), \
        (bob_certs.client_cert, bob_certs.client_key)
    plain = pika.PlainCredentials("sluice", "sluice")
    before = Paho(host, port, certs.ca, user=None, cert=alice_cert)
    assert before.code == 0 and before.subscribe("alice/#") == 1
    assert tls_refused(lambda: Paho(host, port, certs.ca, user=None, cert=bob_cert))
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        pika.BlockingConnection(amqp_parameters(server, certs.ca, plain, bob_cert))
    client_ca.write_bytes(open(bob_certs.ca, "rb").read())  # trusts bob's CA, no longer alice's
    server.process.send_signal(signal.SIGHUP)
    logged(server, "reloaded the TLS certificate")
    bob = Paho(host, port, certs.ca, user=None, cert=bob_cert)
    assert bob.code == 0  # verified, logged in as bob
    pika.BlockingConnection(amqp_parameters(server, certs.ca, plain, bob_cert)).close()
    assert tls_refused(lambda: Paho(host, port, certs.ca, user=None, cert=alice_cert))
    publisher = Paho(host, port, certs.ca)
    publisher.client.publish("alice/x", b"still here", 1).wait_for_publish(WAIT)
    assert before.messages.get(timeout=WAIT) == b"still here"  # opened before, goes on
    client_ca.write_text("not a certificate\n")
    server.process.send_signal(signal.SIGHUP)
    logged(server, "were not reloaded")
    assert "client-ca.pem" in server.log()
    again = Paho(host, port, certs.ca, user=None, cert=bob_cert)
    assert again.code == 0  # the CA loaded before stays
    for client in (before, bob, publisher, again):
        client.stop()


def test_the_dev_cert_walkthrough_works_with_mosquitto_pub_and_curl(sluice_server, tmp_path,
                                                                     certs):
    server = serve_tls(sluice_server, tmp_path, certs, "--tls-client-ca", certs.ca,
                       "--tls-client-certs", "optional")
    _alice(server, certs)
    host, port = endpoint(server, "MQTT TLS")
    watcher = Paho(host, port, certs.ca)
    assert watcher.subscribe("alice/#") == 1
    common = ["mosquitto_pub", "--cafile", certs.ca, "-h", host, "-p", str(port), "-q", "1"]
    by_password = subprocess.run([*common, "-u", "sluice", "-P", "sluice", "-t", "alice/a",
                                  "-m", "by password"], capture_output=True, text=True, timeout=60)
    assert by_password.returncode == 0, by_password.stderr
    assert watcher.messages.get(timeout=WAIT) == b"by password"
    by_certificate = subprocess.run([*common, "--cert", certs.client_cert, "--key",
                                     certs.client_key, "-t", "alice/b", "-m", "by certificate"],
                                    capture_output=True, text=True, timeout=60)
    assert by_certificate.returncode == 0, by_certificate.stderr
    assert watcher.messages.get(timeout=WAIT) == b"by certificate"
    watcher.stop()
    health = subprocess.run(["curl", "-sf", "--cacert", certs.ca, server.admin + "/health"],
                            capture_output=True, text=True, timeout=60)
    assert health.returncode == 0 and '"status": "ok"' in health.stdout
    untrusted = subprocess.run(["curl", "-sf", server.admin + "/health"], capture_output=True,
                               timeout=60)
    assert untrusted.returncode == 60  # curl: peer certificate cannot be authenticated
