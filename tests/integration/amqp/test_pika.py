"""pika (BlockingConnection) against a real `sluice serve`: logins, vhosts, topology and its
refusals as RabbitMQ answers them, exclusive queues, heartbeats,
the client list and garbage on the AMQP port."""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import uuid

import pika
import pika.exceptions as errors
import pytest

from tests.conftest import ROOT, clean_env
from tests.integration.amqp.conftest import SLUICE_PASSWORD, SLUICE_USER, connect


def name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def closed_channel(call) -> errors.ChannelClosedByBroker:
    with pytest.raises(errors.ChannelClosedByBroker) as closed:
        call()
    return closed.value


def test_guest_and_a_sluice_user_connect(amqp_server):
    for user, password in (("guest", "guest"), (SLUICE_USER, SLUICE_PASSWORD)):
        connection = connect(amqp_server, user=user, password=password)
        assert connection.is_open
        connection.channel().queue_declare("", exclusive=True)
        connection.close()
    assert "guest/guest from this host only" in "".join(amqp_server.output)


def test_a_wrong_password_is_refused_with_403(amqp_server):
    with pytest.raises(errors.ProbableAuthenticationError) as refused:
        connect(amqp_server, user=SLUICE_USER, password="wrong")
    assert "403" in str(refused.value) and "ACCESS_REFUSED" in str(refused.value)


def test_an_unknown_vhost_is_refused_with_530(amqp_server):
    with pytest.raises(errors.ProbableAccessDeniedError) as refused:  # as against RabbitMQ
        connect(amqp_server, vhost="nowhere")
    assert "(530) 'NOT_ALLOWED - vhost nowhere not found'" in str(refused.value)


def test_declare_bind_and_rabbitmqs_refusals(amqp_server):
    connection = connect(amqp_server)
    channel = connection.channel()
    exchange, queue = name("x"), name("q")
    channel.exchange_declare(exchange, "topic", durable=True)
    assert channel.queue_declare(queue).method.queue == queue
    channel.queue_bind(queue, exchange, "a.*")
    channel.exchange_bind(exchange, "amq.topic", "#")
    assert channel.queue_declare(queue, passive=True).method.message_count == 0

    assert closed_channel(lambda: channel.exchange_declare(exchange, "fanout")).reply_code == 406
    channel = connection.channel()
    assert closed_channel(lambda: channel.queue_declare(name("none"), passive=True)
                          ).reply_code == 404
    channel = connection.channel()
    assert closed_channel(lambda: channel.queue_bind(queue, name("none"))).reply_code == 404
    channel = connection.channel()
    assert closed_channel(lambda: channel.exchange_declare("amq.mine", "direct")
                          ).reply_code == 403

    mine = connection.channel().queue_declare("", exclusive=True).method.queue
    other = connect(amqp_server)
    locked = closed_channel(lambda: other.channel().queue_declare(mine))
    assert locked.reply_code == 405 and locked.reply_text.startswith("RESOURCE_LOCKED")
    other.close()
    channel = connection.channel()
    channel.queue_unbind(queue, exchange, "a.*")
    channel.queue_delete(queue)
    channel.exchange_delete(exchange)
    assert closed_channel(lambda: channel.queue_declare(queue, passive=True)).reply_code == 404
    connection.close()


def test_a_user_needs_a_permission_on_the_vhost_and_then_the_right_to_declare(amqp_server):
    admin = ["--admin", amqp_server.admin, "--user", SLUICE_USER, "--password", SLUICE_PASSWORD]

    def sluice(*argv: str) -> None:
        done = subprocess.run([sys.executable, "-m", "sluice.cli", *argv, *admin], cwd=ROOT,
                              env=clean_env(), capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr

    sluice("user", "create", "plain", "--new-password", "plain-pw")
    with pytest.raises(errors.ProbableAccessDeniedError):
        connect(amqp_server, user="plain", password="plain-pw")
    sluice("vhost", "permit", "plain", "/", "--read", ".*")
    connection = connect(amqp_server, user="plain", password="plain-pw")
    channel = connection.channel()
    channel.exchange_declare("amq.direct", passive=True)
    queue = name("q")
    denied = closed_channel(lambda: channel.queue_declare(queue))
    assert denied.reply_code == 403
    assert denied.reply_text == (f"ACCESS_REFUSED - access to queue '{queue}' in vhost '/' "
                                 "refused for user 'plain'")
    connection.close()


def test_an_exclusive_queue_is_gone_once_its_connection_closes(amqp_server):
    first = connect(amqp_server)
    queue = first.channel().queue_declare("", exclusive=True).method.queue
    first.channel().queue_declare(queue, passive=True)
    first.close()
    second = connect(amqp_server)
    assert closed_channel(lambda: second.channel().queue_declare(queue, passive=True)
                          ).reply_code == 404
    second.close()


def admin_cli(server, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sluice.cli", *args, "--admin", server.admin,
                           "--user", SLUICE_USER, "--password", SLUICE_PASSWORD], cwd=ROOT,
                          env=clean_env(), capture_output=True, text=True, timeout=60)


def test_heartbeats_are_negotiated_and_the_connection_is_listed(amqp_server):
    # The blocked client sends no heartbeats while the CLI runs: an interval far above what the
    # CLI takes on a loaded machine, so its silence is never a missed heartbeat.
    connection = connect(amqp_server, heartbeat=300,
                         client_properties={"connection_name": "lister"})
    channel = connection.channel()
    queue = channel.queue_declare("", exclusive=True).method.queue
    channel.basic_consume(queue, lambda *delivery: None)
    listed = admin_cli(amqp_server, "client", "list", "--protocol", "amqp", "--json")
    assert listed.returncode == 0, listed.stderr
    [view] = [c for c in json.loads(listed.stdout)
              if c["details"].get("connection_name") == "'lister'"]
    assert view["user"] == "guest" and view["address"].startswith("127.0.0.1:")
    assert view["details"]["heartbeat_s"] == 300 and view["details"]["vhost"] == "/"
    assert view["subscriptions"] == [queue]  # the queues its consumers read
    kicked = admin_cli(amqp_server, "client", "kick", "amqp", view["client_id"])
    assert kicked.returncode == 0, kicked.stderr
    with pytest.raises(errors.ConnectionClosedByBroker) as closed:
        connection.channel()
    assert closed.value.reply_code == 320


def test_garbage_on_the_port_closes_only_that_connection(amqp_server):
    connection = connect(amqp_server)
    channel = connection.channel()
    host, port = amqp_server.amqp.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as garbage:
        garbage.sendall(b"\x16\x03\x01\x02\x00" + bytes(range(256)))
        answer = b""
        while chunk := garbage.recv(1024):
            answer += chunk
    assert answer == b"AMQP\x00\x00\x09\x01", "the protocol header we speak, then EOF"
    assert channel.queue_declare("", exclusive=True).method.queue
    connection.close()
