"""The memory alarm under `sluice serve` seen by AMQP clients (pika): the broker's watermark is
set a little above its resident memory; a connection holding tens of MiB of published bodies in
an open transaction pushes the broker above it, so a publishing connection gets
connection.blocked ("low on memory") and its publish is not read, while a consumer goes on and
/health and /metrics say so. The holding connection is blocked too; its client gives up
(pika's blocked-connection timeout drops the socket), the broker notices through its
heartbeats and drops the transaction, memory falls back below the mark, the publisher gets
connection.unblocked and its held publish is stored and confirmed."""
from __future__ import annotations

import json
import os
import threading
import urllib.error
import urllib.request

import pika
import pika.exceptions as errors

from tests.conftest import Server
from tests.integration.amqp.conftest import connect, parameters
from tests.integration.amqp.test_blocked import Watched

MIB = 1 << 20
BODY = 4 * MIB  # bodies of 1 MiB or more are mmap'd, so glibc returns them at once when freed
HELD = 12  # bodies in the open transaction: 48 MiB
ABOVE = 28 * MIB  # the watermark above the broker's resident memory after start
WAIT_S = 60


def resident(server: Server) -> int:
    with open(f"/proc/{server.process.pid}/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def admin(server: Server, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"{server.admin}{path}", timeout=WAIT_S) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def hold_memory(server: Server, ended: list[BaseException]) -> None:
    """Publish ``HELD`` large bodies in a transaction never committed, then wait until the
    connection ends: pika drops it after being blocked for 3 s."""
    settings = parameters(server, heartbeat=2)
    settings.blocked_connection_timeout = 3
    connection = pika.BlockingConnection(settings)
    try:
        channel = connection.channel()
        channel.tx_select()
        for number in range(HELD):
            channel.basic_publish("", "memory", bytes([number]) * BODY)
        while connection.is_open:
            connection.process_data_events(1)
    except (errors.ConnectionBlockedTimeout, errors.AMQPConnectionError) as error:
        ended.append(error)


def test_memory_above_the_watermark_blocks_publishers_until_it_is_freed(sluice_server, tmp_path):
    (tmp_path / "probe").mkdir()
    probe = sluice_server(tmp_path / "probe" / "data")
    probe.wait_ready()
    watermark = resident(probe) + ABOVE
    probe.kill()
    fraction = watermark / (os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    config = f'[auth]\ndefault_password = "sluice"\n[core]\nmemory_high_watermark = {fraction!r}\n'
    server = sluice_server(tmp_path / "data", config=config)
    server.wait_ready()
    assert admin(server, "/health")[0] == 200

    publisher, consumer = Watched(server), connect(server)
    confirming = publisher.connection.channel()
    confirming.confirm_delivery()
    confirming.queue_declare("memory")
    confirming.basic_publish("", "memory", b"before")  # a publisher now; acked, or it raises
    reading = consumer.channel()

    ended: list[BaseException] = []
    holder = threading.Thread(target=hold_memory, args=(server, ended), daemon=True)
    holder.start()
    assert publisher.wait_for(1) == ["blocked: low on memory"]
    status, body = admin(server, "/health")
    assert status == 503 and json.loads(body)["memory"]["alarm"] is True, body
    assert "sluice_memory_alarm 1.0" in admin(server, "/metrics")[1]
    assert reading.basic_get("memory", auto_ack=True)[2] == b"before"  # consumers go on

    confirmed = threading.Event()

    def publish_held() -> None:
        confirming.basic_publish("", "memory", b"held")  # returns once confirmed
        confirmed.set()

    sender = threading.Thread(target=publish_held, daemon=True)
    sender.start()
    holder.join(WAIT_S)
    assert not holder.is_alive() and ended, "the holding connection did not end"
    # The held publish was sent seconds ago; the broker sees the holder gone only at its next
    # heartbeats (2 s) and then memory at its next check, so the alarm is still on here.
    assert reading.basic_get("memory", auto_ack=True)[2] is None, "a blocked publish was read"
    assert json.loads(admin(server, "/health")[1])["memory"]["alarm"] is True
    assert not confirmed.is_set()
    sender.join(WAIT_S)
    assert confirmed.is_set(), "the held publish was not confirmed"
    publisher.connection.process_data_events(0)  # pika hands over connection events here
    assert publisher.events == ["blocked: low on memory", "unblocked"]
    assert reading.basic_get("memory", auto_ack=True)[2] == b"held"
    assert admin(server, "/health")[0] == 200
    assert "sluice_memory_alarm 0.0" in admin(server, "/metrics")[1]
    publisher.connection.close()
    consumer.close()
