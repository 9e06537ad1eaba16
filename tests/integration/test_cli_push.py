"""`sluice push` against a live broker: a subscription created from the command line delivers an
MQTT 5 CloudEvent to a local HTTP receiver, which verifies its Standard Webhooks signature;
list, show, pause, resume and delete answer as the CLI prints them."""
from __future__ import annotations

import asyncio
import queue
import re
import subprocess
import threading
from collections.abc import Iterator

import paho.mqtt.client as mqtt
import pytest
from aiohttp import web
from cloudevents.core.bindings import http
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProperties
from standardwebhooks import Webhook

from tests.conftest import SLUICE, clean_env
from tests.integration.mqtt.test_robustness import PahoClient


WAIT_S = 60


class Receiver:
    """An aiohttp endpoint on 127.0.0.1 (port 0) in its own thread; what it got, in a queue."""

    def __init__(self) -> None:
        self.requests: queue.Queue[tuple[dict[str, str], bytes]] = queue.Queue()
        self.url = ""
        self._ready = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        assert self._ready.wait(WAIT_S), "the receiver did not start"

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_post("/", self._take)
        self._runner = web.AppRunner(app)
        self._loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        self._loop.run_until_complete(site.start())
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}/"
        self._ready.set()
        self._loop.run_forever()

    async def _take(self, request: web.Request) -> web.Response:
        self.requests.put((dict(request.headers), await request.read()))
        return web.Response(status=204)

    def next(self) -> tuple[dict[str, str], bytes]:
        try:
            return self.requests.get(timeout=WAIT_S)
        except queue.Empty:
            raise AssertionError(f"the receiver got nothing within {WAIT_S} s") from None

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(WAIT_S)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(WAIT_S)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    found = Receiver()
    yield found
    found.stop()


def push(server, *argv: str) -> subprocess.CompletedProcess:
    done = subprocess.run([*SLUICE, "push", *argv, "--admin", server.admin], capture_output=True,
                          text=True, env=clean_env(), timeout=WAIT_S)
    assert done.returncode == 0, done.stderr
    return done


def publish_cloudevent(server, topic: str, body: bytes) -> None:
    publisher = PahoClient(server.mqtt, "push-cli-publisher", version=mqtt.MQTTv5)
    properties = PahoProperties(PacketTypes.PUBLISH)
    properties.UserProperty = [("specversion", "1.0"), ("id", "1"), ("source", "/sensors/t1"),
                               ("type", "com.example.reading")]
    properties.ContentType = "application/json"
    info = publisher.client.publish(topic, body, 1, properties=properties)
    info.wait_for_publish(WAIT_S)
    assert info.is_published(), "no PUBACK"
    publisher.stop()


def test_a_subscription_made_with_the_cli_delivers_a_signed_cloudevent(sluice_server, tmp_path,
                                                                       receiver):
    server = sluice_server(tmp_path / "data", env={"SLUICE_PUSH_ALLOWED_SINKS": "127.0.0.0/8"})
    server.wait_ready()
    created = push(server, "create", "fn", "--topic", "sensors", "--sink", receiver.url,
                   "--format", "binary", "--filter", '{"prefix": {"type": "com.example."}}')
    secret = re.search(r"signing secret: (whsec_\S+)", created.stdout).group(1)
    assert "not shown again" in created.stdout

    publish_cloudevent(server, "sensors/t1", b'{"temp":21}')
    headers, body = receiver.next()
    Webhook(secret).verify(body, {k.lower(): v for k, v in headers.items()})
    event = http.from_http_event(http.HTTPMessage(headers=headers, body=body))
    assert (event.get_id(), event.get_source(), event.get_type()) == (
        "1", "/sensors/t1", "com.example.reading")
    assert event.get_data() == {"temp": 21}

    listed = push(server, "list").stdout.splitlines()
    assert listed[0].split()[:5] == ["NAME", "SOURCE", "SINK", "FORMAT", "STATE"]
    assert listed[1].split()[:4] == ["fn", "sensors", receiver.url, "binary"]
    assert "signing secret" not in push(server, "show", "fn").stdout
    push(server, "pause", "fn")
    assert "paused" in push(server, "show", "fn").stdout
    push(server, "resume", "fn")
    push(server, "delete", "fn")
    assert "no push subscriptions" in push(server, "list").stdout
