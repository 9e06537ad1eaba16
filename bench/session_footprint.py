"""What many persistent MQTT sessions cost the broker: descriptors and memory.

``measure`` starts ``sluice serve`` on a fresh data directory, then opens ``count`` persistent
MQTT 3.1.1 sessions (clean session off), each subscribing at QoS 1 to a topic of its own and
disconnecting, ``concurrency`` at a time; then sends one QoS 1 message to each session's topic,
so every session's stored queue is written. It reads the broker's open descriptors
(``/proc/<pid>/fd``) and resident memory (``VmRSS``) before, after the sessions and after the
messages. Open consume-queue files are capped by ``store.max_open_queue_files`` whatever the
number of sessions, so descriptors stay flat while memory grows with the sessions' state.
"""
from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from . import mqtt_wire as wire
from .processes import LOOPBACK
from .sluice_server import serve_process

Log = Callable[[str], None]
PUBLISH_WINDOW = 256


@dataclass(frozen=True)
class Footprint:
    """Descriptors and resident memory of the broker at one moment."""

    descriptors: int
    rss_bytes: int


@dataclass(frozen=True)
class SessionsResult:
    count: int
    start: Footprint
    sessions: Footprint
    messages: Footprint
    open_seconds: float
    publish_seconds: float


def footprint(pid: int) -> Footprint:
    with open(f"/proc/{pid}/status") as status:
        rss = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS:"))
    return Footprint(len(os.listdir(f"/proc/{pid}/fd")), rss)


async def _read_packet(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    first = (await reader.readexactly(1))[0]
    length, multiplier = 0, 1
    while True:
        byte = (await reader.readexactly(1))[0]
        length += (byte & 0x7F) * multiplier
        multiplier *= 128
        if byte < 0x80:
            break
    return first >> 4, await reader.readexactly(length)


async def _expect(reader: asyncio.StreamReader, kind: int) -> bytes:
    packet_type, body = await _read_packet(reader)
    if packet_type != kind:
        raise RuntimeError(f"expected MQTT packet type {kind}, got {packet_type}")
    return body


async def _open_session(port: int, number: int) -> None:
    reader, writer = await asyncio.open_connection(LOOPBACK, port)
    try:
        writer.write(wire.connect(f"footprint-{number}", clean=False))
        body = await _expect(reader, wire.CONNACK)
        if body[1] != 0:
            raise RuntimeError(f"session {number} refused: CONNACK {body[1]}")
        writer.write(wire.subscribe(1, [(f"footprint/{number}", 1)]))
        await _expect(reader, wire.SUBACK)
        writer.write(wire.DISCONNECT_PACKET)
        await writer.drain()
    finally:
        writer.close()


async def _open_sessions(port: int, count: int, concurrency: int, log: Log) -> None:
    numbers = iter(range(count))
    done = 0

    async def worker() -> None:
        nonlocal done
        for number in numbers:
            await _open_session(port, number)
            done += 1
            if done % 10_000 == 0:
                log(f"  {done:,} of {count:,} persistent sessions opened")
    await asyncio.gather(*(worker() for _ in range(concurrency)))


async def _publish_to_each(port: int, count: int) -> None:
    """One QoS 1 message to every session's topic, ``PUBLISH_WINDOW`` unacknowledged at once."""
    reader, writer = await asyncio.open_connection(LOOPBACK, port)
    writer.write(wire.connect("footprint-publisher"))
    await _expect(reader, wire.CONNACK)
    window = asyncio.Semaphore(PUBLISH_WINDOW)
    acked = asyncio.Event()
    remaining = count

    async def read_acks() -> None:
        nonlocal remaining
        while remaining:
            packet_type, _ = await _read_packet(reader)
            if packet_type == wire.PUBACK:
                remaining -= 1
                window.release()
        acked.set()
    reading = asyncio.create_task(read_acks())
    for number in range(count):
        await window.acquire()
        writer.write(wire.publish(f"footprint/{number}", b"x" * 100, 1, number % 65_535 + 1))
    await acked.wait()
    await reading
    writer.close()


def measure(parent: Path, count: int, concurrency: int, log: Log) -> SessionsResult:
    """Open ``count`` persistent sessions and fill each one's queue; the broker's footprint."""
    with serve_process(parent, wait_for=("--mqtt-port",), password=wire.PASSWORD,
                       prefix="sluice-sessions-") as running:
        port = running.ports["--mqtt-port"]
        start = footprint(running.pid)
        began = time.monotonic()
        asyncio.run(_open_sessions(port, count, concurrency, log))
        opened = time.monotonic()
        sessions = footprint(running.pid)
        log(f"  {count:,} sessions in {opened - began:.1f} s; one message to each")
        asyncio.run(_publish_to_each(port, count))
        messages = footprint(running.pid)
        return SessionsResult(count, start, sessions, messages, opened - began,
                              time.monotonic() - opened)
