"""Bounded live fuzzer: hostile MQTT (TCP and WebSocket), AMQP 0-9-1 and native gRPC traffic
against a real `sluice serve`, while healthy MQTT and AMQP clients keep publishing and
receiving.

    python -m tests.fuzz.live_fuzz [--seconds 180] [--seed N] [--concurrency 8]
    make fuzz FUZZ_ARGS='--seconds 30 --seed 7'

It starts the broker on ephemeral ports with a fresh data directory, connects a healthy paho
client that makes QoS 1 round trips and a healthy pika client that makes confirmed publish and
consume round trips the whole time, and from other connections sends mutated valid packets
(`tests/fuzz/mutations.py`: bit flips, truncations, length-field lies, splices, huge counts),
slow drips, hostile WebSocket upgrades and frames, mutated AMQP handshakes and channel frames
(`tests/fuzz/amqp_frames.py`), mutated serialized requests to every native gRPC method, and
forged ``amqp.*``/``mqtt.*``/``sluice.*`` properties with poison values from every protocol
(`tests/fuzz/forged_properties.py`: a native send of them must be refused; an MQTT user property
or AMQP header of such a name is the sender's own, read by the healthy consumers of the other
protocols). Case ``i`` of seed ``s`` is the same bytes on every run (``--case i`` replays one). It fails (exit 1) if the broker dies, a healthy round trip takes
longer than ``--round-trip-bound``, ``/health`` stops answering, the broker's memory or open
descriptors grow beyond their bounds, sockets are not given back once the hostile connections
are gone, or the broker logs an error or a traceback (hostile input is an expected condition);
it prints progress, then a summary: cases by kind and outcome, round
trips, resources, and the errors and tracebacks the broker logged.
"""
from __future__ import annotations

import argparse
import asyncio
import queue
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import grpc
import grpc.aio
import paho.mqtt.client as mqtt
import pika
import psutil
from paho.mqtt.enums import CallbackAPIVersion

from protocols.mqtt.codec import MQTT_5, MQTT_311, encode
from protocols.mqtt.packets import PingReq, Publish, Subscribe, Subscription
from protocols.mqtt.properties import varint
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc

from sluice.client.auth import request_metadata
from sluice.client.config import ClientConfig
from tests.conftest import CONFIG, Server
from tests.fuzz.amqp_frames import handshake as amqp_handshake, session_frames as amqp_frames
from tests.fuzz.mutations import connects, hostile_websocket, mutate, session_packets
from tests.fuzz.forged_properties import amqp_publish, mqtt_publish
from tests.fuzz.native_requests import SERVICE, NativeRequest, send_request, valid_requests

FUZZ_CONFIG = CONFIG + """
[mqtt]
connect_timeout_s = 5.0
[amqp]
connect_timeout_s = 5.0
[core]
# Every mutated credential comes from 127.0.0.1: a ban would keep the fuzzer's valid CONNECTs
# and signed calls from reaching anything past login (the throttle is tested on its own).
login_max_failures_per_peer = 1_000_000
login_max_failures_per_peer_user = 1_000_000
"""
KINDS: dict[str, int] = {"tcp-connect": 2, "tcp-session": 3, "ws-session": 1, "ws-raw": 1,
                         "slow-drip": 1, "huge-count": 1, "grpc": 3, "amqp-connect": 2,
                         "amqp-session": 3, "forged": 2}
"""Case kinds and their weights."""
READ_WINDOW = 1.5
"""How long a case reads what the broker answers before it closes the connection itself."""
CASE_TIMEOUT = 15.0
ACCEPTED_FORGED = "native: forged properties stored"
"""The outcome of a native send with forged namespaced properties that was not refused."""
FORGED_KEYS = ("fuzz.forged.#", "fuzz")
"""What the healthy consumers read of the forged cases' messages (as AMQP binding keys; MQTT
filters ``fuzz/forged/#`` and ``fuzz``)."""


@dataclass
class Settings:
    seconds: float = 180.0
    seed: int = 0
    concurrency: int = 8
    round_trip_bound: float = 5.0
    max_rss_growth_mb: int = 512
    max_fd_growth: int = 512
    progress_every: float = 10.0
    case: int | None = None


@dataclass
class Tally:
    """What happened: outcomes by case kind, and problems that fail the run."""

    outcomes: dict[str, Counter] = field(default_factory=lambda: {k: Counter() for k in KINDS})
    failures: list[str] = field(default_factory=list)
    cases: int = 0

    def record(self, kind: str, outcome: str) -> None:
        self.cases += 1
        self.outcomes[kind][outcome] += 1

    def fail(self, reason: str) -> None:
        if reason not in self.failures:
            self.failures.append(reason)


# ----------------------------------------------------------------------------- healthy client


class HealthyClient(threading.Thread):
    """A paho MQTT 5 client making QoS 1 round trips (publish, then receive it) back to back."""

    def __init__(self, address: str, tally: Tally, bound: float) -> None:
        super().__init__(daemon=True, name="healthy-client")
        self.tally, self.bound = tally, bound
        self.latencies: list[float] = []
        self.stop = threading.Event()
        self._received: queue.Queue[bytes] = queue.Queue()
        self._connected = threading.Event()
        host, port = address.rsplit(":", 1)
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"healthy-{time.time_ns()}",
                                  protocol=mqtt.MQTTv5)
        self.client.username_pw_set("sluice", "sluice")
        self.client.on_connect = lambda *args: self._connected.set()
        self.client.on_message = lambda _c, _u, message: self._received.put(message.payload)
        self.client.connect(host, int(port), keepalive=30)
        self.client.loop_start()
        if not self._connected.wait(10):
            raise RuntimeError("the healthy client could not connect")
        subscribed = threading.Event()
        self.client.on_subscribe = lambda *args: subscribed.set()
        self.client.subscribe([("fuzz-healthy/#", 1), ("fuzz/forged/#", 0), ("fuzz", 0)])
        if not subscribed.wait(10):
            raise RuntimeError("the healthy client could not subscribe")

    def run(self) -> None:
        number = 0
        while not self.stop.is_set():
            number += 1
            payload = f"round trip {number}".encode()
            began = time.monotonic()
            self.client.publish("fuzz-healthy/rt", payload, qos=1)
            deadline = began + self.bound
            while True:
                try:
                    got = self._received.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    self.tally.fail(f"a healthy QoS 1 round trip took longer than {self.bound:g} s "
                                    f"(round trip {number})")
                    return
                if got == payload:
                    break
            self.latencies.append(time.monotonic() - began)

    def close(self) -> None:
        self.stop.set()
        self.join(self.bound + 5)
        self.client.disconnect()
        self.client.loop_stop()


class HealthyAmqpClient(threading.Thread):
    """A pika client publishing with confirms to its own queue and consuming each message back,
    back to back; on the same connection it consumes what the forged cases of every protocol
    store (a queue bound to ``amq.topic``), so a delivery AMQP cannot encode ends its round
    trips."""

    def __init__(self, address: str, tally: Tally, bound: float) -> None:
        super().__init__(daemon=True, name="healthy-amqp-client")
        self.tally, self.bound = tally, bound
        self.latencies: list[float] = []
        self.forged_received = 0
        self.stop = threading.Event()
        self._address = address

    def run(self) -> None:
        host, port = self._address.rsplit(":", 1)
        connection = pika.BlockingConnection(pika.ConnectionParameters(
            host, int(port), "/", pika.PlainCredentials("guest", "guest"),
            connection_attempts=1, socket_timeout=10))
        channel = connection.channel()
        channel.confirm_delivery()
        queue = channel.queue_declare("", exclusive=True).method.queue
        received: list[bytes] = []
        channel.basic_consume(queue, lambda _ch, _m, _p, body: received.append(body),
                              auto_ack=True)
        forged = channel.queue_declare("", exclusive=True).method.queue
        for key in FORGED_KEYS:
            channel.queue_bind(forged, "amq.topic", key)
        channel.basic_consume(forged, self._count_forged, auto_ack=True)
        number = 0
        try:
            while not self.stop.is_set():
                number += 1
                payload = f"amqp round trip {number}".encode()
                began = time.monotonic()
                channel.basic_publish("", queue, payload)  # returns once confirmed
                while payload not in received and time.monotonic() - began < self.bound:
                    connection.process_data_events(0.05)
                if payload not in received:
                    self.tally.fail(f"a healthy AMQP round trip took longer than {self.bound:g} s "
                                    f"(round trip {number})")
                    return
                received.clear()
                self.latencies.append(time.monotonic() - began)
        except pika.exceptions.AMQPError as error:
            self.tally.fail(f"the healthy AMQP client lost its connection: {error!r}")
        finally:
            if connection.is_open:
                connection.close()

    def _count_forged(self, *_delivery: object) -> None:
        self.forged_received += 1

    def close(self) -> None:
        self.stop.set()
        self.join(self.bound + 10)


# ----------------------------------------------------------------------------- broker watch


class Watch(threading.Thread):
    """Once a second: the broker process is alive, /health answers, and its memory and open
    descriptors stay within their bounds of the baseline taken at the start."""

    def __init__(self, server: Server, tally: Tally, settings: Settings) -> None:
        super().__init__(daemon=True, name="watch")
        self.server, self.tally, self.settings = server, tally, settings
        self.process = psutil.Process(server.process.pid)
        self.baseline_rss = self.process.memory_info().rss
        self.baseline_fds = self.process.num_fds()
        self.baseline_sockets = self.sockets = self.open_sockets()
        self.rss = self.peak_rss = self.baseline_rss
        self.fds = self.peak_fds = self.baseline_fds
        self.stop = threading.Event()

    def open_sockets(self) -> int:
        """The broker's descriptors that are sockets (the rest are files and pipes)."""
        fd_dir = Path(f"/proc/{self.process.pid}/fd")
        count = 0
        for fd in fd_dir.iterdir():
            try:
                count += fd.readlink().name.startswith("socket:")
            except OSError:
                pass  # closed meanwhile
        return count

    def run(self) -> None:
        while not self.stop.wait(1.0):
            self.check()

    def check(self) -> None:
        code = self.server.process.poll()
        if code is not None:
            self.tally.fail(f"the broker died (exit code {code})")
            self.stop.set()
            return
        try:
            with urllib.request.urlopen(f"{self.server.admin}/health", timeout=5):
                pass
        except urllib.error.HTTPError as answered:
            if answered.code not in (200, 503):
                self.tally.fail(f"/health answered {answered.code}")
        except OSError as error:
            self.tally.fail(f"/health did not answer: {error}")
        try:
            self.rss, self.fds = self.process.memory_info().rss, self.process.num_fds()
        except psutil.Error:
            return
        self.peak_rss, self.peak_fds = max(self.peak_rss, self.rss), max(self.peak_fds, self.fds)
        grown_mb = (self.rss - self.baseline_rss) >> 20
        if grown_mb > self.settings.max_rss_growth_mb:
            self.tally.fail(f"broker memory grew by {grown_mb} MB (bound "
                            f"{self.settings.max_rss_growth_mb} MB)")
        if self.fds - self.baseline_fds > self.settings.max_fd_growth:
            self.tally.fail(f"broker descriptors grew by {self.fds - self.baseline_fds} "
                            f"(bound {self.settings.max_fd_growth})")


class BrokerLog(threading.Thread):
    """Reads the broker's stderr as it comes (a full pipe would block the broker's logging),
    keeping the error lines and tracebacks, and the last lines for context."""

    def __init__(self, server: Server) -> None:
        super().__init__(daemon=True, name="broker-log")
        self.server = server
        self.errors: list[str] = []
        self.lines = 0
        self.tail: list[str] = []

    def run(self) -> None:
        for line in self.server.follow_log():
            self.lines += 1
            self.tail = [*self.tail[-200:], line]
            if (" ERROR " in line or " CRITICAL " in line or line.startswith("Traceback")) \
                    and len(self.errors) < 1000:
                self.errors.append(line.rstrip())


# ----------------------------------------------------------------------------- cases


@dataclass
class Target:
    """Where the hostile cases go."""

    mqtt: tuple[str, int]
    amqp: tuple[str, int]
    ws_url: str
    native: str
    grpc: grpc.aio.Channel
    native_requests: list[NativeRequest]
    config: ClientConfig


def case_kind(seed: int, index: int) -> str:
    rng = random.Random(f"{seed}:{index}:kind")
    return rng.choices(list(KINDS), weights=list(KINDS.values()))[0]


async def read_answers(reader: asyncio.StreamReader, window: float = READ_WINDOW) -> str:
    """Read until the broker closes the connection or ``window`` passes."""
    try:
        async with asyncio.timeout(window):
            while await reader.read(65_536):
                pass
        return "closed by broker"
    except TimeoutError:
        return "still open"
    except ConnectionResetError:
        return "reset by broker"


async def _open(target: Target) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection(*target.mqtt)


async def _finish(writer: asyncio.StreamWriter) -> None:
    writer.transport.abort()


async def tcp_connect(target: Target, rng: random.Random, seed: int) -> str:
    """A mutated stream from its first byte: CONNECT itself is hostile."""
    reader, writer = await _open(target)
    try:
        writer.write(mutate(seed, max_size=256 << 10))
        return await read_answers(reader)
    finally:
        await _finish(writer)


def _valid_connect(rng: random.Random, version: int) -> bytes:
    return rng.choice(connects(version, f"fuzz-{rng.randrange(64)}"))


def _session_stream(rng: random.Random, version: int) -> bytes:
    packets = session_packets(version, f"fuzz/{rng.randrange(16)}")
    return b"".join(rng.sample(packets, rng.randint(1, len(packets))))


async def tcp_session(target: Target, rng: random.Random, seed: int) -> str:
    """A valid CONNECT, then mutated packets."""
    version = rng.choice((MQTT_311, MQTT_5))
    reader, writer = await _open(target)
    try:
        writer.write(_valid_connect(rng, version))
        await asyncio.wait_for(reader.read(4096), READ_WINDOW)
        writer.write(mutate(seed, version, base=_session_stream(rng, version), max_size=1 << 20))
        return await read_answers(reader)
    finally:
        await _finish(writer)


async def slow_drip(target: Target, rng: random.Random, seed: int) -> str:
    """A CONNECT and mutated packets trickled a few bytes at a time (perhaps never finished)."""
    version = rng.choice((MQTT_311, MQTT_5))
    data = _valid_connect(rng, version) + mutate(seed, version, base=_session_stream(rng, version))
    data = data[:rng.randrange(len(data) + 1)] if rng.random() < 0.3 else data
    reader, writer = await _open(target)
    try:
        for start in range(0, min(len(data), 400), 3):
            writer.write(data[start:start + 3])
            await asyncio.sleep(rng.uniform(0.001, 0.02))  # the drip's pace is the test input
            if reader.at_eof():
                return "closed by broker"
        writer.write(data[400:])
        return await read_answers(reader)
    finally:
        await _finish(writer)


def _huge(rng: random.Random, version: int) -> bytes:
    """A packet with a huge count of something, or announcing a huge size."""
    choice = rng.randrange(5)
    if choice == 0 and version == MQTT_5:
        count = rng.choice((1_000, 100_000))
        body = b"\x26\x00\x00\x00\x00" * count
        payload = b"\x00\x03a/b" + varint(len(body)) + body
        return b"\x30" + varint(len(payload)) + payload
    if choice == 1:
        count = rng.choice((1_000, 20_000))
        return encode(Subscribe(1, tuple(Subscription(f"huge/{i}", 1) for i in range(count))), version)
    if choice == 2:
        return encode(PingReq(), version) * rng.choice((1_000, 50_000))
    if choice == 3:
        return encode(Publish("huge/p", b"x" * rng.choice((1 << 20, 3 << 20))), version)
    return b"\x30" + varint(268_435_455) + b"\x00" * 1024


async def huge_count(target: Target, rng: random.Random, seed: int) -> str:
    version = rng.choice((MQTT_311, MQTT_5))
    reader, writer = await _open(target)
    try:
        writer.write(_valid_connect(rng, version))
        await asyncio.wait_for(reader.read(4096), READ_WINDOW)
        writer.write(_huge(rng, version))
        return await read_answers(reader)
    finally:
        await _finish(writer)


async def ws_session(target: Target, rng: random.Random, seed: int) -> str:
    """MQTT over WebSocket: a valid CONNECT, then mutated packets split over a few frames."""
    version = rng.choice((MQTT_311, MQTT_5))
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(target.ws_url, protocols=("mqtt",)) as ws:
            await ws.send_bytes(_valid_connect(rng, version))
            await ws.receive(timeout=READ_WINDOW)
            data = mutate(seed, version, base=_session_stream(rng, version))
            cuts = sorted(rng.randrange(len(data) + 1) for _ in range(rng.randint(0, 3)))
            for a, b in zip([0, *cuts], [*cuts, len(data)]):
                if a < b:
                    await ws.send_bytes(data[a:b])
            try:
                async with asyncio.timeout(READ_WINDOW):
                    async for _ in ws:
                        pass
                return "closed by broker"
            except TimeoutError:
                return "still open"


async def ws_raw(target: Target, rng: random.Random, seed: int) -> str:
    """Hostile upgrade requests and frames on a plain socket to the WebSocket port."""
    host_port = target.ws_url.split("/")[2]
    host, port = host_port.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(hostile_websocket(seed, host_port))
        return await read_answers(reader)
    finally:
        await _finish(writer)


async def native_call(target: Target, rng: random.Random, seed: int) -> str:
    """A mutated serialized request to one native method, usually signed correctly."""
    request = rng.choice(target.native_requests)
    body = mutate(seed, base=request.body or b"\x00", max_size=256 << 10) \
        if rng.random() < 0.9 else request.body
    metadata = request_metadata(target.config, f"fuzz-{rng.randrange(64)}")
    if rng.random() < 0.1:  # a forged signature or date (printable: gRPC sends nothing else)
        metadata = tuple((k, _printable(mutate(seed, base=v.encode()))[:200])
                         if k in ("authorization", "x-mq-date-time") else (k, v) for k, v in metadata)
    try:
        if request.shape == "unary":
            call = target.grpc.unary_unary(request.path)
            await call(body, metadata=metadata, timeout=3)
        elif request.shape == "server-stream":
            call = target.grpc.unary_stream(request.path)
            async for _ in call(body, metadata=metadata, timeout=3):
                pass
        else:
            call = target.grpc.stream_stream(request.path)
            stream = call(metadata=metadata, timeout=3)
            for _ in range(rng.randint(1, 3)):
                await stream.write(body)
            await stream.done_writing()
            async for _ in stream:
                pass
        return f"{request.method}: OK"
    except grpc.aio.AioRpcError as refused:
        return f"{request.method}: {refused.code().name}"


async def forged(target: Target, rng: random.Random, seed: int) -> str:
    """Forged namespaced properties and poison values from one protocol, unmutated: a native
    send of them must be refused (BAD_REQUEST); native sends of poison under the sender's own
    names, MQTT 5 user properties and AMQP headers named ``amqp.*``/``mqtt.*`` are stored, and
    the healthy consumers of the other protocols receive them."""
    protocol = rng.choice(("native", "native-own", "mqtt", "amqp"))
    if protocol.startswith("native"):
        call = target.grpc.unary_unary(f"/{SERVICE.full_name}/SendMessage")
        metadata = request_metadata(target.config, f"fuzz-{rng.randrange(64)}")
        try:
            raw = await call(send_request(rng, forged=protocol == "native"), metadata=metadata,
                             timeout=3)
        except grpc.aio.AioRpcError as refused:
            return f"{protocol}: {refused.code().name}"
        code = rpc.SendMessageResponse.FromString(raw).status.code
        if protocol == "native" and code == pb.Code.OK:
            return ACCEPTED_FORGED
        return f"{protocol}: {pb.Code.Name(code)}"
    if protocol == "mqtt":
        reader, writer = await _open(target)
        writer.write(mqtt_publish(rng, f"fuzz/forged/{rng.randrange(16)}"))
    else:
        reader, writer = await asyncio.open_connection(*target.amqp)
        writer.write(amqp_publish(rng, f"fuzz.forged.{rng.randrange(16)}"))
    try:
        return f"{protocol}: {await read_answers(reader, 0.5)}"
    finally:
        await _finish(writer)


def _printable(data: bytes) -> str:
    return "".join(chr(b) for b in data if 0x20 <= b < 0x7F)


def _amqp_stream(rng: random.Random) -> bytes:
    """channel.open, then some of the other channel frames in a random order."""
    frames = amqp_frames(f"fuzz-{rng.randrange(16)}")
    return frames[0] + b"".join(rng.sample(frames[1:], rng.randint(1, len(frames) - 1)))


async def amqp_connect(target: Target, rng: random.Random, seed: int) -> str:
    """A mutated AMQP stream from its first byte: the protocol header and handshake are hostile."""
    reader, writer = await asyncio.open_connection(*target.amqp)
    try:
        writer.write(mutate(seed, base=amqp_handshake() + _amqp_stream(rng), max_size=256 << 10))
        return await read_answers(reader)
    finally:
        await _finish(writer)


async def amqp_session(target: Target, rng: random.Random, seed: int) -> str:
    """A valid AMQP handshake, then mutated channel frames (sometimes trickled)."""
    reader, writer = await asyncio.open_connection(*target.amqp)
    try:
        writer.write(amqp_handshake())
        await asyncio.wait_for(reader.read(4096), READ_WINDOW)
        data = mutate(seed, base=_amqp_stream(rng), max_size=1 << 20)
        if rng.random() < 0.2:
            for start in range(0, min(len(data), 300), 7):
                writer.write(data[start:start + 7])
                await asyncio.sleep(rng.uniform(0.001, 0.01))  # the drip's pace is the input
                if reader.at_eof():
                    return "closed by broker"
            data = data[300:]
        writer.write(data)
        return await read_answers(reader)
    finally:
        await _finish(writer)


CASES: dict[str, Callable[[Target, random.Random, int], Awaitable[str]]] = {
    "tcp-connect": tcp_connect, "tcp-session": tcp_session, "ws-session": ws_session,
    "ws-raw": ws_raw, "slow-drip": slow_drip, "huge-count": huge_count, "grpc": native_call,
    "amqp-connect": amqp_connect, "amqp-session": amqp_session, "forged": forged,
}


async def run_case(target: Target, seed: int, index: int) -> tuple[str, str]:
    """(kind, outcome) of case ``index``; the same bytes for the same (seed, index)."""
    kind = case_kind(seed, index)
    case_seed = random.Random(f"{seed}:{index}").randrange(2**32)
    rng = random.Random(case_seed)
    try:
        outcome = await asyncio.wait_for(CASES[kind](target, rng, case_seed), CASE_TIMEOUT)
    except TimeoutError:
        outcome = "case timed out"
    except (ConnectionError, aiohttp.ClientError, OSError) as error:
        outcome = f"connection error: {type(error).__name__}"
    return kind, outcome


# ----------------------------------------------------------------------------- run


async def fuzz(server: Server, settings: Settings, tally: Tally,
               progress: Callable[[float], None]) -> None:
    config = ClientConfig(server.native, "sluice", "sluice")
    async with grpc.aio.insecure_channel(server.native) as channel:
        target = Target(_host_port(server.mqtt), _host_port(server.amqp), server.mqtt_ws,
                        server.native, channel,
                        valid_requests(config), config)
        if settings.case is not None:
            kind, outcome = await run_case(target, settings.seed, settings.case)
            tally.record(kind, outcome)
            return
        began = time.monotonic()
        next_index = 0

        async def worker() -> None:
            nonlocal next_index
            while time.monotonic() - began < settings.seconds and not tally.failures:
                index, next_index = next_index, next_index + 1
                kind, outcome = await run_case(target, settings.seed, index)
                tally.record(kind, outcome)

        async def report() -> None:
            while True:
                await asyncio.sleep(settings.progress_every)
                progress(time.monotonic() - began)

        reporter = asyncio.create_task(report())
        await asyncio.gather(*(worker() for _ in range(settings.concurrency)))
        reporter.cancel()


def _host_port(address: str) -> tuple[str, int]:
    host, port = address.rsplit(":", 1)
    return host, int(port)


def _stop(server: Server, tally: Tally) -> None:
    """Stop the broker; one that cannot stop in 30 s is a failure, and is asked for the stacks
    of its threads and tasks (they appear in its log) before it is killed."""
    if server.process.poll() is not None:
        return
    server.process.terminate()
    try:
        server.process.wait(30)
    except subprocess.TimeoutExpired:
        tally.fail("the broker did not stop within 30 s of SIGTERM")
        for signum in (signal.SIGUSR1, signal.SIGUSR2):
            server.process.send_signal(signum)
        time.sleep(2)  # let it write the stacks it was asked for before it is killed
        server.kill()


def main(argv: list[str] | None = None) -> int:
    settings = parse_args(argv)
    if settings.case is not None:
        print(f"live fuzz: replaying case {settings.case} of seed {settings.seed}", flush=True)
    else:
        print(f"live fuzz: seed {settings.seed} (rerun with --seed {settings.seed}), "
              f"{settings.seconds:g} s, {settings.concurrency} hostile connections at once",
              flush=True)
    workdir = Path(tempfile.mkdtemp(prefix="sluice-fuzz-"))
    tally = Tally()
    server = Server(workdir / "data", config=FUZZ_CONFIG)
    try:
        server.wait_ready()
        log = BrokerLog(server)
        log.start()
        healthy = HealthyClient(server.mqtt, tally, settings.round_trip_bound)
        healthy_amqp = HealthyAmqpClient(server.amqp, tally, settings.round_trip_bound)
        watch = Watch(server, tally, settings)
        healthy.start()
        healthy_amqp.start()
        watch.start()

        def progress(elapsed: float) -> None:
            by_kind = ", ".join(f"{k} {sum(c.values())}" for k, c in tally.outcomes.items())
            print(f"[{elapsed:5.0f} s] {tally.cases} cases ({by_kind}) | healthy round trips "
                  f"{len(healthy.latencies)}, worst {max(healthy.latencies, default=0) * 1000:.0f} ms"
                  f" | rss {watch.rss >> 20} MB | fds {watch.fds}", flush=True)

        asyncio.run(fuzz(server, settings, tally, progress))
        if tally.outcomes["forged"][ACCEPTED_FORGED]:
            tally.fail(f"{tally.outcomes['forged'][ACCEPTED_FORGED]} native sends with forged "
                       "namespaced properties were stored")
        _check_sockets_return(watch, tally)
        healthy.close()
        healthy_amqp.close()
        watch.stop.set()
        watch.join(10)
        _stop(server, tally)
        log.join(10)
        if log.errors:  # hostile input is an expected condition: one INFO line, no traceback
            tally.fail(f"the broker logged {len(log.errors)} error lines or tracebacks")
        print_summary(settings, tally, healthy, healthy_amqp, watch, log.errors)
    finally:
        server.kill()
        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if tally.failures else 0


SOCKET_SLACK = 8
"""Sockets the broker may hold beyond its start once the hostile ones are gone (the healthy
client's, gRPC's own)."""


def _check_sockets_return(watch: Watch, tally: Tally, within: float = 20.0) -> None:
    """Once every hostile connection is gone (lingering closes end after 2 s, unfinished
    CONNECTs after the CONNECT timeout), the broker's sockets come back to about the start."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        watch.check()
        watch.sockets = watch.open_sockets()
        if watch.sockets - watch.baseline_sockets <= SOCKET_SLACK:
            return
        time.sleep(0.5)  # polling an observable: the broker closes sockets on its own timers
    tally.fail(f"broker sockets did not come back: {watch.sockets} open, "
               f"{watch.baseline_sockets} at the start")


def print_summary(settings: Settings, tally: Tally, healthy: HealthyClient,
                  healthy_amqp: HealthyAmqpClient, watch: Watch, errors: list[str]) -> None:
    print(f"\nlive fuzz summary (seed {settings.seed}): {tally.cases} cases")
    for kind, outcomes in tally.outcomes.items():
        if outcomes:
            detail = ", ".join(f"{o} {n}" for o, n in outcomes.most_common(6))
            more = f", +{len(outcomes) - 6} more outcomes" if len(outcomes) > 6 else ""
            print(f"  {kind:12} {sum(outcomes.values()):6}  ({detail}{more})")
    latencies = sorted(healthy.latencies)
    if latencies:
        print(f"  healthy QoS 1 round trips: {len(latencies)}, median "
              f"{latencies[len(latencies) // 2] * 1000:.1f} ms, worst {latencies[-1] * 1000:.0f} ms")
    latencies = sorted(healthy_amqp.latencies)
    if latencies:
        print(f"  healthy AMQP round trips: {len(latencies)}, median "
              f"{latencies[len(latencies) // 2] * 1000:.1f} ms, worst {latencies[-1] * 1000:.0f} ms")
    print(f"  forged and poison messages the healthy AMQP consumer received: "
          f"{healthy_amqp.forged_received}")
    print(f"  broker memory: {watch.baseline_rss >> 20} MB at the start, peak {watch.peak_rss >> 20} MB;"
          f" descriptors: {watch.baseline_fds} at the start, peak {watch.peak_fds}, "
          f"{watch.fds} at the end ({watch.sockets} sockets, {watch.baseline_sockets} at the start)")
    print(f"  error lines and tracebacks the broker logged: {len(errors)}")
    distinct = Counter(_without_time(e) for e in errors if not e.startswith("Traceback"))
    for line, count in distinct.most_common(15):
        print(f"    {count:5} x {line[:250]}")
    if tally.failures:
        print("FAILED:")
        for reason in tally.failures:
            print(f"  {reason}")
    else:
        print("passed: the broker stayed up, healthy, and within its bounds")


def _without_time(line: str) -> str:
    """A log line without its leading ``YYYY-MM-DD HH:MM:SS,mmm`` timestamp."""
    return line[24:] if line[:4].isdigit() and line[10:11] == " " else line


def parse_args(argv: list[str] | None) -> Settings:
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz.live_fuzz", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=180.0, help="how long to fuzz (default 180)")
    parser.add_argument("--seed", type=int, default=None, help="case generator seed (default: random, printed)")
    parser.add_argument("--concurrency", type=int, default=8, help="hostile connections at once (default 8)")
    parser.add_argument("--round-trip-bound", type=float, default=5.0,
                        help="longest acceptable healthy QoS 1 round trip, seconds (default 5)")
    parser.add_argument("--max-rss-growth-mb", type=int, default=512,
                        help="how much the broker's memory may grow (default 512 MB)")
    parser.add_argument("--max-fd-growth", type=int, default=512,
                        help="how many more descriptors the broker may hold: sockets, and the files "
                             "of the topics and sessions the cases create (default 512)")
    parser.add_argument("--progress-every", type=float, default=10.0, help="seconds between progress lines")
    parser.add_argument("--case", type=int, default=None, help="replay only case N of --seed")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1_000_000)
    return Settings(args.seconds, seed, args.concurrency, args.round_trip_bound,
                    args.max_rss_growth_mb, args.max_fd_growth, args.progress_every, args.case)


if __name__ == "__main__":
    sys.exit(main())
