"""MQTT over WebSocket refuses browser pages of other origins and closes connections that send
no request in time: a real aiohttp client against `start_websocket_listener` on 127.0.0.1,
and `origin_allowed` on its own."""
from __future__ import annotations

import asyncio

import aiohttp
import pytest

from protocols.mqtt.websocket import origin_allowed, parse_origins, start_websocket_listener
from tests.unit.mqtt.test_websocket import Handlers, run

ALLOWED = parse_origins("https://app.example.com, http://localhost:3000/")


async def upgrade_status(origin: str | None, *, allowed: str = "", host: str | None = None) -> int:
    """The status of an upgrade request carrying ``origin`` (101 when it was accepted)."""
    listener = await start_websocket_listener(Handlers(), "127.0.0.1", 0,
                                              allowed_origins=parse_origins(allowed))
    headers = {} if origin is None else {"Origin": origin}
    if host is not None:
        headers["Host"] = host
    try:
        async with aiohttp.ClientSession() as session:
            try:
                async with session.ws_connect(f"ws://127.0.0.1:{listener.port}/mqtt",
                                              protocols=("mqtt",), headers=headers):
                    return 101
            except aiohttp.WSServerHandshakeError as refused:
                return refused.status
    finally:
        await listener.stop()


@pytest.mark.parametrize("origin, allowed, status", [
    (None, "", 101),                                   # not a browser: devices, tools
    ("https://evil.example", "", 403),                 # another site's page
    ("null", "", 403),                                 # a sandboxed or file:// page
    ("https://app.example.com", "https://app.example.com", 101),
    ("https://APP.example.com/", "https://app.example.com", 101),
    ("https://evil.example", "https://app.example.com", 403),
    ("https://evil.example", "*", 101),
], ids=["no-origin", "cross-site", "null", "allowed", "allowed-normalised", "not-listed", "star"])
def test_only_same_origin_and_allowed_origins_may_upgrade(origin, allowed, status):
    async def test() -> None:
        assert await upgrade_status(origin, allowed=allowed) == status
    run(test)


def test_a_page_served_from_the_listener_itself_may_upgrade():
    """Same origin: the Origin's host and port are the Host header's (the page came from the
    address the browser is talking to)."""
    async def test() -> None:
        assert await upgrade_status("http://mqtt.example:8083", host="mqtt.example:8083") == 101
        assert await upgrade_status("http://mqtt.example", host="mqtt.example") == 101
        assert await upgrade_status("http://mqtt.example:9999", host="mqtt.example:8083") == 403
        assert await upgrade_status("https://mqtt.example:8083", host="mqtt.example:8084") == 403
    run(test)


@pytest.mark.parametrize("origin, host, secure, expected", [
    ("http://a.example:8083", "a.example:8083", False, True),
    ("https://a.example", "a.example", True, True),
    ("https://a.example", "a.example", False, False),   # 443 is not the plain listener's 80
    ("http://[::1]:8083", "[::1]:8083", False, True),
    ("http://a.example:notaport", "a.example:8083", False, False),
    ("ftp://a.example:8083", "a.example:8083", False, False),
    ("http://a.example:8083", None, False, False),
    ("http://a.example:8083", "[bad", False, False),
    ("https://app.example.com", "elsewhere", False, True),  # listed
    ("http://localhost:3000", "elsewhere", False, True),    # listed with a trailing slash
])
def test_origin_allowed(origin, host, secure, expected):
    assert origin_allowed(origin, host, secure, ALLOWED) is expected


def test_connections_without_a_whole_request_are_closed_after_the_timeout():
    """A silent connection and one that stops half-way through its headers are closed once
    ``request_timeout`` passes (aiohttp alone waits for a first request for ever); one that
    upgraded in time stays open."""
    async def test() -> None:
        listener = await start_websocket_listener(Handlers(), "127.0.0.1", 0, request_timeout=0.5)
        try:
            silent = await asyncio.open_connection("127.0.0.1", listener.port)
            partial = await asyncio.open_connection("127.0.0.1", listener.port)
            partial[1].write(b"GET /mqtt HTTP/1.1\r\nHost: x\r\n")
            async with aiohttp.ClientSession() as session:
                async with session.ws_connect(f"ws://127.0.0.1:{listener.port}/mqtt",
                                              protocols=("mqtt",)) as ws:
                    for reader, writer in (silent, partial):
                        assert await asyncio.wait_for(reader.read(), 3) == b""
                        writer.close()
                    await ws.send_bytes(b"\xc0\x00")
                    assert await ws.receive_bytes(timeout=5) == b"\xc0\x00"
        finally:
            await listener.stop()
    run(test)
