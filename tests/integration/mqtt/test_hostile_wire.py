"""What an MQTT peer can make a running `sluice serve` parse or hold, before and after it
authenticates: huge property blocks, big or unfinished CONNECTs, silent connections, too many
connections, and over-long client ids, topics and subscription lists.

Each hostile client talks over a raw loopback socket; a paho pair connected beforehand (or a
client connecting meanwhile) shows that the broker, and everyone else on it, goes on. Waits
are on socket reads with deadlines and paho events, never fixed sleeps.
"""
from __future__ import annotations

import asyncio
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator

import aiohttp
import paho.mqtt.client as mqtt
import psutil
import pytest

from protocols.mqtt.codec import MQTT_5, MQTT_311, encode
from protocols.mqtt.packets import (ConnAck, Connect, Disconnect, Publish, SubAck, Subscribe,
                                    Subscription)
from protocols.mqtt.properties import varint
from tests.conftest import CONFIG, Server
from tests.integration.mqtt.test_robustness import (PASSWORD, USER, Closed, PahoClient,
                                                    RawClient, assert_round_trip, host_port)

LIMITS = CONFIG + """
[mqtt]
connect_timeout_s = 1.0
max_client_id_length = 32
max_topic_length = 64
max_topic_levels = 5
max_user_properties = 16
max_subscriptions = 3
"""
ATTACK_PROPERTIES = 790_000
"""Empty user properties in the 4 MB CONNECT of issue 12 (5 bytes each)."""


def huge_property_block(count: int = ATTACK_PROPERTIES) -> bytes:
    body = b"\x26\x00\x00\x00\x00" * count
    return varint(len(body)) + body


def connect_with_properties(block: bytes, client_id: bytes = b"attacker") -> bytes:
    """An MQTT 5 CONNECT (user name and password set) whose property block is ``block``."""
    variable = b"\x00\x04MQTT\x05\xc2\x00\x3c" + block
    payload = (len(client_id).to_bytes(2, "big") + client_id + len(USER).to_bytes(2, "big")
               + USER.encode() + len(PASSWORD).to_bytes(2, "big") + PASSWORD.encode())
    body = variable + payload
    return b"\x10" + varint(len(body)) + body


def publish_with_properties(block: bytes) -> bytes:
    body = b"\x00\x03a/b" + block + b"payload"
    return b"\x30" + varint(len(body)) + body


def send_in_background(sock: socket.socket, data: bytes) -> threading.Thread:
    """Send ``data`` from a thread (the broker may close the socket midway: that is fine)."""
    def send() -> None:
        try:
            sock.sendall(data)
        except OSError:
            pass
    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


def health_answers(server: Server, timeout: float = 5.0) -> bool:
    with urllib.request.urlopen(f"{server.admin}/health", timeout=timeout) as response:
        return response.status in (200, 503)


def rss(server: Server) -> int:
    return psutil.Process(server.process.pid).memory_info().rss


def raw(server: Server, version: int = MQTT_5) -> RawClient:
    return RawClient(server.mqtt, version, timeout=10)


def connect_once_admitted(server: Server, version: int, within: float = 10.0) -> RawClient:
    """A connected client, retrying while the broker still refuses new connections (it learns
    of closed ones asynchronously)."""
    deadline = time.monotonic() + within
    while True:
        client = raw(server, version)
        try:
            assert client.connect().reason_code == 0
            return client
        except (Closed, OSError):
            client.close()
            assert time.monotonic() < deadline, "new connections stay refused"


@pytest.fixture(scope="module")
def limited(tmp_path_factory) -> Iterator[Server]:
    """A broker with small limits and a short CONNECT timeout."""
    server = Server(tmp_path_factory.mktemp("limits") / "data", config=LIMITS)
    try:
        server.wait_ready()
        yield server
    finally:
        server.kill()


@pytest.fixture
def started(sluice_server, tmp_path):
    def start(config: str = CONFIG) -> Server:
        server = sluice_server(tmp_path / "data", config=config)
        server.wait_ready()
        return server
    return start


# ============================================================================ defect 1


def test_a_4mb_connect_of_790000_user_properties_is_refused_at_once(limited):
    """The CONNECT of issue 12 is refused from its fixed header (larger than
    max_connect_packet_size, 64 KiB by default): CONNACK 0x95 at once; meanwhile a paho
    client connects and /health answers."""
    attacker = raw(limited)
    send_in_background(attacker.sock, connect_with_properties(huge_property_block()))
    bystander = PahoClient(limited.mqtt, "bystander-1", version=mqtt.MQTTv5)
    assert health_answers(limited)
    assert attacker.read_until_closed(timeout=5) == [ConnAck(False, 0x95)]
    attacker.close()
    bystander.stop()


def test_a_connect_under_the_size_limit_stops_decoding_at_the_property_cap(started):
    """With max_connect_packet_size raised to 8 MB the same CONNECT is read whole, and decoding
    stops at the 17th user property (max_user_properties 16): CONNACK 0x97 within the read's
    10 s, while another client connects and /health answers. Decoding all 790,000 once blocked
    the event loop for minutes."""
    server = started(LIMITS + "max_connect_packet_size = 8388608\n")
    attacker = raw(server)
    attack = connect_with_properties(huge_property_block())
    attacker.sock.sendall(attack)
    assert attacker.read_until_closed(timeout=10) == [ConnAck(False, 0x97)]
    bystander = PahoClient(server.mqtt, "bystander-2", version=mqtt.MQTTv5)
    assert health_answers(server)
    attacker.close()
    bystander.stop()


def test_a_publish_of_790000_user_properties_gets_disconnect_0x97(limited):
    """After CONNECT, a 4 MB PUBLISH (within max_packet_size) of 790,000 user properties:
    DISCONNECT 0x97 Quota exceeded right after it arrived; a paho pair connected before goes
    on exchanging messages."""
    publisher = PahoClient(limited.mqtt, "witness-pub-1")
    subscriber = PahoClient(limited.mqtt, "witness-sub-1", version=mqtt.MQTTv5)
    subscriber.subscribe("witness/#", qos=1)
    attacker = raw(limited)
    assert attacker.connect().reason_code == 0
    attacker.sock.sendall(publish_with_properties(huge_property_block()))
    assert attacker.read_until_closed(timeout=10) == [Disconnect(0x97)]
    assert_round_trip(publisher, subscriber, "witness/after-properties")
    attacker.close()
    publisher.stop()
    subscriber.stop()


# ============================================================================ defect 13


def test_connections_without_a_whole_connect_are_closed_after_the_timeout(limited):
    """connect_timeout_s = 1: 20 silent connections, 20 that sent half a CONNECT, and on the
    WebSocket port 5 silent sockets and 5 upgraded WebSockets that send no CONNECT are all
    closed by the broker within the timeout plus its once-a-second sweep; a client that
    connects meanwhile is served."""
    silent = [raw(limited) for _ in range(20)]
    partial = [raw(limited) for _ in range(20)]
    half = encode(Connect("half", username=USER, password=PASSWORD.encode()), MQTT_5)[:9]
    for client in partial:
        client.send(half)
    ws_host, ws_port = host_port(limited.mqtt_ws.split("/")[2])
    ws_silent = [socket.create_connection((ws_host, ws_port), timeout=10) for _ in range(5)]

    async def upgraded_but_silent() -> None:
        async with aiohttp.ClientSession() as session:
            sockets = [await session.ws_connect(limited.mqtt_ws, protocols=("mqtt",))
                       for _ in range(5)]
            for ws in sockets:
                message = await ws.receive(timeout=10)
                assert message.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED), message

    asyncio.run(upgraded_but_silent())
    good = raw(limited)
    assert good.connect().reason_code == 0
    for client in silent + partial:
        assert client.read_until_closed(timeout=5) == []
        client.close()
    for sock in ws_silent:
        assert sock.recv(100) == b""
        sock.close()
    good.send(encode(Subscribe(1, (Subscription("t/#", 0),)), MQTT_5))
    assert good.expect(SubAck).reason_codes == (0,)
    good.close()


def test_100_partial_4mb_connects_are_refused_early_and_hold_no_memory(limited):
    """100 connections each announcing a 4 MB CONNECT (just under max_packet_size) and sending
    1 MB of it: each is closed from its fixed header (CONNACK 0x95, beyond
    max_connect_packet_size), so the broker's memory does not grow by what they sent (it
    once held ~390 MB for them, for ever)."""
    before = rss(limited)
    clients = [raw(limited) for _ in range(100)]
    header = b"\x10" + varint(4_000_000) + b"\x00\x04MQTT\x05"
    senders = [send_in_background(c.sock, header + b"\x00" * (1 << 20)) for c in clients]
    for client in clients:
        assert client.read_until_closed(timeout=10) in ([ConnAck(False, 0x95)], [])
    for thread in senders:
        thread.join(10)
    grown = rss(limited) - before
    for client in clients:
        client.close()
    assert grown < 40 << 20, f"the broker grew by {grown >> 20} MB"


def test_connections_beyond_max_pending_connections_are_closed_at_once(started):
    """max_pending_connections = 10: with 10 connections waiting for their CONNACK, the 11th is
    closed before it sends anything; once they are gone, new clients connect again."""
    server = started(CONFIG + "[mqtt]\nmax_pending_connections = 10\nconnect_timeout_s = 30\n")
    waiting = [raw(server) for _ in range(10)]
    for client in waiting:  # the broker has accepted each: a CONNECT half-way in is answered
        client.send(b"\x10")
    extra = raw(server)
    assert extra.read_until_closed(timeout=5) == []
    extra.close()
    for client in waiting:
        client.close()
    connect_once_admitted(server, MQTT_5).close()


def test_connections_beyond_max_connections_are_closed_at_once(started):
    """max_connections = 5: five connected clients; a sixth socket is closed at once; when one
    of the five leaves, a new client connects."""
    server = started(CONFIG + "[mqtt]\nmax_connections = 5\n")
    clients = [raw(server, MQTT_311) for _ in range(5)]
    for client in clients:
        assert client.connect().reason_code == 0
    sixth = raw(server, MQTT_311)
    assert sixth.read_until_closed(timeout=5) == []
    sixth.close()
    clients.pop().close()
    clients.append(connect_once_admitted(server, MQTT_311))
    for client in clients:
        client.close()


# ============================================================================ caps


@pytest.mark.parametrize("version, refused", [(MQTT_5, 0x85), (MQTT_311, 2)], ids=["v5", "v311"])
def test_a_client_id_over_max_client_id_length_is_refused(limited, version, refused):
    client = raw(limited, version)
    client.send(Connect(client_id="c" * 33, username=USER, password=PASSWORD.encode()))
    assert client.read_until_closed() == [ConnAck(False, refused)]
    client.close()
    ok = raw(limited, version)
    assert ok.connect(client_id="c" * 32).reason_code == 0
    ok.close()


@pytest.mark.parametrize("topic", ["t/" + "x" * 63, "a/b/c/d/e/f"], ids=["65-bytes", "6-levels"])
@pytest.mark.parametrize("version, expected", [(MQTT_5, [Disconnect(0x90)]), (MQTT_311, [])],
                         ids=["v5", "v311"])
def test_a_publish_topic_over_the_limits_closes_the_connection(limited, topic, version, expected):
    client = raw(limited, version)
    assert client.connect().reason_code == 0
    client.send(Publish(topic, b"x", 1, packet_id=1))
    assert client.read_until_closed() == expected
    client.close()


@pytest.mark.parametrize("version, invalid, quota", [(MQTT_5, 0x8F, 0x97), (MQTT_311, 0x80, 0x80)],
                         ids=["v5", "v311"])
def test_filters_over_the_limits_and_subscriptions_over_the_cap_are_refused(limited, version,
                                                                            invalid, quota):
    """Per filter in the SUBACK: too long or too deep 0x8F (3.1.1: 0x80); the fourth distinct
    filter of a session (max_subscriptions 3) 0x97 (3.1.1: 0x80); re-subscribing to a filter
    the session has is not a new one. The connection stays open."""
    client = raw(limited, version)
    assert client.connect().reason_code == 0
    client.send(Subscribe(1, (Subscription("f/" + "x" * 63, 0), Subscription("a/b/c/d/e/#", 0),
                              Subscription("s/1", 1), Subscription("s/2", 1),
                              Subscription("s/3", 1), Subscription("s/4", 1))))
    assert client.expect(SubAck).reason_codes == (invalid, invalid, 1, 1, 1, quota)
    client.send(Subscribe(2, (Subscription("s/1", 0), Subscription("s/5", 0))))
    assert client.expect(SubAck).reason_codes == (0, quota)
    client.close()


# ============================================================================ defect 21


def test_a_paho_client_that_exceeds_receive_maximum_reads_disconnect_0x93(started):
    """receive_maximum = 5 and a paho MQTT 5 client that ignores it (paho keeps 20 QoS 1
    messages of 100 KB in flight): the broker writes DISCONNECT 0x93, half-closes and drains
    what paho still sends, so paho reads the reason. Closed with 1.4 MB unread, the socket
    was reset instead, and the reset discarded the DISCONNECT before paho read it."""
    server = started(CONFIG + "[mqtt]\nreceive_maximum = 5\n")
    reasons: list[int] = []
    gone = threading.Event()
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="greedy",
                         protocol=mqtt.MQTTv5)
    client.username_pw_set(USER, PASSWORD)
    connected = threading.Event()
    client.on_connect = lambda *args: connected.set()

    def on_disconnect(_client, _userdata, _flags, reason, _properties) -> None:
        reasons.append(reason.value)
        gone.set()
    client.on_disconnect = on_disconnect
    client.connect(*host_port(server.mqtt))
    client.loop_start()
    try:
        assert connected.wait(10)
        for number in range(20):
            client.publish("greedy/t", b"x" * 100_000 + str(number).encode(), qos=1)
        assert gone.wait(10), "the broker did not close the connection"
    finally:
        client.loop_stop()
    assert reasons == [0x93], f"paho saw {reasons}, not DISCONNECT 0x93"


def test_a_connection_closed_for_an_error_ends_with_its_reason_and_an_orderly_close(started):
    """A client that writes all its packets before reading (a blocking-socket device) and
    exceeds receive_maximum = 5 reads DISCONNECT 0x93 followed by an orderly end of stream.
    Closing with its packets unread reset the connection instead, and a reset may discard
    what the client has not read yet (the DISCONNECT and its reason)."""
    server = started(CONFIG + "[mqtt]\nreceive_maximum = 5\n")
    burst = b"".join(encode(Publish("burst/t", b"x" * 100_000, 1, packet_id=i + 1), MQTT_5)
                     for i in range(20))
    for _ in range(3):
        client = raw(server)
        assert client.connect().reason_code == 0
        try:
            client.sock.sendall(burst)
        except OSError:
            pass
        packets, ending = [], None
        while ending is None:
            try:
                data = client.sock.recv(65536)
            except OSError as error:
                ending = repr(error)
                break
            if not data:
                ending = "end of stream"
            client.decoder.feed(data)
            while (packet := client.decoder.next_packet()) is not None:
                packets.append(packet)
        client.close()
        assert isinstance(packets[-1], Disconnect) and packets[-1].reason_code == 0x93, packets
        assert ending == "end of stream", f"after the DISCONNECT: {ending}"


# ============================================================================ WebSocket Origin


def test_browser_pages_of_other_origins_cannot_open_mqtt_websockets(started):
    """ws_allowed_origins = https://app.example.com: an upgrade from that page, from a page of
    the listener's own origin and from a client sending no Origin succeed; one from any other
    page gets 403; paho over WebSocket still works."""
    server = started(CONFIG + '[mqtt]\nws_allowed_origins = "https://app.example.com"\n')
    url = server.mqtt_ws
    host = url.split("/")[2]

    async def status(origin: str | None) -> int:
        headers = {} if origin is None else {"Origin": origin}
        async with aiohttp.ClientSession() as session:
            try:
                async with session.ws_connect(url, protocols=("mqtt",), headers=headers):
                    return 101
            except aiohttp.WSServerHandshakeError as refused:
                return refused.status

    for origin, expected in ((None, 101), ("https://app.example.com", 101),
                             (f"http://{host}", 101), ("https://evil.example", 403),
                             ("null", 403)):
        assert asyncio.run(status(origin)) == expected, origin
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="ws-paho",
                         transport="websockets")
    client.ws_set_options(path="/mqtt")
    client.username_pw_set(USER, PASSWORD)
    connected = threading.Event()
    client.on_connect = lambda *args: connected.set()
    client.connect(*host_port(host))
    client.loop_start()
    try:
        assert connected.wait(10), "paho over WebSocket did not connect"
    finally:
        client.disconnect()
        client.loop_stop()
