"""Hypothesis against the MQTT WebSocket listener's parsers (aiohttp's HTTP upgrade parser and
frame decoder, behind `start_websocket_listener`) over real loopback sockets: a mutated upgrade
request, or a valid upgrade followed by mutated frames, is answered or closed within a bound,
nothing but the connection's own handler sees the bytes, no error is logged, and the listener
goes on serving."""
from __future__ import annotations

import asyncio
import logging
import os
import random

import aiohttp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocols.mqtt.websocket import start_websocket_listener
from tests.fuzz.mutations import mutate
from tests.unit.mqtt.test_websocket import Handlers

UPGRADE = ("GET /mqtt HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
           "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
           "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: mqtt\r\n\r\n")
ANSWER_WITHIN = 0.5
"""How long the reply to a hostile request is read; a partial frame may rightly be waited for."""


def frame(payload: bytes, opcode: int = 0x2, fin: bool = True) -> bytes:
    """A masked client frame (RFC 6455 5.2)."""
    head = bytes([(0x80 if fin else 0) | opcode])
    n = len(payload)
    if n < 126:
        head += bytes([0x80 | n])
    elif n < 65_536:
        head += bytes([0x80 | 126]) + n.to_bytes(2, "big")
    else:
        head += bytes([0x80 | 127]) + n.to_bytes(8, "big")
    mask = os.urandom(4)
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def hostile_bytes(seed: int, port: int) -> tuple[bytes, bool]:
    """(what to send, whether it starts with a valid upgrade)."""
    rng = random.Random(seed)
    upgrade = UPGRADE.format(port=port).encode()
    if rng.random() < 0.4:
        return mutate(seed, base=upgrade, max_size=16 << 10), False
    frames = b"".join(frame(mutate(seed + i), rng.choice((0x0, 0x1, 0x2, 0x8, 0x9, 0xA, 0x3)),
                            rng.random() < 0.8) for i in range(rng.randint(1, 3)))
    if rng.random() < 0.5:
        frames = mutate(seed, base=frames, max_size=64 << 10)
    return upgrade + frames, True


async def _attack(seed: int, errors: list[str]) -> None:
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _loop, context: errors.append(str(context.get("message"))))
    listener = await start_websocket_listener(Handlers(), "127.0.0.1", 0)
    try:
        data, _ = hostile_bytes(seed, listener.port)
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
def test_hostile_upgrade_requests_and_frames_leave_the_listener_serving(seed):
    errors: list[str] = []
    logged = _Errors()
    logging.getLogger().addHandler(logged)
    try:
        asyncio.run(asyncio.wait_for(_attack(seed, errors), 30))
    finally:
        logging.getLogger().removeHandler(logged)
    assert errors == [] and logged.records == [], (errors, logged.records)
