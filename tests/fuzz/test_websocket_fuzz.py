"""Hypothesis against the MQTT WebSocket listener's parsers (aiohttp's HTTP upgrade parser and
frame decoder, behind `start_websocket_listener`) over real loopback sockets: a mutated upgrade
request, or a valid upgrade followed by mutated frames, is answered or closed within a bound,
nothing but the connection's own handler sees the bytes, no error is logged, and the listener
goes on serving."""
from __future__ import annotations

import asyncio
import logging

import aiohttp
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from protocols.mqtt.websocket import start_websocket_listener
from tests.fuzz.mutations import hostile_websocket
from tests.unit.mqtt.test_websocket import Handlers

ANSWER_WITHIN = 0.5
"""How long the reply to a hostile request is read; a partial frame may rightly be waited for."""


async def _attack(seed: int, errors: list[str]) -> None:
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _loop, context: errors.append(str(context.get("message"))))
    listener = await start_websocket_listener(Handlers(), "127.0.0.1", 0)
    try:
        data = hostile_websocket(seed, f"127.0.0.1:{listener.port}")
        reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)
        writer.write(data)
        try:
            async with asyncio.timeout(ANSWER_WITHIN):
                while await reader.read(65_536):
                    pass
        except TimeoutError:
            pass  # a partial frame is waited for: that is allowed, the check is below
        except ConnectionError:
            pass
        writer.close()
        async with aiohttp.ClientSession() as session:
            async with session.ws_connect(f"ws://127.0.0.1:{listener.port}/mqtt",
                                          protocols=("mqtt",)) as ws:
                await ws.send_bytes(b"\xc0\x00")
                assert await ws.receive_bytes(timeout=5) == b"\xc0\x00"
    finally:
        await listener.stop()


class _Errors(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(self.format(record))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32 - 1))
@example(1_458_019_143)  # a non-ASCII Sec-WebSocket-Key: aiohttp raised ValueError, a 500
def test_hostile_upgrade_requests_and_frames_leave_the_listener_serving(seed):
    errors: list[str] = []
    logged = _Errors()
    logging.getLogger().addHandler(logged)
    try:
        asyncio.run(asyncio.wait_for(_attack(seed, errors), 30))
    finally:
        logging.getLogger().removeHandler(logged)
    assert errors == [] and logged.records == [], (errors, logged.records)
