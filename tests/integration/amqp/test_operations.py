"""Operating AMQP on a real `sluice serve`: queue.purge from pika, what the admin API, the CLI
and /metrics list (queues with ready / unacked / consumers / rates, exchanges, bindings,
connections, channels), virtual hosts as separate namespaces, and a deleted virtual host
closing its connections."""
from __future__ import annotations

import json
import urllib.parse
import uuid

import pika
import pika.exceptions as errors
import pytest

from protocols.amqp.mapping import exchange_topic
from sluice.cli import main
from tests.integration.amqp.conftest import connect
from tests.integration.test_admin_api import Http


DEFAULT_TOPIC = urllib.parse.quote(exchange_topic("/", ""), safe="")
"""Where publishes to the default exchange of / are stored."""


def name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def admin(amqp_server) -> Http:
    return Http(amqp_server.admin)


def cli(amqp_server, capsys, *argv: str) -> str:
    assert main([*argv, "--admin", amqp_server.admin]) == 0, capsys.readouterr().err
    return capsys.readouterr().out


def queue_row(admin: Http, queue: str, vhost: str = "/") -> dict:
    status, row, _ = admin("GET", f"/queues/{urllib.parse.quote(vhost, safe='')}/{queue}")
    assert status == 200, row
    return row


def test_purge_settles_the_ready_messages_and_keeps_unacked_ones_and_the_log(amqp_server,
                                                                           admin):
    queue = name("purge")
    with connect(amqp_server) as connection:
        channel = connection.channel()
        channel.queue_declare(queue)
        channel.confirm_delivery()
        for n in range(5):
            channel.basic_publish("", queue, b"m%d" % n)
        held = [channel.basic_get(queue)[0] for _ in range(2)]
        stored = admin("GET", f"/topics/{DEFAULT_TOPIC}")[1]["messages"]
        assert (queue_row(admin, queue)["messages_ready"],
                queue_row(admin, queue)["messages_unacknowledged"]) == (3, 2)
        assert channel.queue_purge(queue).method.message_count == 3
        assert channel.basic_get(queue) == (None, None, None)
        assert admin("GET", f"/topics/{DEFAULT_TOPIC}")[1]["messages"] == stored, \
            "a purge settles; it deletes nothing from the log"
        channel.basic_nack(held[1].delivery_tag, multiple=True, requeue=True)
        again = [channel.basic_get(queue, auto_ack=True) for _ in range(2)]
        assert [(m.redelivered, body) for m, _, body in again] == [(True, b"m0"), (True, b"m1")]
        assert channel.queue_purge(queue).method.message_count == 0


def test_the_admin_api_and_cli_list_queues_exchanges_bindings_and_channels(amqp_server,
                                                                          admin, capsys):
    queue, exchange = name("listed"), name("orders")
    with connect(amqp_server, client_properties={"connection_name": "lister"}) as connection:
        channel = connection.channel()
        channel.exchange_declare(exchange, "topic", durable=True)
        channel.queue_declare(queue, durable=True)
        channel.queue_bind(queue, exchange, "eu.#")
        channel.confirm_delivery()
        for n in range(4):
            channel.basic_publish(exchange, "eu.fr", b"o%d" % n)
        consuming = connection.channel()
        consuming.basic_qos(prefetch_count=1)
        consuming.basic_consume(queue, lambda *a: None)
        while queue_row(admin, queue)["messages_unacknowledged"] < 1:
            connection.process_data_events(time_limit=0.1)

        row = queue_row(admin, queue)
        assert {k: row[k] for k in ("messages_ready", "messages_unacknowledged", "consumers",
                                    "published", "delivered", "durable")} == {
            "messages_ready": 3, "messages_unacknowledged": 1, "consumers": 1, "published": 4,
            "delivered": 1, "durable": True}
        assert row["publish_rate"] >= 0 and row["deliver_rate"] >= 0
        listed = json.loads(cli(amqp_server, capsys, "queue", "list", "--vhost", "/", "--json"))
        assert {q["name"]: q["messages_ready"] for q in listed}[queue] == 3
        assert queue in cli(amqp_server, capsys, "queue", "list")

        exchanges = admin("GET", "/exchanges?vhost=%2F")[1]
        assert {"vhost": "/", "name": exchange, "type": "topic", "durable": True,
                "auto_delete": False, "internal": False, "arguments": {}} in exchanges
        assert exchange in cli(amqp_server, capsys, "exchange", "list")
        bindings = admin("GET", "/bindings")[1]
        assert {"vhost": "/", "source": exchange, "destination": queue,
                "destination_type": "queue", "routing_key": "eu.#", "arguments": {}} in bindings
        assert "eu.#" in cli(amqp_server, capsys, "binding", "list", "--vhost", "/")

        mine = [c for c in admin("GET", "/amqp/connections")[1]
                if c["connection_name"] == "'lister'" or "lister" in c["connection_name"]]
        assert len(mine) == 1 and mine[0]["vhost"] == "/" and mine[0]["user"] == "guest"
        channels = [c for c in admin("GET", "/amqp/channels")[1]
                    if c["connection"] == mine[0]["id"]]
        assert [(c["number"], c["consumers"], c["messages_unacknowledged"], c["prefetch_count"],
                 c["confirm"]) for c in channels] == [(1, 0, 0, 0, True), (2, 1, 1, 1, False)]
        assert mine[0]["id"] in cli(amqp_server, capsys, "channel", "list")

        metrics = admin("GET", "/metrics")[1]
        assert f'sluice_amqp_queue_messages_ready{{queue="{queue}",vhost="/"}} 3.0' in metrics
        assert (f'sluice_amqp_queue_messages_unacknowledged{{queue="{queue}",vhost="/"}} 1.0'
                in metrics)
        assert f'sluice_amqp_queue_consumers{{queue="{queue}",vhost="/"}} 1.0' in metrics
        assert f'sluice_amqp_queue_published_total{{queue="{queue}",vhost="/"}} 4.0' in metrics

        assert "purged 3 messages" in cli(amqp_server, capsys, "queue", "purge", queue)
        assert queue_row(admin, queue)["messages_unacknowledged"] == 1
    assert "deleted queue" in cli(amqp_server, capsys, "queue", "delete", queue)
    assert admin("GET", f"/queues/%2F/{queue}")[0] == 404


def test_virtual_hosts_are_separate_namespaces_with_their_own_permissions(amqp_server, admin,
                                                                         capsys):
    vhost, user = name("shop"), name("clerk")
    assert f"created virtual host {vhost}" in cli(amqp_server, capsys, "vhost", "add", vhost)
    assert vhost in cli(amqp_server, capsys, "vhost", "list")
    assert admin("POST", "/users", {"name": user, "password": "pw"})[0] == 201
    with pytest.raises(errors.ProbableAccessDeniedError):
        connect(amqp_server, user=user, password="pw", vhost=vhost)
    cli(amqp_server, capsys, "vhost", "permit", user, vhost, "--configure", ".*", "--write",
        ".*", "--read", ".*")
    assert user in cli(amqp_server, capsys, "vhost", "permissions", "--vhost", vhost)
    with connect(amqp_server, user=user, password="pw", vhost=vhost) as connection:
        connection.channel().queue_declare("jobs")
    with connect(amqp_server) as connection:  # guest on "/"
        with pytest.raises(errors.ChannelClosedByBroker) as missing:
            connection.channel().queue_declare("jobs", passive=True)
        assert missing.value.reply_code == 404
    assert [q["name"] for q in admin("GET", f"/queues?vhost={vhost}")[1]] == ["jobs"]

    connection = connect(amqp_server, user=user, password="pw", vhost=vhost)
    channel = connection.channel()
    channel.confirm_delivery()
    channel.basic_publish("", "jobs", b"job")  # the vhost's write permission is enough
    shared = connection.channel()
    shared.confirm_delivery()
    with pytest.raises(errors.ChannelClosedByBroker) as refused:  # MQTT's subjects are not
        shared.basic_publish("amq.topic", "devices.d1.telemetry", b"reading")
    assert refused.value.reply_code == 403 and "devices/d1/telemetry" in refused.value.reply_text
    delivered = []
    channel.basic_consume("jobs", lambda *args: delivered.append(args[3]))
    while not delivered:
        connection.process_data_events(time_limit=0.2)
    cli(amqp_server, capsys, "vhost", "delete", vhost)
    with pytest.raises(errors.ConnectionClosedByBroker) as closed:
        while True:
            connection.process_data_events(time_limit=0.2)
    assert closed.value.reply_code == 320
    assert vhost not in {v["name"] for v in admin("GET", "/vhosts")[1]}
    assert admin("GET", f"/vhost-permissions?user={user}")[1] == []
    cli(amqp_server, capsys, "vhost", "add", vhost)  # the same name again starts empty
    assert admin("GET", f"/queues?vhost={vhost}")[1] == []
    with connect(amqp_server, vhost=vhost) as connection:
        with pytest.raises(errors.ChannelClosedByBroker) as missing:
            connection.channel().queue_declare("jobs", passive=True)
        assert missing.value.reply_code == 404


def test_a_priority_queue_is_listed_and_purged_over_all_its_levels(amqp_server, admin):
    queue = name("urgent")
    with connect(amqp_server) as connection:
        channel = connection.channel()
        channel.queue_declare(queue, arguments={"x-max-priority": 5})
        channel.confirm_delivery()
        for priority in (0, 3, 5, 9):
            channel.basic_publish("", queue, b"p%d" % priority,
                                  pika.BasicProperties(priority=priority))
        row = queue_row(admin, queue)
        assert (row["messages_ready"], row["published"]) == (4, 4)
        assert channel.queue_purge(queue).method.message_count == 4
        assert queue_row(admin, queue)["messages_ready"] == 0
        channel.queue_delete(queue)
