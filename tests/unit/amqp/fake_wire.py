"""An AMQP client speaking through a fake `Wire` (tests/unit/fake_wire.py) to a real AMQP front
end over a core on `MemoryStore`, the way tests/unit/mqtt/fake_wire.py drives MQTT.

Frames go in built with pamqp; what the adapter writes back is decoded into (channel, frame).
"""
from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from pamqp import frame as pamqp_frame
from pamqp.base import Frame
from pamqp.commands import Channel, Connection
from pamqp.exceptions import UnmarshalingException

from core.assembly import Core
from core.metadata import MetadataRepository
from core.settings import CoreConfig
from protocols.amqp.adapter import AmqpAdapter
from protocols.amqp.frames import PROTOCOL_HEADER
from protocols.amqp.frontend import AmqpFrontend
from protocols.amqp.options import AmqpOptions
from protocols.mqtt.topics import SYNTAX
from store import MemoryStore
from tests.unit.fake_wire import FakeWire
from tests.unit.amqp.client import method, plain_start_ok

ADMIN, USER, PASSWORD = "ada", "bob", "secret"
TIMEOUT = 5.0


class Client:
    """One AMQP client on a `FakeWire` to ``frontend``."""

    _ports = iter(range(40_000, 60_000))

    def __init__(self, frontend: AmqpFrontend, host: str = "127.0.0.1") -> None:
        self.wire = FakeWire(f"{host}:{next(self._ports)}")
        self.adapter: AmqpAdapter = frontend.new_connection(self.wire)
        self._read = 0
        self._frames: deque[tuple[int, Any]] = deque()

    def send(self, data: bytes) -> None:
        assert self.wire.reading, "the adapter paused reading"
        self.adapter.data_received(data)

    def send_method(self, channel: int, m: Frame) -> None:
        self.send(method(channel, m))

    async def next(self) -> tuple[int, Any]:
        """The next (channel, frame) the server sent; fails after `TIMEOUT` seconds."""
        async with asyncio.timeout(TIMEOUT):
            while not self._decode():
                assert not self.wire.closed, "the connection closed"
                await self.wire.changed()
        return self._frames.popleft()

    async def expect(self, kind: type, channel: int | None = None) -> Any:
        got_channel, value = await self.next()
        assert isinstance(value, kind), f"{kind.__name__} expected, got {value}"
        assert channel is None or got_channel == channel
        return value

    async def login(self, user: str = ADMIN, password: str = PASSWORD,
                    start_ok: bytes | None = None) -> Any:
        """Header and start-ok; the server's answer (tune, or close when refused)."""
        self.send(PROTOCOL_HEADER)
        await self.expect(Connection.Start)
        self.send(start_ok or plain_start_ok(user, password))
        return (await self.next())[1]

    async def open(self, user: str = ADMIN, vhost: str = "/", heartbeat: int = 0,
                   channels: tuple[int, ...] = (1,)) -> None:
        """Log in, tune, open ``vhost`` and ``channels``."""
        tune = await self.login(user)
        assert isinstance(tune, Connection.Tune), tune
        self.send_method(0, Connection.TuneOk(tune.channel_max, tune.frame_max, heartbeat))
        self.send_method(0, Connection.Open(vhost))
        await self.expect(Connection.OpenOk)
        for channel in channels:
            self.send_method(channel, Channel.Open())
            await self.expect(Channel.OpenOk, channel)

    async def call(self, channel: int, m: Frame) -> Any:
        """Send ``m`` and return the next frame (its -ok, or a close)."""
        self.send_method(channel, m)
        return (await self.next())[1]

    async def closed(self) -> list[Any]:
        """Wait until the server closed the wire; the frames it sent until then."""
        async with asyncio.timeout(TIMEOUT):
            while not self.wire.closed:
                await self.wire.changed()
        self._decode()
        frames = [value for _, value in self._frames]
        self._frames.clear()
        return frames

    def _decode(self) -> bool:
        data = bytes(self.wire.written[self._read:])
        while data:
            try:
                used, channel, value = pamqp_frame.unmarshal(data)
            except UnmarshalingException:
                break
            self._frames.append((channel, value))
            self._read += used
            data = data[used:]
        return bool(self._frames)


Scenario = Callable[[AmqpFrontend, Core], Awaitable[None]]


def run(tmp_path, scenario: Scenario, options: AmqpOptions = AmqpOptions(),
        config: CoreConfig = CoreConfig(offset_commit_interval_ms=50)) -> None:
    """Run ``scenario`` against a started AMQP front end over a core on `MemoryStore` with an
    admin ``ADMIN`` and a plain ``USER`` (both with ``PASSWORD``); stop both afterwards."""
    async def main() -> None:
        store = MemoryStore()
        metadata = MetadataRepository.for_data_dir(str(tmp_path))
        core = Core(store, metadata, str(tmp_path), config, subject_syntax=SYNTAX)
        await core.start()
        core.broker.users.create_user(ADMIN, PASSWORD, admin=True)
        core.broker.users.create_user(USER, PASSWORD)
        frontend = AmqpFrontend(core.broker, core.vhosts, core.queues, options,
                                core.vhost_permissions)
        await frontend.start()
        try:
            await scenario(frontend, core)
        finally:
            await frontend.stop()
            await core.close()
            store.close()
            metadata.close()
    asyncio.run(main())
