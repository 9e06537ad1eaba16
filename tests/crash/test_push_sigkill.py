"""SIGKILL `sluice serve` while a push subscription has requests in flight: after the restart
every event reaches the receiver at least once, and the repeats are only what was in flight.

The receiver answers the first events (slowly), then holds every further request unanswered,
so at the kill exactly ``CONCURRENCY`` requests are in flight and nothing is acknowledged after
the last answer. The kill happens on events (answers counted, requests held, and every answered
event's acknowledgement in the offsets the broker saved), not on a timer.
"""
from __future__ import annotations

import asyncio
import base64
import json
import threading
import urllib.request
from collections import Counter

import paho.mqtt.client as mqtt
import pytest
from aiohttp import web
from paho.mqtt.enums import CallbackAPIVersion
from standardwebhooks import Webhook

from core.cursors import CursorBook
from tests.integration.push_receiver import Receiver, Seen
from tests.waiting import wait_for

pytestmark = pytest.mark.crash

EVENTS = 120
ANSWERED_BEFORE_KILL = 40
CONCURRENCY = 4
COMMIT_INTERVAL_MS = 100
ENV = {"SLUICE_PUSH_ALLOWED_SINKS": "127.0.0.0/8",
       "SLUICE_CORE_OFFSET_COMMIT_INTERVAL_MS": str(COMMIT_INTERVAL_MS)}
WAIT_S = 120
GROUP = "%PUSH%hook"


def admin(url: str, path: str, body: dict) -> dict:
    token = base64.b64encode(b"sluice:sluice").decode()
    request = urllib.request.Request(url + path, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json",
                                              "Authorization": f"Basic {token}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def publish(address: str, count: int) -> None:
    host, port = address.rsplit(":", 1)
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="pusher")
    client.username_pw_set("sluice", "sluice")
    client.connect(host, int(port), keepalive=60)
    client.loop_start()
    try:
        for n in range(count):
            client.publish(f"events/e{n}", b"e-%d" % n, qos=1).wait_for_publish(WAIT_S)
    finally:
        client.disconnect()
        client.loop_stop()


def saved_acks(data_dir) -> int:
    """Events of topic ``events`` the subscription's group acknowledged, as the offsets saved
    in ``data_dir`` say (what a restart reads); the topic's queues start at offset 0."""
    return sum(cursor.committed + len(cursor.acked)
               for (consumer, topic, _), cursor in CursorBook(str(data_dir)).cursors.items()
               if consumer == GROUP and topic == "events")


class Gate:
    """Answers the first ``ANSWERED_BEFORE_KILL`` requests, then holds the rest until opened."""

    def __init__(self) -> None:
        self.answered = 0
        self.held = 0
        self.open = False
        self._lock = threading.Lock()
        self._opened: asyncio.Event | None = None
        """Set on the receiver's loop when the gate opens; made there by the first held request."""

    def release(self, receiver: Receiver) -> None:
        """Open the gate: answer every request from now on, held ones included."""
        with self._lock:
            self.open = True
        receiver.loop.call_soon_threadsafe(lambda: self._event().set())

    def _event(self) -> asyncio.Event:
        if self._opened is None:
            self._opened = asyncio.Event()
            if self.open:
                self._opened.set()
        return self._opened

    async def __call__(self, seen: Seen, _: int) -> web.StreamResponse:
        with self._lock:
            take = self.open or self.answered < ANSWERED_BEFORE_KILL
            if take:
                self.answered += 1
            else:
                self.held += 1
        if not take:
            await self._event().wait()
            return web.Response(status=503)  # its broker is gone; nobody reads this
        await asyncio.sleep(0.01)
        return web.Response(status=204)


def test_every_event_reaches_the_receiver_after_sigkill(sluice_server, tmp_path):
    gate = Gate()
    receiver = Receiver(gate)
    server = sluice_server(tmp_path / "data", "--flush", "sync", env=ENV)
    try:
        server.wait_ready()
        publish(server.mqtt, EVENTS)
        created = admin(server.admin, "/push-subscriptions", {
            "name": "hook", "topic": "events", "sink": receiver.url,
            "concurrency": CONCURRENCY, "timeout_ms": 60_000})
        wait_for(lambda: gate.held >= CONCURRENCY, "every worker holding a request", WAIT_S,
                 lambda: (gate.answered, gate.held))
        wait_for(lambda: saved_acks(tmp_path / "data") == gate.answered, "every answered "
                 "event acknowledged in the saved offsets", WAIT_S,
                 lambda: (saved_acks(tmp_path / "data"), gate.answered))
        server.kill()  # SIGKILL mid-push: CONCURRENCY requests unanswered

        gate.release(receiver)
        restarted = sluice_server(tmp_path / "data", "--flush", "sync", env=ENV)
        restarted.wait_ready()
        bodies = lambda: Counter(s.body for s in receiver.seen)  # noqa: E731
        wait_for(lambda: len(bodies()) == EVENTS, "every event at the receiver", WAIT_S,
                 lambda: len(bodies()))
        assert set(bodies()) == {b"e-%d" % n for n in range(EVENTS)}
        repeated = {body: n for body, n in bodies().items() if n > 1}
        assert len(repeated) <= CONCURRENCY, repeated
        assert gate.held == CONCURRENCY
        last = receiver.seen[-1]  # signed after the restart with the secret stored encrypted
        Webhook(created["secret"]).verify(last.body, last.headers, json_parse=False)
        restarted.stop()
    finally:
        gate.release(receiver)
        server.kill()
        receiver.stop()
