"""A client speaking MQTT through a fake `Wire` (tests/unit/fake_wire.py) to a real front end,
the way uvicorn's protocol tests drive a protocol through a mock transport.

Packets go in encoded with the codec; what the adapter writes back is decoded with a
client-side `Decoder`. Behind the front end is a real core `Broker` over `MemoryStore`.
"""
from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import replace

from core.metadata import MetadataRepository
from core.assembly import Core
from core.service import Broker
from core.settings import CoreConfig
from protocols.mqtt.adapter import MqttAdapter
from protocols.mqtt.codec import Decoder, encode
from protocols.mqtt.frontend import MqttFrontend
from protocols.mqtt.options import MqttOptions
from protocols.mqtt.packets import Connect, ConnAck, Packet, PingReq, PingResp
from protocols.mqtt.properties import Properties
from protocols.mqtt.topics import SYNTAX
from store import MemoryStore
from tests.unit.fake_wire import FakeWire

USER, PASSWORD = "ada", b"lovelace"
V3, V5 = 4, 5
TIMEOUT = 5.0


class Client:
    """One MQTT client connected to ``frontend`` over a `FakeWire`."""

    _ports = iter(range(40_000, 60_000))

    def __init__(self, frontend: MqttFrontend, version: int = V5) -> None:
        self.version = version
        self.wire = FakeWire(f"127.0.0.1:{next(self._ports)}")
        self.adapter: MqttAdapter = frontend.new_connection(self.wire)
        self._decoder = Decoder(version)
        self._read = 0
        self._packets: deque[Packet] = deque()

    def send(self, *packets: Packet) -> None:
        """Bytes of ``packets`` arrive in one chunk."""
        self.send_bytes(b"".join(encode(p, self.version) for p in packets))

    def send_bytes(self, data: bytes) -> None:
        assert self.wire.reading, "the adapter paused reading"
        self.adapter.data_received(data)

    def drop(self) -> None:
        """The socket is gone without a DISCONNECT."""
        self.adapter.connection_lost()

    async def connect(self, client_id: str = "c1", **connect: object) -> ConnAck:
        """CONNECT (as ``USER`` unless told otherwise) and return the CONNACK."""
        fields = {"client_id": client_id, "username": USER, "password": PASSWORD,
                  "keep_alive": 60, **connect}
        self.send(Connect(**fields))  # type: ignore[arg-type]
        return await self.expect(ConnAck)

    async def next(self) -> Packet:
        """The next packet the server sent; fails after `TIMEOUT` seconds."""
        async with asyncio.timeout(TIMEOUT):
            while not self._decode():
                assert not self.wire.closed or self._read < len(self.wire.written), \
                    "the connection closed"
                await self.wire.changed()
        return self._packets.popleft()

    async def expect(self, kind: type[Packet]) -> Packet:
        packet = await self.next()
        assert isinstance(packet, kind), f"{kind.__name__} expected, got {packet}"
        return packet

    async def settled(self) -> list[Packet]:
        """Every packet sent before the answer to a PINGREQ sent now (not consumed later)."""
        self.send(PingReq())
        before = []
        while not isinstance(packet := await self.next(), PingResp):
            before.append(packet)
        return before

    async def closed(self) -> list[Packet]:
        """Wait until the server closed the connection; the packets it sent until then."""
        async with asyncio.timeout(TIMEOUT):
            while not self.wire.closed:
                await self.wire.changed()
        self._decode()  # the adapter writes everything before it closes
        packets = list(self._packets)
        self._packets.clear()
        return packets

    def _decode(self) -> bool:
        self._decoder.feed(bytes(self.wire.written[self._read:]))
        self._read = len(self.wire.written)
        while (packet := self._decoder.next_packet()) is not None:
            self._packets.append(packet)
        return bool(self._packets)


Scenario = Callable[[MqttFrontend, Broker], Awaitable[None]]


def run(tmp_path, scenario: Scenario, options: MqttOptions = MqttOptions()) -> None:
    """Run ``scenario`` against a started MQTT front end over a core broker on `MemoryStore`
    with one user (``USER``, ``PASSWORD``, an admin); stop both afterwards."""
    async def main() -> None:
        store = MemoryStore()
        metadata = MetadataRepository.for_data_dir(str(tmp_path))
        core = Core(store, metadata, str(tmp_path), CoreConfig(offset_commit_interval_ms=50),
                    subject_syntax=SYNTAX)
        await core.start()
        core.broker.users.create_user(USER, PASSWORD.decode(), admin=True)
        frontend = MqttFrontend(core.broker, core.queues, core.state, options)
        await frontend.start()
        try:
            await scenario(frontend, core.broker)
        finally:
            await frontend.stop()
            await core.close()
            store.close()
            metadata.close()
    asyncio.run(main())


def v5_expiry(seconds: int, **more: object) -> Properties:
    """CONNECT properties asking for a session expiry interval."""
    return replace(Properties(), session_expiry_interval=seconds, **more)
