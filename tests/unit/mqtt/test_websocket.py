"""MQTT over WebSocket: real aiohttp and paho clients against `start_websocket_listener` on 127.0.0.1."""
from __future__ import annotations

import asyncio
import contextlib
import ssl
import threading
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import paho.mqtt.client as paho
import pytest
from aiohttp import WSCloseCode, WSMsgType

from protocols.tls import ServerTls, TlsConfig
from protocols.mqtt.websocket import HIGH_WATER, WebSocketListener, WebSocketWire, start_websocket_listener

CONNACK = bytes([0x20, 0x02, 0x00, 0x00])


class Echo:
    """Writes back every chunk it receives; records chunks and `connection_lost` calls."""

    def __init__(self, wire) -> None:
        self.wire = wire
        self.chunks: list[bytes] = []
        self.lost_calls = 0
        self.lost = asyncio.Event()
        self.drained = asyncio.Event()

    def data_received(self, data: bytes) -> None:
        self.chunks.append(data)
        self.wire.write(data)

    def connection_lost(self) -> None:
        self.lost_calls += 1
        self.lost.set()

    def writable(self) -> None:
        self.drained.set()


class Handlers(list):
    """A connection factory that keeps every handler it made; `first()` awaits the first one."""

    def __init__(self, make: Callable[[object], Echo] = Echo) -> None:
        super().__init__()
        self.make = make
        self.made = asyncio.Event()

    def __call__(self, wire) -> Echo:
        handler = self.make(wire)
        self.append(handler)
        self.made.set()
        return handler

    async def first(self) -> Echo:
        await asyncio.wait_for(self.made.wait(), 5)
        return self[0]


@contextlib.asynccontextmanager
async def listening(handlers: Handlers, ssl_context: ssl.SSLContext | None = None) -> AsyncIterator[WebSocketListener]:
    listener = await start_websocket_listener(handlers, "127.0.0.1", 0, ssl_context=ssl_context)
    try:
        yield listener
    finally:
        await listener.stop()


def url(listener: WebSocketListener, scheme: str = "ws", path: str = "/mqtt") -> str:
    return f"{scheme}://127.0.0.1:{listener.port}{path}"


def run(test: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(test(), 10))


async def receive_bytes(ws: aiohttp.ClientWebSocketResponse, count: int) -> bytes:
    got = b""
    while len(got) < count:
        got += await ws.receive_bytes(timeout=5)
    return got


@pytest.mark.parametrize("scheme", ["ws", "wss"])
def test_bytes_round_trip_and_the_server_selects_mqtt(scheme, cert_files):
    server_tls = ServerTls(TlsConfig(*cert_files)).context() if scheme == "wss" else None
    client_tls = ssl.create_default_context(cafile=cert_files.cert) if scheme == "wss" else None

    async def test() -> None:
        handlers = Handlers()
        async with listening(handlers, server_tls) as listener, aiohttp.ClientSession() as session:
            async with session.ws_connect(url(listener, scheme), protocols=("mqtt",), ssl=client_tls or True) as ws:
                assert ws.protocol == "mqtt"
                await ws.send_bytes(b"\xc0\x00")
                assert await receive_bytes(ws, 2) == b"\xc0\x00"
            handler = await handlers.first()
            await handler.lost.wait()
            assert handler.lost_calls == 1
    run(test)


@pytest.mark.parametrize(("offered", "selected"), [(("mqttv3.1",), "mqttv3.1"), (("mqttv3.1", "mqtt"), "mqtt")])
def test_old_clients_offering_mqttv3_1_are_accepted_and_mqtt_wins_when_offered(offered, selected):
    async def test() -> None:
        async with listening(Handlers()) as listener, aiohttp.ClientSession() as session:
            async with session.ws_connect(url(listener), protocols=offered) as ws:
                assert ws.protocol == selected
    run(test)


def test_a_packet_split_across_frames_arrives_whole_and_many_writes_leave_as_one_frame():
    class Burst(Echo):
        def data_received(self, data: bytes) -> None:
            self.chunks.append(data)
            if b"".join(self.chunks) == b"\x30\x03\x00\x01t":
                for byte in b"0123456789" * 10:
                    self.wire.write(bytes([byte]))

    async def test() -> None:
        handlers = Handlers(Burst)
        async with listening(handlers) as listener, aiohttp.ClientSession() as session:
            async with session.ws_connect(url(listener), protocols=("mqtt",)) as ws:
                for part in (b"\x30", b"\x03\x00", b"\x01t"):
                    await ws.send_bytes(part)
                frame = await ws.receive_bytes(timeout=5)
            assert frame == b"0123456789" * 10
            assert b"".join((await handlers.first()).chunks) == b"\x30\x03\x00\x01t"
    run(test)


def test_a_frame_holding_many_packets_reaches_the_handler_as_it_came():
    async def test() -> None:
        handlers = Handlers()
        async with listening(handlers) as listener, aiohttp.ClientSession() as session:
            async with session.ws_connect(url(listener), protocols=("mqtt",)) as ws:
                await ws.send_bytes(b"\xc0\x00" * 3)
                assert await receive_bytes(ws, 6) == b"\xc0\x00" * 3
            assert (await handlers.first()).chunks == [b"\xc0\x00" * 3]
    run(test)


def test_a_frame_larger_than_aiohttps_default_limit_is_accepted():
    packet = bytes(5 * 1024 * 1024)

    async def test() -> None:
        handlers = Handlers()
        async with listening(handlers) as listener, aiohttp.ClientSession() as session:
            async with session.ws_connect(url(listener), protocols=("mqtt",), max_msg_size=0) as ws:
                await ws.send_bytes(packet)
                assert await receive_bytes(ws, len(packet)) == packet
            assert (await handlers.first()).chunks == [packet]
    run(test)


def test_a_full_send_buffer_calls_writable_once_it_drains():
    big = bytes(4 * HIGH_WATER)

    class Flood(Echo):
        def data_received(self, data: bytes) -> None:
            self.wire.write(big)
            self.buffered_after_write = self.wire.buffered()

    async def test() -> None:
        handlers = Handlers(Flood)
        async with listening(handlers) as listener, aiohttp.ClientSession() as session:
            async with session.ws_connect(url(listener), protocols=("mqtt",)) as ws:
                await ws.send_bytes(b"go")
                assert await receive_bytes(ws, len(big)) == big
                handler = await handlers.first()
                await handler.drained.wait()
                assert handler.buffered_after_write == len(big)
                assert handler.wire.buffered() == 0
    run(test)


def test_close_sends_what_is_queued_first_and_abort_does_not_wait():
    class ReplyThenClose(Echo):
        def data_received(self, data: bytes) -> None:
            self.wire.write(CONNACK)
            if data == b"close":
                self.wire.close()
            else:
                self.wire.abort()

    async def test() -> None:
        handlers = Handlers(ReplyThenClose)
        async with listening(handlers) as listener, aiohttp.ClientSession() as session:
            async with session.ws_connect(url(listener), protocols=("mqtt",)) as ws:
                await ws.send_bytes(b"close")
                assert await ws.receive_bytes(timeout=5) == CONNACK
                assert (await ws.receive(timeout=5)).type is WSMsgType.CLOSE
                assert ws.close_code == WSCloseCode.OK
            async with session.ws_connect(url(listener), protocols=("mqtt",)) as ws:
                await ws.send_bytes(b"abort")
                assert (await ws.receive(timeout=5)).type in (WSMsgType.CLOSED, WSMsgType.ERROR)
            for handler in handlers:
                await handler.lost.wait()
            assert [h.lost_calls for h in handlers] == [1, 1]
    run(test)


def test_a_missing_subprotocol_is_refused_with_400_and_says_what_to_offer():
    async def test() -> None:
        async with listening(Handlers()) as listener, aiohttp.ClientSession() as session:
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await session.ws_connect(url(listener), protocols=("chat",))
            assert refused.value.status == 400
            async with session.get(url(listener, "http")) as response:
                assert response.status == 400
                assert '"mqtt"' in await response.text()
    run(test)


def test_another_path_is_404_naming_the_right_one():
    async def test() -> None:
        async with listening(Handlers()) as listener, aiohttp.ClientSession() as session:
            async with session.get(url(listener, "http", "/ws")) as response:
                assert response.status == 404
                assert "/mqtt" in await response.text()
    run(test)


def test_a_text_frame_closes_with_1003_and_the_handler_hears_of_it():
    async def test() -> None:
        handlers = Handlers()
        async with listening(handlers) as listener, aiohttp.ClientSession() as session:
            async with session.ws_connect(url(listener), protocols=("mqtt",)) as ws:
                await ws.send_str("CONNECT")
                assert (await ws.receive(timeout=5)).type is WSMsgType.CLOSE
                assert ws.close_code == WSCloseCode.UNSUPPORTED_DATA
            handler = await handlers.first()
            await handler.lost.wait()
            assert handler.chunks == [] and handler.lost_calls == 1
    run(test)


def test_stop_closes_every_client_with_going_away_and_stops_accepting():
    async def test() -> None:
        handlers = Handlers()
        listener = await start_websocket_listener(handlers, "127.0.0.1", 0)
        async with aiohttp.ClientSession() as session:
            clients = [await session.ws_connect(url(listener), protocols=("mqtt",)) for _ in range(2)]
            for ws in clients:
                await ws.send_bytes(b"\xc0\x00")
                await receive_bytes(ws, 2)
            _, *closes = await asyncio.gather(listener.stop(), *(ws.receive(timeout=5) for ws in clients))
            assert [(m.type, m.data) for m in closes] == [(WSMsgType.CLOSE, WSCloseCode.GOING_AWAY)] * 2
            assert [h.lost_calls for h in handlers] == [1, 1]
            with pytest.raises(aiohttp.ClientConnectionError):
                await session.ws_connect(url(listener), protocols=("mqtt",))
    run(test)


def test_a_paused_wire_reads_nothing_until_resumed():
    class FakeWebSocket:
        def __init__(self) -> None:
            self.inbox: asyncio.Queue[aiohttp.WSMessage] = asyncio.Queue()
            self.receives = 0

        async def receive(self) -> aiohttp.WSMessage:
            self.receives += 1
            return await self.inbox.get()

    class PauseOnFirst(Echo):
        def data_received(self, data: bytes) -> None:
            self.chunks.append(data)
            if len(self.chunks) == 1:
                self.wire.pause_reading()
            self.drained.set()

    async def test() -> None:
        ws = FakeWebSocket()
        wire = WebSocketWire(ws, transport=None, peer="fake")
        handler = PauseOnFirst(wire)
        serving = asyncio.create_task(wire.serve(handler))
        for data in (b"a", b"b"):
            ws.inbox.put_nowait(aiohttp.WSMessage(WSMsgType.BINARY, data, None))
        await handler.drained.wait()
        await asyncio.sleep(0)
        assert (handler.chunks, ws.receives) == ([b"a"], 1)
        handler.drained.clear()
        wire.resume_reading()
        await handler.drained.wait()
        assert handler.chunks == [b"a", b"b"]
        ws.inbox.put_nowait(aiohttp.WSMessage(WSMsgType.CLOSED, None, None))
        await serving
        assert handler.lost_calls == 1
    run(test)


class PahoConnect:
    """A paho-mqtt client over WebSocket; `connected()` awaits its on_connect."""

    def __init__(self, port: int, ca_file: str | None = None) -> None:
        self.client = paho.Client(paho.CallbackAPIVersion.VERSION2, transport="websockets")
        self.client.ws_set_options(path="/mqtt")
        if ca_file:
            self.client.tls_set(ca_certs=ca_file)
        self.reason: paho.ReasonCode | None = None
        self.done = threading.Event()
        self.client.on_connect = self._on_connect
        self.client.connect_async("127.0.0.1", port, keepalive=30)
        self.client.loop_start()

    def _on_connect(self, client, userdata, flags, reason, properties) -> None:
        self.reason = reason
        self.done.set()

    async def connected(self) -> paho.ReasonCode:
        assert await asyncio.to_thread(self.done.wait, 5), "paho never called on_connect"
        return self.reason

    async def stop(self) -> None:
        self.client.disconnect()
        await asyncio.to_thread(self.client.loop_stop)


class FixedConnack(Echo):
    """Answers the first bytes (the client's CONNECT) with CONNACK: accepted, no session."""

    def data_received(self, data: bytes) -> None:
        if not self.chunks:
            self.wire.write(CONNACK)
        self.chunks.append(data)


@pytest.mark.parametrize("secure", [False, True])
def test_paho_connects_over_websocket(secure, cert_files):
    async def test() -> None:
        handlers = Handlers(FixedConnack)
        server_tls = ServerTls(TlsConfig(*cert_files)).context() if secure else None
        async with listening(handlers, server_tls) as listener:
            client = PahoConnect(listener.port, cert_files.cert if secure else None)
            try:
                reason = await client.connected()
            finally:
                await client.stop()
            assert not reason.is_failure
            assert (await handlers.first()).chunks[0][0] == 0x10
    run(test)
