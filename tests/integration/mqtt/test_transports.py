"""MQTT over WebSocket, TLS and secure WebSocket against a running broker, and shared
subscription groups keeping messages while every member is offline."""
from __future__ import annotations

import queue
import re
import ssl
import time
import uuid

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

TIMEOUT = 10


class Client:
    """A paho client whose received messages land in a queue; connects at construction."""

    def __init__(self, host: str, port: int, client_id: str, *, transport: str = "tcp",
                 path: str = "/mqtt", ca_file: str | None = None, clean: bool = True,
                 protocol: int = mqtt.MQTTv311) -> None:
        """``clean=False`` asks for a persistent session: clean session 0 in 3.1.1, clean
        start 0 with a one-hour session expiry in MQTT 5."""
        self.messages: queue.Queue[mqtt.MQTTMessage] = queue.Queue()
        self.connected: queue.Queue[tuple[bool, int]] = queue.Queue()
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id,
                                  transport=transport, protocol=protocol,
                                  clean_session=clean if protocol != mqtt.MQTTv5 else None)
        self.client.username_pw_set("sluice", "sluice")
        if transport == "websockets":
            self.client.ws_set_options(path=path)
        if ca_file is not None:
            self.client.tls_set(ca_certs=ca_file, cert_reqs=ssl.CERT_REQUIRED)
        self.client.on_message = lambda _c, _u, message: self.messages.put(message)
        self.client.on_connect = lambda _c, _u, flags, code, _p: self.connected.put(
            (flags.session_present, code.value))
        if protocol == mqtt.MQTTv5:
            properties = Properties(PacketTypes.CONNECT)
            properties.SessionExpiryInterval = 0 if clean else 3600
            self.client.connect(host, port, clean_start=clean, properties=properties)
        else:
            self.client.connect(host, port)
        self.client.loop_start()
        self.session_present, code = self.connected.get(timeout=TIMEOUT)
        assert code == 0, f"CONNACK refused: {code}"

    def subscribe(self, topic_filter: str, qos: int) -> None:
        granted: queue.Queue[int] = queue.Queue()
        self.client.on_subscribe = lambda _c, _u, _mid, codes, _p: granted.put(codes[0].value)
        self.client.subscribe(topic_filter, qos)
        assert granted.get(timeout=TIMEOUT) == qos

    def publish(self, topic: str, payload: bytes, qos: int = 1) -> None:
        self.client.publish(topic, payload, qos).wait_for_publish(TIMEOUT)

    def receive(self) -> mqtt.MQTTMessage:
        return self.messages.get(timeout=TIMEOUT)

    def stop(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def hostport(address: str) -> tuple[str, int]:
    host, port = address.rsplit(":", 1)
    return host, int(port)


def test_websocket_and_tcp_clients_exchange_messages(sluice_server, tmp_path):
    server = sluice_server(tmp_path / "data")
    server.wait_ready()
    ws_host, ws_port = hostport(server.mqtt_ws.removeprefix("ws://").removesuffix("/mqtt"))
    topic = f"dash/{uuid.uuid4().hex}"
    browser = Client(ws_host, ws_port, "dashboard", transport="websockets")
    device = Client(*hostport(server.mqtt), "device")
    browser.subscribe(f"{topic}/#", 1)
    device.subscribe(f"{topic}/cmd", 1)
    device.publish(f"{topic}/temp", b"21.5")
    assert browser.receive().payload == b"21.5"
    browser.publish(f"{topic}/cmd", b"reboot")
    assert device.receive().payload == b"reboot"
    browser.stop()
    device.stop()


def test_tls_and_secure_websocket_listeners_serve_mqtt(sluice_server, tmp_path, cert_files):
    server = sluice_server(tmp_path / "data", "--mqtt-tls-port", "0", "--mqtt-wss-port", "0",
                           "--tls-cert", cert_files.cert, "--tls-key", cert_files.key)
    server.wait_ready()
    text = "".join(server.output)
    tls = re.search(r"MQTT TLS\s+(\S+)", text).group(1)
    wss_host, wss_port = hostport(re.search(r"MQTT WSS\s+wss://(\S+)/mqtt", text).group(1))
    secure = Client(*hostport(tls), "over-tls", ca_file=cert_files.cert)
    secure_ws = Client(wss_host, wss_port, "over-wss", transport="websockets",
                       ca_file=cert_files.cert)
    secure.subscribe("secure/#", 2)
    secure_ws.publish("secure/ws", b"from wss", qos=2)
    message = secure.receive()
    assert (message.topic, message.payload, message.qos) == ("secure/ws", b"from wss", 2)
    secure.stop()
    secure_ws.stop()


def test_a_tls_client_that_does_not_trust_the_certificate_is_refused(sluice_server, tmp_path,
                                                                       make_cert_files):
    served, other = make_cert_files("served"), make_cert_files("other")
    server = sluice_server(tmp_path / "data", "--mqtt-tls-port", "0", "--mqtt-wss-port", "0",
                           "--tls-cert", served.cert, "--tls-key", served.key)
    server.wait_ready()
    tls = re.search(r"MQTT TLS\s+(\S+)", "".join(server.output)).group(1)
    with pytest.raises(ssl.SSLError):
        Client(*hostport(tls), "untrusting", ca_file=other.cert)


@pytest.mark.parametrize("protocol", [mqtt.MQTTv311, mqtt.MQTTv5], ids=["v311", "v5"])
def test_a_shared_group_keeps_messages_while_every_member_is_offline(sluice_server, tmp_path,
                                                                      protocol):
    server = sluice_server(tmp_path / "data")
    server.wait_ready()
    address = hostport(server.mqtt)
    topic = f"jobs/{uuid.uuid4().hex}"

    workers = [Client(*address, name, clean=False, protocol=protocol)
               for name in ("worker-a", "worker-b")]
    for client in workers:
        client.subscribe(f"$share/workers/{topic}", 1)
    for client in workers:
        client.stop()
    producer = Client(*address, "producer")
    for number in range(20):
        producer.publish(topic, str(number).encode())
    returning = Client(*address, "worker-a", clean=False, protocol=protocol)
    assert returning.session_present
    got = sorted(int(returning.receive().payload) for _ in range(20))
    assert got == list(range(20))
    returning.stop()
    producer.stop()



def test_connack_announces_server_keep_alive_and_an_assigned_client_id(sluice_server, tmp_path):
    """MQTT 5: with ``max_keep_alive_s`` set, a client asking for a longer keep alive is told the
    server's in CONNACK; a client without an id gets one assigned."""
    config = '[auth]\ndefault_password = "sluice"\n[mqtt]\nmax_keep_alive_s = 5\n'
    server = sluice_server(tmp_path / "data", config=config)
    server.wait_ready()
    answers: queue.Queue[Properties] = queue.Queue()
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="", protocol=mqtt.MQTTv5)
    client.username_pw_set("sluice", "sluice")
    client.on_connect = lambda _c, _u, _flags, code, properties: answers.put(properties)
    client.connect(*hostport(server.mqtt), keepalive=60)
    client.loop_start()
    properties = answers.get(timeout=TIMEOUT)
    assert properties.ServerKeepAlive == 5
    assert properties.AssignedClientIdentifier.startswith("sluice-")
    client.disconnect()
    client.loop_stop()


def test_a_session_ends_when_its_expiry_interval_passes(sluice_server, tmp_path):
    """MQTT 5 session expiry 1 s: reconnecting at once finds the session (and what was queued
    for it); reconnecting after the interval finds none."""
    server = sluice_server(tmp_path / "data")
    server.wait_ready()
    address = hostport(server.mqtt)
    topic = f"expiry/{uuid.uuid4().hex}"

    def connect() -> tuple[mqtt.Client, queue.Queue]:
        answers: queue.Queue = queue.Queue()
        client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="short-lived", protocol=mqtt.MQTTv5)
        client.username_pw_set("sluice", "sluice")
        client.on_connect = lambda _c, _u, flags, _code, _p: answers.put(flags.session_present)
        client.on_message = lambda _c, _u, message: answers.put(message.payload)
        properties = Properties(PacketTypes.CONNECT)
        properties.SessionExpiryInterval = 1
        client.connect(*address, clean_start=False, properties=properties)
        client.loop_start()
        return client, answers

    client, answers = connect()
    assert answers.get(timeout=TIMEOUT) is False
    client.subscribe(topic, 1)
    client.disconnect()
    client.loop_stop()
    Client(*address, "expiry-publisher").publish(topic, b"kept")
    client, answers = connect()
    assert answers.get(timeout=TIMEOUT) is True
    assert answers.get(timeout=TIMEOUT) == b"kept"
    client.disconnect()
    client.loop_stop()
    time.sleep(1.5)  # the session's expiry interval must pass: time is the subject here
    client, answers = connect()
    assert answers.get(timeout=TIMEOUT) is False
    client.disconnect()
    client.loop_stop()
