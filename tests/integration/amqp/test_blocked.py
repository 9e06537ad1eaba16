"""A full disk under `sluice serve` seen by AMQP clients (pika): the publish that cannot be
stored is nacked, publishing connections get connection.blocked and are no longer read, a
consumer-only connection is not blocked and goes on; once space is freed they get
connection.unblocked and what they sent meanwhile is stored. The data directory is a small
real tmpfs filled by a file, as in tests/integration/test_disk_full.py (skipped where mounting
is not permitted)."""
from __future__ import annotations

import os
import time

import pika
import pika.exceptions as errors
import pytest

from tests.conftest import fill_disk
from tests.integration.amqp.conftest import connect
from tests.integration.test_disk_full import CONFIG, payload

WAIT_S = 30


class Watched:
    """A pika connection that records connection.blocked and connection.unblocked."""

    def __init__(self, server) -> None:
        self.connection = connect(server)
        self.events: list[str] = []
        self.connection.add_on_connection_blocked_callback(
            lambda _c, frame: self.events.append(f"blocked: {frame.method.reason}"))
        self.connection.add_on_connection_unblocked_callback(
            lambda _c, _frame: self.events.append("unblocked"))

    def wait_for(self, count: int) -> list[str]:
        deadline = time.monotonic() + WAIT_S
        while len(self.events) < count and time.monotonic() < deadline:
            self.connection.process_data_events(0.1)
        assert len(self.events) >= count, f"only {self.events} within {WAIT_S} s"
        return self.events


def test_a_full_disk_blocks_publishers_until_space_returns(sluice_server, mount_tmpfs):
    disk = mount_tmpfs("24m")
    server = sluice_server(disk / "data", config=CONFIG)
    server.wait_ready()
    publisher, consumer = Watched(server), Watched(server)
    confirming = publisher.connection.channel()
    confirming.confirm_delivery()
    confirming.queue_declare("disk", durable=True)
    plain = publisher.connection.channel()  # opened now: nothing is read while blocked
    reading = consumer.connection.channel()
    persistent = pika.BasicProperties(delivery_mode=2)
    confirming.basic_publish("", "disk", payload("before"), persistent)

    fill_disk(disk / "filler")
    nacked = None
    for number in range(400):  # the segments prepared beforehand fill first
        try:
            confirming.basic_publish("", "disk", payload(f"while full {number}"), persistent)
        except errors.NackError:
            nacked = number
            break
    assert nacked is not None, "the disk never filled up"
    assert publisher.wait_for(1) == ["blocked: low on disk"]

    plain.basic_publish("", "disk", payload("sent while blocked"), persistent)
    method, _, body = reading.basic_get("disk", auto_ack=True)  # consumers go on
    assert body == payload("before")
    consumer.connection.process_data_events(0)
    assert consumer.events == [], "a connection that never published was blocked"

    os.remove(disk / "filler")
    assert publisher.wait_for(2) == ["blocked: low on disk", "unblocked"]
    confirming.basic_publish("", "disk", payload("after"), persistent)  # acked, or it raises
    bodies = set()
    while (got := reading.basic_get("disk", auto_ack=True))[2] is not None:
        bodies.add(got[2])
    assert {payload("sent while blocked"), payload("after")} <= bodies
    assert plain.is_open, "the publish read after the block was refused"
    publisher.connection.close()
    consumer.connection.close()
