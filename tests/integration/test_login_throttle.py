"""Failed logins are throttled on every protocol, against a real `sluice serve` and real clients
(paho-mqtt, pika, HTTP): after a few failures one address is refused for that user name, even
with the right password, while the same user logs in at once from another loopback address
(127.0.0.2, the client socket bound to it); an address failing for many names is refused for
all of them. Core's unit tests count the work (tests/unit/core/test_login_throttle.py)."""
from __future__ import annotations

import base64
import http.client
import json
import threading
from collections.abc import Iterator

import paho.mqtt.client as mqtt
import pika
import pika.tcp_socket_opts
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from pika import exceptions as errors

from tests.conftest import CONFIG, Server

PAIR_LIMIT, PEER_LIMIT = 3, 12
THROTTLE_CONFIG = CONFIG + f"""
[core]
login_failure_delay_ms = 50
login_max_failures_per_peer_user = {PAIR_LIMIT}
login_max_failures_per_peer = {PEER_LIMIT}
login_ban_ms = 600_000
"""
"""Each test fails from 127.0.0.1 at most ``PAIR_LIMIT`` times, so the tests together stay
below ``PEER_LIMIT`` there; the address-wide ban is tried from 127.0.0.3."""
OTHER_ADDRESS = "127.0.0.2"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    broker = Server(tmp_path_factory.mktemp("throttle") / "data", config=THROTTLE_CONFIG)
    try:
        broker.wait_ready()
        yield broker
    finally:
        broker.kill()


def admin(server: Server, method: str, path: str, body: object = None, *,
          user: str = "sluice", password: str = "sluice",
          source: str | None = None) -> tuple[int, dict, http.client.HTTPResponse]:
    """One admin API request, optionally from the loopback address ``source``."""
    host, port = server.admin.rsplit(":", 1)
    connection = http.client.HTTPConnection(host.removeprefix("http://").strip("/"), int(port),
                                            timeout=30,
                                            source_address=(source, 0) if source else None)
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    headers = {"Authorization": f"Basic {token}", "Content-Type": "application/json"}
    connection.request(method, path, None if body is None else json.dumps(body), headers)
    response = connection.getresponse()
    answer = json.loads(response.read() or b"{}")
    connection.close()
    return response.status, answer, response


def create_user(server: Server, name: str) -> None:
    assert admin(server, "POST", "/users", {"name": name, "password": "right"})[0] == 201


def mqtt_login(server: Server, user: str, password: str, *, source: str = "",
               version: int = mqtt.MQTTv5) -> int:
    """The CONNACK reason code paho gets for ``user``/``password`` from ``source``."""
    host, port = server.mqtt.rsplit(":", 1)
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="", protocol=version)
    client.username_pw_set(user, password)
    answered = threading.Event()
    reasons: list[int] = []

    def on_connect(client, userdata, flags, reason, properties) -> None:
        reasons.append(reason.value)
        answered.set()

    client.on_connect = on_connect
    client.connect(host, int(port), keepalive=30, bind_address=source)
    client.loop_start()
    try:
        assert answered.wait(30), "no CONNACK"
    finally:
        client.disconnect()
        client.loop_stop()
    return reasons[0]


def test_mqtt_refuses_an_address_after_failures_and_lets_the_user_in_from_another(server):
    create_user(server, "mqtt-ann")
    for _ in range(PAIR_LIMIT):
        assert mqtt_login(server, "mqtt-ann", "guess") == 0x86  # bad user name or password
    assert mqtt_login(server, "mqtt-ann", "right") == 0x8A, "banned, right password or not"
    assert mqtt_login(server, "mqtt-ann", "right", version=mqtt.MQTTv311) == 0x87, \
        "MQTT 3.1.1 has no 'banned': return code 5, not authorized"
    assert mqtt_login(server, "mqtt-ann", "right", source=OTHER_ADDRESS) == 0, \
        "the same user from another address gets in at once"


def test_amqp_refuses_an_address_after_failures_and_lets_the_user_in_from_another(
        server, monkeypatch):
    create_user(server, "amqp-ann")
    admin(server, "PUT", "/vhosts/%2F/permissions/amqp-ann",
          {"configure": ".*", "write": ".*", "read": ".*"})
    host, port = server.amqp.rsplit(":", 1)

    def connect(password: str) -> pika.BlockingConnection:
        return pika.BlockingConnection(pika.ConnectionParameters(
            host, int(port), "/", pika.PlainCredentials("amqp-ann", password),
            connection_attempts=1, socket_timeout=10))

    for _ in range(PAIR_LIMIT):
        with pytest.raises(errors.ProbableAuthenticationError):
            connect("guess")
    with pytest.raises(errors.ProbableAuthenticationError) as banned:
        connect("right")
    assert "403" in str(banned.value) and "too many failed logins" in str(banned.value)

    set_options = pika.tcp_socket_opts.set_sock_opts

    def from_other_address(options, sock) -> None:  # pika's hook on its socket before connect
        sock.bind((OTHER_ADDRESS, 0))
        set_options(options, sock)

    monkeypatch.setattr(pika.tcp_socket_opts, "set_sock_opts", from_other_address)
    connection = connect("right")
    try:
        channel = connection.channel()
        channel.queue_declare("amqp-ann-q")
        assert channel.queue_declare("amqp-ann-q", passive=True).method.queue == "amqp-ann-q"
    finally:
        connection.close()


def test_the_admin_api_refuses_an_address_after_failures_with_429_and_retry_after(server):
    create_user(server, "http-ann")
    for _ in range(PAIR_LIMIT):
        status, body, _ = admin(server, "GET", "/topics", user="http-ann", password="guess")
        assert (status, body["error"]) == (401, "unauthenticated")
    status, body, response = admin(server, "GET", "/topics", user="http-ann", password="right")
    assert (status, body["error"]) == (429, "too_many_failed_logins")
    assert 0 < int(response.getheader("Retry-After")) <= 600
    assert "WWW-Authenticate" not in response.headers
    status, _, _ = admin(server, "GET", "/topics", user="http-ann", password="right",
                         source=OTHER_ADDRESS)
    assert status == 200


def test_an_address_failing_for_many_user_names_is_refused_for_all_and_others_go_on(server):
    create_user(server, "victim")
    attacker = "127.0.0.3"
    for n in range(PEER_LIMIT):
        assert mqtt_login(server, f"guess-{n}", "guess", source=attacker) == 0x86
    assert mqtt_login(server, "victim", "right", source=attacker) == 0x8A
    status, body, _ = admin(server, "GET", "/topics", user="victim", password="right",
                            source=attacker)
    assert (status, body["error"]) == (429, "too_many_failed_logins"), "on every protocol"
    assert mqtt_login(server, "victim", "right") == 0, "another address logs in as usual"
    assert "logins from address 127.0.0.3 are refused for 600 s" in server.log()
