"""`sluice serve` as a real process, driven by the `sluice` admin and data commands.

The server binds port 0 for both listeners and prints the ports it got; the test reads its stdout
until the ready line appears (an event, not a sleep), runs the commands as subprocesses against
it, stops it with SIGTERM, and restarts it on the same data directory.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parents[2]
SLUICE = [sys.executable, "-m", "sluice.cli"]
CLEAN_ENV = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
"""The commands' environment: no SLUICE_* settings leak in from the shell running the tests."""
CONFIG = """
[store]
segment_size = 4_194_304
[auth]
default_password = "sluice"
"""


def sluice(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([*SLUICE, *args], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env=CLEAN_ENV)
    if check:
        assert done.returncode == 0, f"sluice {' '.join(args)}: {done.stdout}{done.stderr}"
    return done


@pytest.fixture
def data_dir(tmp_path):
    return tmp_path / "data"


@pytest.fixture
def server(sluice_server, data_dir):
    return sluice_server(data_dir)


def test_serve_prints_every_endpoint_and_survives_a_restart(server, data_dir, sluice_server):
    server.wait_ready()
    printed = "".join(server.output)
    for what in ("native gRPC", "admin API", "metrics", "/metrics", "/openapi.json", "data dir",
                 str(data_dir), "default user", "sluice / sluice"):
        assert what in printed, what
    admin, native = ["--admin", server.admin], ["--server", server.native]

    assert "created topic orders" in sluice("topic", "create", "orders", "--queues", "2", *admin).stdout
    assert "orders" in sluice("topic", "list", *admin).stdout

    sent = sluice("send", "orders", "order {n}", "--key", "batch-{n}", "--count", "100", *native)
    assert "sent 100 messages" in sent.stdout
    assert "sent 100/100" in sent.stderr  # the progress line
    keyed = sluice("send", "orders", "the keyed one", "--key", "order-7", *native)
    assert keyed.stdout.startswith("sent ")

    consumed = sluice("consume", "orders", "--group", "billing", "--count", "101", "--wait", "20",
                      "--json", *native)
    bodies = [json.loads(line)["body_text"] for line in consumed.stdout.splitlines()]
    assert sorted(bodies) == sorted([f"order {i}" for i in range(100)] + ["the keyed one"])
    assert "received 101 messages" in consumed.stderr

    described = json.loads(sluice("group", "describe", "billing", "--json", *admin).stdout)
    assert described["total_lag"] == 0
    assert sum(q["committed"] for q in described["lag"]) == 101
    assert "billing" in sluice("group", "describe", "billing", *admin).stdout

    assert server.stop() == 0
    assert "Sluice stopped." in "".join(server.output)

    again = sluice_server(data_dir)
    try:
        again.wait_ready()
        admin = ["--admin", again.admin]
        assert "orders" in sluice("topic", "list", *admin).stdout
        topic = json.loads(sluice("topic", "describe", "orders", "--json", *admin).stdout)
        assert topic["messages"] == 101
        read = sluice("consume", "orders", "--earliest", "--wait", "3", "--json", "--server", again.native)
        assert sorted(json.loads(line)["body_text"] for line in read.stdout.splitlines()) == sorted(bodies)
        found = sluice("message", "get", "--topic", "orders", "--key", "order-7", *admin).stdout
        assert "body: the keyed one" in found
        numbered = sluice("message", "get", "--topic", "orders", "--key", "batch-42", *admin).stdout
        assert "body: order 42" in numbered
        ranged = sluice("message", "find", "orders", "--from", "2000-01-01T00:00:00", "--limit", "3",
                        *admin).stdout
        assert ranged.count("body: ") == 3
        assert "no message" in sluice("message", "find", "orders", "--from", "1", "--to", "2",
                                      *admin).stdout
        described = json.loads(sluice("group", "describe", "billing", "--json", *admin).stdout)
        assert described["total_lag"] == 0, "committed offsets survive the restart"
        assert "not created (users exist)" in "".join(again.output)
        groups = sluice("group", "list", *admin).stdout
        assert "billing" in groups and "reader" not in groups, "reading by offset joins no group"
        assert again.stop() == 0
    finally:
        again.kill()


def test_admin_commands_need_the_right_credentials(server):
    server.wait_ready()
    admin = ["--admin", server.admin]
    refused = sluice("topic", "list", *admin, "--password", "nope", check=False)
    assert refused.returncode == 1
    assert "401" in refused.stderr and "SLUICE_PASSWORD" in refused.stderr
    sluice("user", "create", "viewer", "--new-password", "pw", *admin)
    forbidden = sluice("user", "list", *admin, "--user", "viewer", "--password", "pw", check=False)
    assert forbidden.returncode == 1 and "403" in forbidden.stderr
    sluice("user", "grant", "viewer", "topic", "*", "subscribe", *admin)
    assert "subscribe" in sluice("user", "permissions", "viewer", *admin).stdout


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_taken_port_names_the_port_and_the_flag(data_dir):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        done = subprocess.run([*SLUICE, "serve", "--data-dir", str(data_dir), "--native-port", "0",
                               "--admin-port", str(port)], cwd=ROOT, capture_output=True, text=True,
                              timeout=60, env=CLEAN_ENV)
    assert done.returncode == 1
    assert f"port {port}" in done.stderr and "--admin-port" in done.stderr


def test_commands_without_a_broker_say_how_to_start_one():
    closed = free_port()
    listed = sluice("topic", "list", "--admin", f"http://127.0.0.1:{closed}", check=False)
    assert listed.returncode == 1 and "start it with `make run`" in listed.stderr
    sent = sluice("send", "t", "x", "--server", f"127.0.0.1:{closed}", "--connect-timeout", "1",
                  check=False)
    assert sent.returncode == 1 and "start it with `make run`" in sent.stderr


def test_a_bad_config_file_names_the_key(tmp_path):
    config = tmp_path / "bad.toml"
    config.write_text("[store]\nflsuh = 'sync'\n")
    done = sluice("serve", "--config", str(config), check=False)
    assert done.returncode == 2 and "unknown key 'store.flsuh'" in done.stderr


def test_anonymous_clients_get_the_rights_of_the_anonymous_user(sluice_server, data_dir):
    import asyncio

    from sluice.client import (ClientConfig, ForbiddenError, Message, Producer, SimpleConsumer,
                                      UnauthorizedError)
    server = sluice_server(data_dir, "--allow-anonymous")
    server.wait_ready()
    assert "rights of user 'anonymous'" in "".join(server.output)
    admin = ["--admin", server.admin]
    sluice("topic", "create", "orders", *admin)
    anonymous = ClientConfig(server.native, request_timeout=10)

    async def send() -> None:
        async with Producer(anonymous, ["orders"]) as producer:
            await producer.send(Message("orders", b"hello"))

    with pytest.raises(ForbiddenError):  # the user does not exist yet: no rights at all
        asyncio.run(send())
    sluice("user", "create", "anonymous", "--new-password", "unused", *admin)
    sluice("user", "grant", "anonymous", "topic", "orders", "publish", *admin)
    asyncio.run(send())

    async def receive() -> None:
        async with SimpleConsumer(anonymous, "g", {"orders": "*"}, await_duration=1) as consumer:
            await consumer.receive(1)
    with pytest.raises((ForbiddenError, UnauthorizedError)):
        asyncio.run(receive())


def test_simulate_publishes_telemetry_that_lands_in_the_devices_topic(sluice_server, tmp_path):
    from store.reader import StoreReader

    server = sluice_server(tmp_path / "data")
    server.wait_ready()
    done = subprocess.run([*SLUICE, "simulate", "--mqtt", server.mqtt, "--devices", "20",
                           "--count", "300", "--rate", "0", "--qos", "1"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "300 readings from 20 devices" in done.stdout
    assert server.stop() == 0
    reader = StoreReader(str(tmp_path / "data"))
    stored = [m for topic, queue in reader.queues() if topic == "devices"
              for m in reader.read(topic, queue, 0, 1000)]
    reader.close()
    assert len(stored) == 300
    for message in stored:
        reading = json.loads(message.body)
        assert message.properties["sluice.subject"] == f"devices/{reading['device']}/telemetry"


def test_a_taken_websocket_port_is_named_as_the_websocket_port(data_dir):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        done = subprocess.run([*SLUICE, "serve", "--data-dir", str(data_dir), "--native-port", "0",
                               "--admin-port", "0", "--mqtt-port", "0", "--mqtt-ws-port", str(port)],
                              cwd=ROOT, capture_output=True, text=True, timeout=60, env=CLEAN_ENV)
    assert done.returncode == 1
    assert f"port {port} on 127.0.0.1 (MQTT WebSocket)" in done.stderr
    assert "--mqtt-ws-port" in done.stderr and "SLUICE_MQTT_WS_PORT" in done.stderr


def test_a_second_broker_on_the_same_data_dir_is_told_of_the_first(server, data_dir):
    server.wait_ready()
    admin_port = server.admin.rsplit(":", 1)[1]
    done = subprocess.run([*SLUICE, "serve", "--data-dir", str(data_dir), "--admin-port", admin_port],
                          cwd=ROOT, capture_output=True, text=True, timeout=60, env=CLEAN_ENV)
    assert done.returncode == 1
    assert "is in use by another broker" in done.stderr
    assert "port" not in done.stderr, "the lock is the reason, not the ports it also holds"


def test_logs_can_be_json_lines_at_a_chosen_level(sluice_server, tmp_path):
    server = sluice_server(tmp_path / "data", "--log-format", "json")
    server.wait_ready()
    assert server.stop() == 0
    lines = [json.loads(line) for line in server.log().splitlines()]
    assert any(entry["message"].startswith("stopping") for entry in lines)
    assert all({"ts", "level", "logger", "message"} <= set(entry) for entry in lines)

    quiet = sluice_server(tmp_path / "data", "--log-level", "warning")
    quiet.wait_ready()
    assert quiet.stop() == 0
    assert "stopping" not in quiet.log()


def test_an_interrupted_send_says_how_many_it_sent(server):
    import signal

    server.wait_ready()
    sluice("topic", "create", "bulk", "--admin", server.admin)
    sender = subprocess.Popen([*SLUICE, "send", "bulk", "m{n}", "--count", "100000000",
                               "--server", server.native], cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=CLEAN_ENV)
    try:
        first = sender.stderr.readline()  # the first progress line: sending is under way
        assert first.startswith("sent "), first
        sender.send_signal(signal.SIGINT)
        out, err = sender.communicate(timeout=60)
    finally:
        sender.kill()
    assert "of 100000000 messages before it was interrupted" in out
    assert "Traceback" not in err


def test_consuming_a_missing_topic_leaves_no_group_behind(sluice_server, data_dir):
    """With topics not created on first use (a route lookup by a user who may publish creates
    one otherwise), a consumer's typo is an error and leaves nothing behind."""
    server = sluice_server(data_dir, config=CONFIG + "[core]\nauto_create_topics = false\n")
    server.wait_ready()
    done = sluice("consume", "no-such-topic", "--group", "typo-group", "--wait", "1",
                  "--server", server.native, check=False)
    assert done.returncode == 1 and "no-such-topic" in done.stderr
    assert "typo-group" not in sluice("group", "list", "--admin", server.admin).stdout
    assert "no-such-topic" not in sluice("topic", "list", "--admin", server.admin).stdout


def test_topic_list_hides_internal_topics_unless_asked(server):
    server.wait_ready()
    assert "%SYS%" not in sluice("topic", "list", "--admin", server.admin).stdout
    assert "%SYS%" in sluice("topic", "list", "--all", "--admin", server.admin).stdout


def test_a_taken_amqp_port_is_named_with_its_flag(data_dir):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        done = subprocess.run([*SLUICE, "serve", "--data-dir", str(data_dir), "--native-port", "0",
                               "--admin-port", "0", "--mqtt-port", "0", "--mqtt-ws-port", "0",
                               "--amqp-port", str(port)],
                              cwd=ROOT, capture_output=True, text=True, timeout=60, env=CLEAN_ENV)
    assert done.returncode == 1
    assert f"port {port} on 127.0.0.1 (AMQP)" in done.stderr
    assert "--amqp-port" in done.stderr and "SLUICE_AMQP_PORT" in done.stderr
