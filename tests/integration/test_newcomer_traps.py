"""What a newcomer runs into first, against a real `sluice serve`: the `sluice` command's errors
and output, the start-up banner and warnings, a failed first start, and clients that connect
to another protocol's port (each named in the log, with the port to use)."""
from __future__ import annotations

import http.client
import socket
import ssl
import subprocess
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import paho.mqtt.client as mqtt
import pika
import pytest

from tests.conftest import ROOT, SLUICE, Server, clean_env

WAIT_S = 30
"""An upper bound for an awaited event (a log line, a message), never a speed target."""


def sluice(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([*SLUICE, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env=clean_env())
    if check:
        assert done.returncode == 0, f"sluice {' '.join(args)}: {done.stdout}{done.stderr}"
    return done


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One broker for the module (message trace off, as by default)."""
    server = Server(tmp_path_factory.mktemp("newcomer") / "data")
    try:
        server.wait_ready()
        yield server
    finally:
        server.kill()


def admin(server: Server) -> list[str]:
    return ["--admin", server.admin]


def native(server: Server) -> list[str]:
    return ["--server", server.native]


def host_port(address: str) -> tuple[str, int]:
    host, port = address.rsplit(":", 1)
    return host, int(port)


def topics(server: Server) -> str:
    return sluice("topic", "list", *admin(server)).stdout


# --- the sluice command ---

@pytest.mark.parametrize("how", [["--group", "typo-group"], ["--earliest"]])
def test_consuming_a_mistyped_topic_says_it_does_not_exist_and_creates_nothing(server, how):
    done = sluice("consume", "ordrs", *how, "--wait", "1", *native(server), check=False)
    assert done.returncode == 1
    assert "topic ordrs does not exist; create it with `sluice topic create ordrs`" in done.stderr
    assert "ordrs" not in topics(server)
    assert "typo-group" not in sluice("group", "list", *admin(server)).stdout


def test_creating_a_topic_a_send_created_names_its_type_and_how_to_change_it(server):
    sluice("send", "readings", "21.5", *native(server))  # creates it: normal, 4 queues
    done = sluice("topic", "create", "readings", "--type", "fifo", *admin(server), check=False)
    assert done.returncode == 1
    assert "exists already, as a normal topic with 4 queues" in done.stderr
    assert "what a send or an MQTT publish to a topic that does not exist creates" in done.stderr
    assert "delete it and create it again" in done.stderr
    assert "`sluice topic delete readings`" in done.stderr


def test_a_fifo_group_says_it_is_one(server):
    created = sluice("group", "create", "packers", "--fifo", *admin(server)).stdout
    assert created.strip() == "created group packers (clustering, FIFO)"
    described = sluice("group", "describe", "packers", *admin(server)).stdout
    assert described.startswith("group packers: clustering, FIFO, 0 live members,")


def test_consume_shows_each_mqtt_subject_and_counts_in_words(server):
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="newcomer-d1")
    client.username_pw_set("sluice", "sluice")
    client.connect(*host_port(server.mqtt))
    client.loop_start()
    try:
        client.publish("sensors/d1/telemetry", b'{"t": 21.5}', qos=1).wait_for_publish(WAIT_S)
    finally:
        client.disconnect()
        client.loop_stop()
    done = sluice("consume", "sensors", "--earliest", "--wait", "2", *native(server))
    assert "subject=sensors/d1/telemetry" in done.stdout and '{"t": 21.5}' in done.stdout
    assert "received 1 message from sensors" in done.stderr


# --- start-up ---

def test_the_banner_says_message_trace_is_off_and_how_to_turn_it_on(server):
    banner = "".join(server.output)
    assert "message trace  off (restart with SLUICE_CORE_MESSAGE_TRACE=true" in banner


def test_a_misspelled_variable_is_named_with_the_closest_setting(sluice_server, tmp_path):
    tools = {"SLUICE_USER": "ann", "SLUICE_SERVER": "127.0.0.1:1", "SLUICE_ADMIN_URL": "x",
             "SLUICE_TEST_POSTGRES_URL": "x", "SLUICE_CONFIG": ""}
    server = sluice_server(tmp_path / "data", env={"SLUICE_CORE_MESAGE_TRACE": "true",
                                                   "SLUICE_CORE_MESSAGE_TRACE": "true", **tools})
    server.wait_ready()
    log = server.log()
    assert ("environment variable SLUICE_CORE_MESAGE_TRACE is not a Sluice setting and is "
            "ignored; did you mean SLUICE_CORE_MESSAGE_TRACE?") in log
    assert log.count("is not a Sluice setting") == 1, "the tools' own variables are known"
    assert "message trace  on" in "".join(server.output)


def test_a_failed_first_start_leaves_no_data_directory_behind(tmp_path):
    existing = tmp_path / "existing"
    existing.mkdir()
    with socket.socket() as holder:  # as a broker already running would hold it
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = str(holder.getsockname()[1])
        for data_dir in (tmp_path / "new" / "data", existing):
            done = subprocess.run(
                [*SLUICE, "serve", "--data-dir", str(data_dir), "--native-port", "0",
                 "--admin-port", port, "--mqtt-port", "0", "--mqtt-ws-port", "0",
                 "--amqp-port", "0"],
                cwd=ROOT, capture_output=True, text=True, timeout=60, env=clean_env())
            assert done.returncode == 1 and f"port {port}" in done.stderr
    assert not (tmp_path / "new").exists(), "what this start created is removed again"
    assert existing.is_dir(), "a directory that existed before is left"


# --- clients on the wrong port ---

class LogWatch:
    """Collects a broker's stderr lines on a thread; ``wait_for(text)`` returns the first line
    holding ``text`` once it is written."""

    def __init__(self, server: Server) -> None:
        self._lines: list[str] = []
        self._grew = threading.Condition()
        threading.Thread(target=self._pump, args=(server,), daemon=True).start()

    def _pump(self, server: Server) -> None:
        for line in server.follow_log():
            with self._grew:
                self._lines.append(line)
                self._grew.notify_all()

    def wait_for(self, text: str) -> str:
        def found() -> str | None:
            return next((line for line in self._lines if text in line), None)
        with self._grew:
            assert self._grew.wait_for(found, WAIT_S), f"no log line with {text!r}"
            return found()


@pytest.fixture(scope="module")
def log_watch(server: Server) -> LogWatch:
    return LogWatch(server)


def test_an_amqp_client_on_the_mqtt_port_is_told_the_amqp_port(server, log_watch):
    host, port = host_port(server.mqtt)
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        pika.BlockingConnection(pika.ConnectionParameters(host, port, connection_attempts=1,
                                                          socket_timeout=WAIT_S))
    line = log_watch.wait_for("An AMQP client")
    assert f"connected to the MQTT port {port}; use port {host_port(server.amqp)[1]} (AMQP)" in line


def test_an_mqtt_client_on_the_amqp_port_is_told_the_mqtt_port(server, log_watch):
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="lost")
    client.username_pw_set("sluice", "sluice")
    client.connect(*host_port(server.amqp))
    client.loop_start()
    try:
        line = log_watch.wait_for("An MQTT client")
    finally:
        client.loop_stop()
    port = host_port(server.amqp)[1]
    assert f"connected to the AMQP port {port}; use port {host_port(server.mqtt)[1]} (MQTT)" in line


def test_an_http_client_on_the_amqp_port_is_told_where_the_admin_api_is(server, log_watch):
    with pytest.raises((http.client.HTTPException, urllib.error.URLError, ConnectionError)):
        urllib.request.urlopen(f"http://{server.amqp}/health", timeout=WAIT_S)  # gets AMQP's header
    line = log_watch.wait_for("An HTTP client")
    assert f"connected to the AMQP port {host_port(server.amqp)[1]}; the admin API is at " \
           f"{server.admin}" in line


def test_a_grpc_client_on_the_mqtt_port_is_told_the_native_port(server, log_watch):
    with grpc.insecure_channel(server.mqtt) as channel:
        # HTTP/2: the channel sends the connection preface as it connects, and never gets ready.
        with pytest.raises(grpc.FutureTimeoutError):
            grpc.channel_ready_future(channel).result(timeout=2)
    line = log_watch.wait_for("An HTTP/2 client")
    assert f"connected to the MQTT port {host_port(server.mqtt)[1]}; use port " \
           f"{host_port(server.native)[1]} (native gRPC)" in line


def test_a_tls_client_on_the_plain_mqtt_port_is_told_there_is_no_tls_listener(server, log_watch):
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    with socket.create_connection(host_port(server.mqtt), timeout=WAIT_S) as sock:
        with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
            context.wrap_socket(sock, server_hostname="127.0.0.1")
    line = log_watch.wait_for("A TLS client")
    assert "this broker has no MQTT TLS listener" in line

