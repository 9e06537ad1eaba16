"""`sluice simulate`: a fleet of IoT devices publishing JSON telemetry over MQTT.

Each device has its own baseline temperature, humidity and battery level. Readings drift (a
random walk), carry noise, drop out for a while now and then (gaps), and are sometimes spikes
(anomalies, flagged in the payload's ``anomaly`` field only for checking, never used by jobs).
Devices publish on ``devices/<id>/telemetry`` through one MQTT 3.1.1 connection, paced at
``rate`` messages per second (0: as fast as the broker acknowledges), QoS 0 or 1.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from protocols.mqtt.codec import MQTT_311, Decoder, encode
from protocols.mqtt.packets import ConnAck, Connect, PubAck, Publish

WINDOW = 256
"""QoS 1 publishes in flight at once."""


@dataclass
class Device:
    """One simulated device and where its readings stand."""

    name: str
    temperature: float
    humidity: float
    battery: float
    offline_until: int = 0


@dataclass(frozen=True)
class FleetModel:
    """How readings behave. Probabilities are per reading."""

    drift: float = 0.05
    noise: float = 0.3
    gap_probability: float = 0.002
    gap_readings: int = 50
    anomaly_probability: float = 0.001
    anomaly_size: float = 25.0
    battery_drain: float = 0.002


class Fleet:
    """Readings of ``devices`` devices, round-robin, deterministic for a given ``seed``."""

    def __init__(self, devices: int, seed: int = 1, model: FleetModel = FleetModel()) -> None:
        self.random = random.Random(seed)
        self.model = model
        self.devices = [Device(f"d{i:05d}", self.random.uniform(15, 30), self.random.uniform(30, 70),
                               self.random.uniform(60, 100)) for i in range(devices)]
        self.tick = 0

    def readings(self, now_ms: Callable[[], int]) -> Iterator[tuple[str, bytes]]:
        """Endless (topic, JSON payload) pairs; a device in a gap is skipped."""
        rand, model = self.random, self.model
        while True:
            for device in self.devices:
                self.tick += 1
                if device.offline_until > self.tick:
                    continue
                if rand.random() < model.gap_probability:
                    device.offline_until = self.tick + model.gap_readings * len(self.devices)
                    continue
                device.temperature += rand.gauss(0, model.drift)
                device.humidity = min(100.0, max(0.0, device.humidity + rand.gauss(0, model.drift)))
                device.battery = max(0.0, device.battery - rand.uniform(0, model.battery_drain))
                temperature = device.temperature + rand.gauss(0, model.noise)
                anomaly = rand.random() < model.anomaly_probability
                if anomaly:
                    temperature += rand.choice((-1, 1)) * model.anomaly_size
                payload = {"device": device.name, "ts": now_ms(), "temperature": round(temperature, 2),
                           "humidity": round(device.humidity + rand.gauss(0, model.noise), 2),
                           "battery": round(device.battery, 2), "anomaly": anomaly}
                yield f"devices/{device.name}/telemetry", json.dumps(payload).encode()


async def simulate(host: str, port: int, username: str, password: str, *, devices: int,
                   count: int, rate: float, qos: int, seed: int = 1,
                   progress: Callable[[int], None] | None = None) -> int:
    """Publish ``count`` readings (0: until cancelled); return how many were acknowledged
    (QoS 1) or sent (QoS 0)."""
    reader, writer = await asyncio.open_connection(host, port)
    decoder = Decoder(MQTT_311)
    writer.write(encode(Connect(f"sluice-simulator-{seed}", keep_alive=60, username=username,
                                password=password.encode()), MQTT_311))
    connack = await _next_packet(reader, decoder)
    if not isinstance(connack, ConnAck) or connack.reason_code != 0:
        raise ConnectionError(f"the broker refused the simulator: {connack}; check --user/--password")
    fleet = Fleet(devices, seed)
    readings = fleet.readings(lambda: int(time.time() * 1000))
    in_flight: set[int] = set()
    done = 0
    started = time.monotonic()
    for number in range(count) if count else itertools.count():
        topic, payload = next(readings)
        packet_id = number % 0xFFFF + 1 if qos else None
        writer.write(encode(Publish(topic, payload, qos, packet_id=packet_id), MQTT_311))
        if qos:
            in_flight.add(packet_id)
            while len(in_flight) >= WINDOW:
                done += await _take_acks(reader, decoder, in_flight)
        else:
            done += 1
        if rate:
            delay = started + (number + 1) / rate - time.monotonic()
            if delay > 0:
                await writer.drain()
                await asyncio.sleep(delay)
        if progress is not None and (number + 1) % 10_000 == 0:
            progress(number + 1)
    await writer.drain()
    while in_flight:
        done += await _take_acks(reader, decoder, in_flight)
    writer.write(b"\xe0\x00")  # DISCONNECT
    await writer.drain()
    writer.close()
    return done


async def _take_acks(reader: asyncio.StreamReader, decoder: Decoder, in_flight: set[int]) -> int:
    packet = await _next_packet(reader, decoder)
    if isinstance(packet, PubAck):
        in_flight.discard(packet.packet_id)
        return 1
    return 0


async def _next_packet(reader: asyncio.StreamReader, decoder: Decoder):
    while (packet := decoder.next_packet()) is None:
        data = await reader.read(65536)
        if not data:
            raise ConnectionError("the broker closed the connection")
        decoder.feed(data)
    return packet
