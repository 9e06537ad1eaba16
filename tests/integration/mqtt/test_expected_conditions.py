"""Expected conditions on the MQTT listeners log one line each, never a traceback: peers that
vanish mid-handshake or send garbage right behind their CONNECT (also when a persistent session
with queued messages resumes), refused logins, failed TLS handshakes, malformed HTTP requests
on the WebSocket port. Read from the stderr of
a real `sluice serve` after it stopped."""
from __future__ import annotations

import re
import socket
import ssl
import struct

import paho.mqtt.client as mqtt

from protocols.mqtt.codec import MQTT_5, MQTT_311, encode
from protocols.mqtt.packets import ConnAck, Connect, Disconnect, Subscribe, Subscription
from protocols.mqtt.properties import Properties
from tests.integration.mqtt.test_robustness import (PASSWORD, USER, PahoClient, RawClient,
                                                    assert_round_trip, host_port)

GARBAGE = b"\x00\x00\x00"
"""Reserved packet type 0: malformed."""


def connect(version: int, client_id: str = "", *, clean: bool = True,
            password: str = PASSWORD, expiry: int = 0) -> bytes:
    props = Properties(session_expiry_interval=expiry) if version == MQTT_5 and expiry else Properties()
    return encode(Connect(client_id=client_id, clean_start=clean, keep_alive=60, username=USER,
                          password=password.encode(), properties=props), version)


def hostile_then_closed(address: str, data: bytes, version: int = MQTT_5) -> list:
    """Send ``data`` on a new connection; return what the broker sent before closing it."""
    client = RawClient(address, version)
    client.send(data)
    try:
        return client.read_until_closed()
    finally:
        client.close()


def test_expected_conditions_log_one_line_and_no_traceback(sluice_server, tmp_path, cert_files):
    server = sluice_server(tmp_path / "data", "--mqtt-tls-port", "0", "--mqtt-wss-port", "0",
                           "--tls-cert", cert_files.cert, "--tls-key", cert_files.key)
    server.wait_ready()
    address = server.mqtt
    tls_host, tls_port = host_port(re.search(r"MQTT TLS\s+(\S+)", "".join(server.output)).group(1))

    # a peer that closes half-way through its CONNECT, and one that resets right after it
    half = socket.create_connection(host_port(address))
    half.sendall(connect(MQTT_5)[:6])
    half.close()
    reset = socket.create_connection(host_port(address))
    reset.sendall(connect(MQTT_5))
    reset.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    reset.close()

    # SUBSCRIBE and garbage right behind CONNECT, read in the same chunk
    for version in (MQTT_311, MQTT_5):
        hostile_then_closed(address, connect(version) + encode(
            Subscribe(1, (Subscription("a/b", 1),)), version) + GARBAGE, version)

    # a persistent session with queued messages resumed by a CONNECT followed by garbage,
    # and by a CONNECT followed at once by DISCONNECT
    owner = RawClient(address, MQTT_5)
    owner.send(connect(MQTT_5, "queued-session", clean=False, expiry=300))
    assert isinstance(owner.read(), ConnAck)
    owner.send(Subscribe(1, (Subscription("queued/#", 1),)))
    owner.read()
    owner.send(Disconnect())
    owner.close()
    publisher = PahoClient(address, "queue-filler")
    for number in range(20):
        publisher.publish("queued/x", f"m{number}".encode(), qos=1)
    resumed = connect(MQTT_5, "queued-session", clean=False, expiry=300)
    hostile_then_closed(address, resumed + GARBAGE)
    hostile_then_closed(address, resumed + encode(Disconnect(), MQTT_5))

    # a refused login
    refused = hostile_then_closed(address, connect(MQTT_311, "wrong-password-client",
                                                   password="wrong"), MQTT_311)
    assert refused == [ConnAck(False, 4)]

    # TLS: plain MQTT on the TLS port, and a client that does not trust the certificate
    plain = socket.create_connection((tls_host, tls_port), timeout=10)
    plain.sendall(connect(MQTT_311))
    try:
        while plain.recv(100):  # a TLS alert, then the close
            pass
    except OSError:
        pass
    plain.close()
    untrusting = ssl.create_default_context()
    try:
        untrusting.wrap_socket(socket.create_connection((tls_host, tls_port), timeout=10),
                               server_hostname="127.0.0.1")
    except ssl.SSLError:
        pass

    # a malformed HTTP request on the WebSocket port
    ws = socket.create_connection(host_port(server.mqtt_ws.split("/")[2]), timeout=10)
    ws.sendall(b"GET /mqtt HTTP/1.1\r\nHost: x\r\nNot a header\r\n\r\n")
    assert b" 400 " in ws.recv(100)
    ws.close()

    # the broker still serves, and everything above has been handled
    subscriber = PahoClient(address, "after-all", version=mqtt.MQTTv5)
    subscriber.subscribe("after/#", qos=1)
    assert_round_trip(publisher, subscriber, "after/check")
    publisher.stop()
    subscriber.stop()
    assert server.stop() == 0
    log = server.log()

    assert "Traceback" not in log, log[-6000:]
    assert " ERROR " not in log, log[-6000:]
    assert len(re.findall(r"refused: .*wrong", log)) == 1, log[-3000:]
    assert len(re.findall(r"TLS handshake from 127\.0\.0\.1:\d+ failed", log)) == 1, log[-3000:]
    assert re.search(r"mqtt client '[^']+' disconnected: user 'sluice' from 127\.0\.0\.1:\d+ "
                     r"\(MalformedPacket", log), log[-3000:]
    assert len(re.findall(r"bad HTTP request from", log)) == 1, log[-3000:]
