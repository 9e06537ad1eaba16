"""Fixtures for the native gRPC API: a real broker on an ephemeral port, in-process or as a child.

In-process (``native_broker``, ``native_broker_factory``): a real ``Broker`` over a ``FileStore``
(sync flush) and SQLite metadata in ``tmp_path``, served by ``start_native_server`` on port 0.
The broker and server run on their own event loop in a background thread, so a test can use
blocking clients (the official ``rocketmq`` client, the SDK) directly. Talk to the broker only
through the ``NativeBroker`` helpers, which run on that loop::

    def test_x(native_broker):
        native_broker.create_topic("orders", queues=4)
        native_broker.create_group("g", max_attempts=3, initial_backoff_ms=200)
        config = ClientConfiguration(native_broker.endpoint,
                                     Credentials(native_broker.user, native_broker.password))
        ...
        native_broker.run(lambda broker: broker.receive(SYSTEM, "g", "orders", "c1"))

``native_broker`` uses ``TEST_CORE`` (heartbeat timeout 15 s: the official clients heartbeat every
10 s, so it cannot go lower). For other settings::

    def test_y(native_broker_factory):
        nb = native_broker_factory(core={"max_message_bytes": 1024}, allow_anonymous=True)

As a child process (``native_broker_process``): same broker, started by
``broker_process.py``; the test can ``kill()`` it (SIGKILL), ``pause()``/``resume()`` it
(SIGSTOP/SIGCONT) and ``start()`` it again on the same data directory::

    def test_z(native_broker_process):
        proc = native_broker_process(topics=[("orders", 4)])
        ... proc.endpoint ...
        proc.kill(); proc.start()     # same port when it is still free

Admin credentials for all of them: ``ADMIN_USER`` / ``ADMIN_PASSWORD`` (the RocketMQ access key
and secret key).
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from core.assembly import Core
from core.metadata import MetadataRepository
from core.model import SYSTEM, GroupConfig, MessageType, Principal, RetryPolicy, TopicConfig
from core.service import Broker
from core.settings import CoreConfig
from protocols.mqtt.topics import SYNTAX as MQTT_TOPIC_SYNTAX
from protocols.native.server import NativeServer, start_native_server
from store import FileStore, StoreConfig

ADMIN_USER = "admin"
ADMIN_PASSWORD = "admin-secret"
TEST_CORE = CoreConfig(heartbeat_timeout_ms=15_000)
"""Core settings of the in-process fixture. Heartbeats come every 10 s from the official clients."""
START_TIMEOUT_S = 30


class NativeBroker:
    """A broker and its native server on a private event loop thread."""

    def __init__(self, data_dir: Path, core: CoreConfig, allow_anonymous: bool,
                 anonymous_principal: Principal | None) -> None:
        self.data_dir = data_dir
        self.user, self.password = ADMIN_USER, ADMIN_PASSWORD
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="native-broker", daemon=True)
        self._thread.start()
        self.store: FileStore | None = None
        self.metadata: MetadataRepository | None = None
        self.core: Core | None = None
        self.broker: Broker | None = None
        self.server: NativeServer | None = None
        try:
            self._submit(self._start(core, allow_anonymous, anonymous_principal), START_TIMEOUT_S)
        except BaseException:
            self.close()
            raise

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def endpoint(self) -> str:
        """``host:port`` for ``ClientConfiguration``."""
        return f"127.0.0.1:{self.port}"

    async def _start(self, core: CoreConfig, allow_anonymous: bool,
                     anonymous_principal: Principal | None) -> None:
        self.store = FileStore(str(self.data_dir / "store"), StoreConfig(flush="sync"))
        self.metadata = MetadataRepository.for_data_dir(str(self.data_dir))
        self.core = Core(self.store, self.metadata, str(self.data_dir), core, flush="sync",
                         subject_syntax=MQTT_TOPIC_SYNTAX)
        await self.core.start()
        self.broker = self.core.broker
        await asyncio.to_thread(self.broker.users.create_user, ADMIN_USER, ADMIN_PASSWORD, True)
        self.server = await start_native_server(self.broker, "127.0.0.1", 0,
                                                allow_anonymous=allow_anonymous,
                                                anonymous_principal=anonymous_principal)

    def _submit(self, coro: Awaitable[Any], timeout: float) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def run(self, action: Callable[[Broker], Any], timeout: float = 30) -> Any:
        """Run ``action(broker)`` on the broker's loop; await its result if it is awaitable."""
        async def call() -> Any:
            result = action(self.broker)
            return await result if asyncio.iscoroutine(result) else result
        return self._submit(call(), timeout)

    def create_topic(self, name: str, queues: int = 4,
                     message_type: MessageType = MessageType.NORMAL) -> TopicConfig:
        return self.run(lambda b: b.create_topic(SYSTEM, TopicConfig(name, queues, message_type)))

    def create_group(self, name: str, *, max_attempts: int = 16, initial_backoff_ms: int = 1_000,
                     max_backoff_ms: int = 60_000, fifo: bool = False) -> GroupConfig:
        retry = RetryPolicy(max_attempts=max_attempts, initial_backoff_ms=initial_backoff_ms,
                            max_backoff_ms=max_backoff_ms)
        return self.run(lambda b: b.create_group(SYSTEM, GroupConfig(name, retry=retry, fifo=fifo)))

    def create_user(self, name: str, password: str, admin: bool = False) -> None:
        self.run(lambda b: asyncio.to_thread(b.users.create_user, name, password, admin))

    def close(self) -> None:
        """Stop the server, close broker, store and metadata, stop the loop."""
        async def stop() -> None:
            if self.server is not None:
                await self.server.stop(0)
            if self.core is not None:
                await self.core.close()
            if self.store is not None:
                await asyncio.to_thread(self.store.close)
            if self.metadata is not None:
                self.metadata.close()
        try:
            if self.loop.is_running():
                self._submit(stop(), 30)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)
            if not self._thread.is_alive():
                self.loop.close()


@pytest.fixture
def native_broker_factory(tmp_path: Path) -> Iterator[Callable[..., NativeBroker]]:
    """``factory(core={...CoreConfig overrides}, allow_anonymous=False, anonymous_principal=None)``
    starts a NativeBroker in its own subdirectory of ``tmp_path``; all are closed afterwards."""
    started: list[NativeBroker] = []

    def factory(core: dict[str, Any] | None = None, allow_anonymous: bool = False,
                anonymous_principal: Principal | None = None) -> NativeBroker:
        config = dataclasses.replace(TEST_CORE, **(core or {}))
        broker = NativeBroker(tmp_path / f"broker{len(started)}", config, allow_anonymous,
                              anonymous_principal)
        started.append(broker)
        return broker

    yield factory
    for broker in reversed(started):
        broker.close()


@pytest.fixture
def native_broker(native_broker_factory) -> NativeBroker:
    """A NativeBroker with ``TEST_CORE`` settings, credentials required."""
    return native_broker_factory()


# --- the broker as a child process ---

SCRIPT = Path(__file__).with_name("broker_process.py")
REPO = Path(__file__).resolve().parents[3]


class NativeBrokerProcess:
    """``broker_process.py`` running in a child process over one data directory."""

    def __init__(self, data_dir: Path, setup: dict[str, Any], core: dict[str, Any]) -> None:
        self.data_dir = data_dir
        self.setup, self.core = setup, core
        self.user, self.password = ADMIN_USER, ADMIN_PASSWORD
        self.process: subprocess.Popen | None = None
        self.port = 0
        self.log = data_dir / "broker.log"

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> NativeBrokerProcess:
        """Start (again) on the same data directory and, if one was bound before, the same port."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, str(SCRIPT), "--data-dir", str(self.data_dir), "--port",
                   str(self.port), "--setup", json.dumps(self.setup), "--core", json.dumps(self.core)]
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=log,
                                            env={**os.environ, "PYTHONPATH": str(REPO)})
        ready = _read_line(self.process, START_TIMEOUT_S)
        if not ready.startswith("READY "):
            self.kill()
            raise RuntimeError(f"broker process did not start ({ready!r}); see {self.log}:\n"
                               + self.log.read_text()[-4000:])
        self.port = int(ready.split()[1])
        return self

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(30)
        self._close_pipe()

    def _close_pipe(self) -> None:
        if self.process is not None and self.process.stdout is not None:
            self.process.stdout.close()

    def pause(self) -> None:
        """SIGSTOP: connections stay open, nothing is answered."""
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.process.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        """SIGTERM: a clean shutdown."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()
        self._close_pipe()


def _read_line(process: subprocess.Popen, timeout: float) -> str:
    """The child's first stdout line, or '' if it printed none within ``timeout``."""
    box: list[bytes] = []
    reader = threading.Thread(target=lambda: box.append(process.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    return box[0].decode().strip() if box else ""


@pytest.fixture
def native_broker_process(tmp_path: Path) -> Iterator[Callable[..., NativeBrokerProcess]]:
    """``factory(topics=[(name, queues[, type])], groups=[(name, max_attempts, backoff_ms[, fifo])],
    core={...})`` starts a broker child process; every one is stopped afterwards."""
    started: list[NativeBrokerProcess] = []

    def factory(topics=(), groups=(), core: dict[str, Any] | None = None) -> NativeBrokerProcess:
        setup = {"users": [[ADMIN_USER, ADMIN_PASSWORD, True]],
                 "topics": [[t[0], t[1], (t[2] if len(t) > 2 else MessageType.NORMAL).value] for t in topics],
                 "groups": [[g[0], g[1], g[2], g[3] if len(g) > 3 else False] for g in groups]}
        proc = NativeBrokerProcess(tmp_path / f"process{len(started)}", setup,
                                   {"heartbeat_timeout_ms": TEST_CORE.heartbeat_timeout_ms, **(core or {})})
        started.append(proc)
        return proc.start()

    yield factory
    for proc in started:
        proc.stop()
