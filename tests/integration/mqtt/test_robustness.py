"""MQTT front end under hostile and heavy conditions, against a real `sluice serve` process.

Every test talks to the broker over real loopback sockets: raw sockets (packets built with
``protocols.mqtt.codec.encode`` and then corrupted, or by hand) where the bytes matter, paho
clients where a well-behaved client is wanted. Waits are on events (``threading.Event``, socket
reads with deadlines), never fixed sleeps.

- Malformed input closes only the offending connection (MQTT 5: after a DISCONNECT carrying the
  reason), and a client connected before it goes on publishing and receiving.
- 10,000 concurrent connections are accepted and the broker still serves.
- A subscriber that stops reading does not stall the others (QoS 0 and QoS 1).
- Keep alive is enforced (1.5 x the keep-alive period, swept once per second).
- Authentication failures get the right CONNACK; authorization denials the right SUBACK/PUBACK.
"""
from __future__ import annotations

import asyncio
import queue
import resource
import socket
import struct
from dataclasses import replace
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from protocols.mqtt.codec import MQTT_5, MQTT_311, Decoder, encode
from protocols.mqtt.packets import (ConnAck, Connect, Disconnect, Packet, PingReq, PingResp,
                                    PubAck, Publish, SubAck, Subscribe, Subscription)
from protocols.mqtt.properties import Properties
from tests.conftest import CONFIG, ROOT, Server, clean_env

USER, PASSWORD = "sluice", "sluice"
SMALL_PACKETS = CONFIG + """
[mqtt]
max_packet_size = 1024
"""


def host_port(address: str) -> tuple[str, int]:
    host, port = address.rsplit(":", 1)
    return host, int(port)


# ----------------------------------------------------------------------------- raw client


class Closed(Exception):
    """The server closed the connection while a packet was expected."""


class RawClient:
    """A blocking MQTT client on a plain socket: send any bytes, read decoded packets."""

    def __init__(self, address: str, version: int = MQTT_311, *, rcvbuf: int | None = None,
                 timeout: float = 10.0) -> None:
        self.version = version
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf is not None:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(timeout)
        self.sock.connect(host_port(address))
        self.decoder = Decoder(version)

    def close(self) -> None:
        self.sock.close()

    def send(self, data: bytes | Packet) -> None:
        if not isinstance(data, (bytes, bytearray)):
            data = encode(data, self.version)
        self.sock.sendall(data)

    def connect(self, *, username: str | None = USER, password: str | None = PASSWORD,
                keep_alive: int = 60, client_id: str = "", clean_start: bool = True,
                properties: Properties = Properties()) -> ConnAck:
        self.send(Connect(client_id=client_id, clean_start=clean_start, keep_alive=keep_alive,
                          username=username,
                          password=None if password is None else password.encode(),
                          properties=properties))
        return self.expect(ConnAck)

    def read(self, timeout: float = 10.0) -> Packet | None:
        """The next packet; None when the server closed the connection (EOF or reset)."""
        deadline = time.monotonic() + timeout
        while (packet := self.decoder.next_packet()) is None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no packet within {timeout} s")
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(65536)
            except (ConnectionResetError, BrokenPipeError):
                data = b""
            except socket.timeout:
                raise TimeoutError(f"no packet within {timeout} s") from None
            if not data:
                return None
            self.decoder.feed(data)
        if isinstance(packet, (Disconnect, ConnAck)) and packet.properties.reason_string:
            # what the reason string says is for people; tests compare reason codes
            packet = replace(packet, properties=replace(packet.properties, reason_string=None))
        return packet

    def expect(self, kind: type, timeout: float = 10.0):
        packet = self.read(timeout)
        if packet is None:
            raise Closed(f"connection closed while waiting for {kind.__name__}")
        assert isinstance(packet, kind), f"expected {kind.__name__}, got {packet}"
        return packet

    def read_until_closed(self, timeout: float = 10.0) -> list[Packet]:
        """Every packet the server sends until it closes; fails if it does not close in time."""
        deadline = time.monotonic() + timeout
        packets = []
        while True:
            left = deadline - time.monotonic()
            try:
                packet = self.read(max(left, 0.001))
            except TimeoutError:
                raise AssertionError(f"server did not close within {timeout} s; "
                                     f"received {packets}") from None
            if packet is None:
                return packets
            packets.append(packet)


# ----------------------------------------------------------------------------- paho client


class PahoClient:
    """A paho-mqtt client on its own network thread, with events to await."""

    def __init__(self, address: str, client_id: str, *, version: int = mqtt.MQTTv311,
                 username: str = USER, password: str = PASSWORD) -> None:
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id,
                                  protocol=version)
        self.client.username_pw_set(username, password)
        self.connected = threading.Event()
        self.connect_reason = None
        self.messages: queue.Queue[mqtt.MQTTMessage] = queue.Queue()
        self._subacks: dict[int, list] = {}
        self._suback_event = threading.Condition()
        self.client.on_connect = self._on_connect
        self.client.on_message = lambda client, userdata, message: self.messages.put(message)
        self.client.on_subscribe = self._on_subscribe
        self.client.connect(*host_port(address), keepalive=60)
        self.client.loop_start()
        assert self.connected.wait(10), f"paho client {client_id} did not connect"
        assert not self.connect_reason.is_failure, f"{client_id} refused: {self.connect_reason}"

    def _on_connect(self, client, userdata, flags, reason, properties) -> None:
        self.connect_reason = reason
        self.connected.set()

    def _on_subscribe(self, client, userdata, mid, reasons, properties) -> None:
        with self._suback_event:
            self._subacks[mid] = reasons
            self._suback_event.notify_all()

    def subscribe(self, topic: str, qos: int = 0) -> list:
        result, mid = self.client.subscribe(topic, qos)
        assert result == mqtt.MQTT_ERR_SUCCESS
        with self._suback_event:
            assert self._suback_event.wait_for(lambda: mid in self._subacks, 10), "no SUBACK"
            return self._subacks.pop(mid)

    def publish(self, topic: str, payload: bytes, qos: int = 0, wait: bool = True):
        info = self.client.publish(topic, payload, qos)
        if wait:
            info.wait_for_publish(10)
            assert info.is_published(), f"publish to {topic} not completed"
        return info

    def next_message(self, timeout: float = 10.0) -> mqtt.MQTTMessage:
        try:
            return self.messages.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no message within {timeout} s") from None

    def stop(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def assert_round_trip(publisher: PahoClient, subscriber: PahoClient, topic: str) -> None:
    """``publisher`` publishes on ``topic`` (QoS 1) and ``subscriber`` receives it."""
    payload = f"alive {time.monotonic_ns()}".encode()
    publisher.publish(topic, payload, qos=1)
    deadline = time.monotonic() + 10
    while True:
        message = subscriber.next_message(max(0.01, deadline - time.monotonic()))
        if message.payload == payload:
            assert message.topic == topic
            return


@pytest.fixture
def started(sluice_server, tmp_path):
    """``started(*flags, config=...)``: a ready `sluice serve`."""
    def start(*flags: str, config: str = CONFIG) -> Server:
        server = sluice_server(tmp_path / "data", *flags, config=config)
        server.wait_ready()
        return server
    return start


# ============================================================================ 1. malformed input


@dataclass
class Bystanders:
    """A broker with a small max_packet_size and a paho pair connected before any bad client."""

    server: Server
    publisher: PahoClient
    subscriber: PahoClient
    checks: int = field(default=0)

    def still_served(self, label: str) -> None:
        self.checks += 1
        assert_round_trip(self.publisher, self.subscriber, f"witness/{label}/{self.checks}")


@pytest.fixture(scope="module")
def bystanders(tmp_path_factory) -> Iterator[Bystanders]:
    data = tmp_path_factory.mktemp("malformed") / "data"
    server = Server(data, config=SMALL_PACKETS)
    try:
        server.wait_ready()
        publisher = PahoClient(server.mqtt, "witness-pub")
        subscriber = PahoClient(server.mqtt, "witness-sub", version=mqtt.MQTTv5)
        subscriber.subscribe("witness/#", qos=1)
        yield Bystanders(server, publisher, subscriber)
        publisher.stop()
        subscriber.stop()
    finally:
        server.kill()


def _publish_with_raw_topic(topic: bytes, version: int, payload: bytes = b"x") -> bytes:
    """A QoS 0 PUBLISH whose topic bytes are taken as they are (may be invalid UTF-8)."""
    body = struct.pack("!H", len(topic)) + topic + (b"\x00" if version == MQTT_5 else b"") + payload
    assert len(body) < 128
    return bytes([0x30, len(body)]) + body


def _connect_bytes(version: int) -> bytes:
    return encode(Connect(client_id="", keep_alive=60, username=USER, password=PASSWORD.encode()),
                  version)


def _bad_protocol_name(version: int) -> bytes:
    good = _connect_bytes(version)
    assert b"\x00\x04MQTT" in good
    return good.replace(b"\x00\x04MQTT", b"\x00\x04MQTX", 1)


def _subscribe_with_flags(version: int, flags: int) -> bytes:
    good = encode(Subscribe(1, (Subscription("a/b", 0),)), version)
    assert good[0] == 0x82
    return bytes([0x80 | flags]) + good[1:]


BAD_REMAINING_LENGTH = b"\x30\xff\xff\xff\xff\x7f"
"""A PUBLISH whose remaining length has 5 continuation bytes (the limit is 4)."""
OVERSIZED = Publish("big/topic", b"x" * 2000)
"""Larger than the configured max_packet_size of 1024 bytes."""

# (id, version, connect first?, bad bytes (or a function of the version), MQTT 5 DISCONNECT reason)
MALFORMED = [
    ("remaining-length-5-bytes-v311", MQTT_311, True, BAD_REMAINING_LENGTH, None),
    ("remaining-length-5-bytes-v5", MQTT_5, True, BAD_REMAINING_LENGTH, 0x81),
    ("remaining-length-5-bytes-before-connect", MQTT_311, False, b"\x10\xff\xff\xff\xff\x7f", None),
    ("invalid-protocol-name-v311", MQTT_311, False, _bad_protocol_name, None),
    ("invalid-protocol-name-v5", MQTT_5, False, _bad_protocol_name, None),
    ("invalid-utf8-topic-v311", MQTT_311, True,
     lambda v: _publish_with_raw_topic(b"a/\xff\xfe", v), None),
    ("invalid-utf8-topic-v5", MQTT_5, True, lambda v: _publish_with_raw_topic(b"a/\xff\xfe", v), 0x81),
    ("wildcard-plus-in-topic-v311", MQTT_311, True, lambda v: encode(Publish("a/+/b", b"x"), v), None),
    ("wildcard-plus-in-topic-v5", MQTT_5, True, lambda v: encode(Publish("a/+/b", b"x"), v), 0x90),
    ("wildcard-hash-in-topic-v5", MQTT_5, True, lambda v: encode(Publish("a/#", b"x", 1, packet_id=3), v),
     0x90),
    ("reserved-flags-subscribe-v311", MQTT_311, True, lambda v: _subscribe_with_flags(v, 0), None),
    ("reserved-flags-subscribe-v5", MQTT_5, True, lambda v: _subscribe_with_flags(v, 0), 0x81),
    ("reserved-flags-pingreq-v5", MQTT_5, True, b"\xc3\x00", 0x81),
    ("publish-qos3-v5", MQTT_5, True, b"\x36\x05\x00\x01a\x00\x01", 0x81),
    ("publish-before-connect", MQTT_311, False, lambda v: encode(Publish("a/b", b"x"), v), None),
    ("pingreq-before-connect", MQTT_5, False, lambda v: encode(PingReq(), v), None),
    ("second-connect-v311", MQTT_311, True, _connect_bytes, None),
    ("second-connect-v5", MQTT_5, True, _connect_bytes, 0x82),
    ("packet-too-large-v311", MQTT_311, True, lambda v: encode(OVERSIZED, v), None),
    ("packet-too-large-v5", MQTT_5, True, lambda v: encode(OVERSIZED, v), 0x95),
    ("garbage-http-request", MQTT_311, False, b"GET /mqtt HTTP/1.1\r\nHost: x\r\n\r\n", None),
    ("garbage-zero-bytes", MQTT_311, False, b"\x00" * 32, None),
    ("garbage-after-connack-v5", MQTT_5, True, b"\x00\x00\xde\xad\xbe\xef", 0x81),
]


@pytest.mark.parametrize("version, connect_first, bad, reason",
                         [case[1:] for case in MALFORMED], ids=[case[0] for case in MALFORMED])
def test_malformed_input_closes_only_that_connection(bystanders, version, connect_first, bad,
                                                     reason):
    """The broker closes the bad connection, and only it: MQTT 5 after CONNACK first gets a
    DISCONNECT with the reason (0x81 malformed, 0x82 protocol error, 0x90 topic name invalid,
    0x95 packet too large) and nothing else; MQTT 3.1.1, and anything before a CONNACK, is just
    closed (a failure CONNACK is
    allowed before CONNECT completes). A paho pair connected earlier keeps working."""
    client = RawClient(bystanders.server.mqtt, version)
    try:
        if connect_first:
            assert client.connect().reason_code == 0
        client.send(bad(version) if callable(bad) else bad)
        before_close = client.read_until_closed(timeout=10)
    finally:
        client.close()
    if not connect_first:
        assert all(isinstance(p, ConnAck) and p.reason_code >= 0x80 for p in before_close), \
            f"only a failure CONNACK may come before the close, got {before_close}"
    elif reason is None:
        assert before_close == [], f"MQTT 3.1.1: expected a plain close, got {before_close}"
    else:
        assert before_close == [Disconnect(reason)], \
            f"expected DISCONNECT {reason:#04x} then close, got {before_close}"
    bystanders.still_served("after-bad")


def test_malformed_byte_by_byte_and_many_bad_clients_at_once(bystanders):
    """A wildcard PUBLISH trickled in one byte at a time is still caught (DISCONNECT 0x90),
    and 50 bad clients at the same time take nothing else down."""
    client = RawClient(bystanders.server.mqtt, MQTT_5)
    assert client.connect().reason_code == 0
    for byte in encode(Publish("x/+", b"payload"), MQTT_5):
        client.send(bytes([byte]))
    assert client.read_until_closed() == [Disconnect(0x90)]
    client.close()

    bad = [RawClient(bystanders.server.mqtt, MQTT_311) for _ in range(50)]
    for i, c in enumerate(bad):
        c.send(BAD_REMAINING_LENGTH if i % 2 else b"\x00" * 8)
    for c in bad:
        assert c.read_until_closed() == []
        c.close()
    bystanders.still_served("after-50-bad")


# ============================================================================ 2. 10,000 connections

CONNECTIONS = 10_000
FD_HEADROOM = 600
"""Descriptors beyond the sockets themselves (the interpreter, pipes, the store, paho)."""


async def _open_connections(address: str, count: int, batch: int) -> tuple[list, list]:
    host, port = host_port(address)
    connect = encode(Connect(client_id="", keep_alive=60, username=USER,
                             password=PASSWORD.encode()), MQTT_311)
    expected = encode(ConnAck(False, 0), MQTT_311)
    streams: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    failures: list[str] = []

    async def one() -> None:
        reader, writer = await asyncio.open_connection(host, port)
        streams.append((reader, writer))
        writer.write(connect)
        connack = await asyncio.wait_for(reader.readexactly(4), 30)
        if connack != expected:
            failures.append(connack.hex())

    for start in range(0, count, batch):
        results = await asyncio.gather(*(one() for _ in range(min(batch, count - start))),
                                       return_exceptions=True)
        failures += [repr(r) for r in results if isinstance(r, BaseException)]
        if failures:
            break
    return streams, failures


async def _ping(stream: tuple[asyncio.StreamReader, asyncio.StreamWriter]) -> bytes:
    reader, writer = stream
    writer.write(encode(PingReq(), MQTT_311))
    return await asyncio.wait_for(reader.readexactly(2), 20)


def test_ten_thousand_concurrent_connections(started):
    """10,000 MQTT 3.1.1 connections (keep alive 60 s, user name and password) on loopback
    are all accepted and held open; meanwhile paho clients still exchange messages and a
    sample of the raw connections still answers PINGREQ. Client sockets and broker sockets
    live in two processes, so each needs 10,000 descriptors plus headroom, not 20,000."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = CONNECTIONS + FD_HEADROOM
    if hard != resource.RLIM_INFINITY and hard < needed:
        pytest.skip(f"RLIMIT_NOFILE hard limit {hard} < {needed}: cannot hold {CONNECTIONS} "
                    f"sockets in one process")
    target = hard if hard == resource.RLIM_INFINITY or hard < 65536 else 65536
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, target), hard))
    try:
        # The child inherits the raised limit. Warnings only: 10,000 connect lines would fill
        # the stderr pipe, which this test reads only after the broker stopped.
        server = started("--log-level", "warning")
        subscriber = PahoClient(server.mqtt, "crowd-sub")  # also warms the credential cache
        subscriber.subscribe("crowd/#", qos=1)
        publisher = PahoClient(server.mqtt, "crowd-pub")

        async def scenario() -> None:
            began = time.monotonic()
            streams, failures = await _open_connections(server.mqtt, CONNECTIONS, batch=500)
            took = time.monotonic() - began
            print(f"\n{len(streams)} connections, {CONNECTIONS - len(failures)} CONNACKs "
                  f"in {took:.1f} s")
            try:
                assert not failures, f"{len(failures)} connections failed, e.g. {failures[:5]}"
                assert len(streams) == CONNECTIONS
                await asyncio.to_thread(assert_round_trip, publisher, subscriber, "crowd/check")
                sample = streams[:: CONNECTIONS // 100]
                answers = await asyncio.gather(*(_ping(s) for s in sample))
                assert set(answers) == {encode(PingResp(), MQTT_311)}
                # every one of them is still open: none read EOF
                assert not any(reader.at_eof() for reader, _ in streams)
            finally:
                for _, writer in streams:
                    writer.transport.abort()

        asyncio.run(scenario())
        assert_round_trip(publisher, subscriber, "crowd/after")
        publisher.stop()
        subscriber.stop()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


# ============================================================================ 3. slow consumers

HEALTHY_WINDOW = 50
"""Messages a publisher sends before the healthy subscriber must have them: it keeps up however
slowly this machine runs it, while a stalled one falls behind by thousands."""
SLOW_CONFIG = CONFIG + """
[mqtt]
max_buffered_bytes = 262144
max_queued_messages = 100
"""


def _kernel_send_buffer_max() -> int:
    """The most a TCP socket's send buffer can grow to here (Linux autotuning limit)."""
    try:
        return int(Path("/proc/sys/net/ipv4/tcp_wmem").read_text().split()[2])
    except (OSError, IndexError, ValueError):
        return 4 << 20


def _drain_count(client: RawClient, quiet: float = 1.0) -> int:
    """Read what the server sends until it is quiet for ``quiet`` s; count PUBLISH packets."""
    count = 0
    while True:
        try:
            packet = client.read(quiet)
        except TimeoutError:
            return count
        if packet is None:
            return count
        count += isinstance(packet, Publish)


def test_a_stalled_qos0_subscriber_does_not_stall_others(started):
    """A connected subscriber that stops reading becomes "slow" once more than
    ``max_buffered_bytes`` (here 256 KiB) of its data waits unsent; QoS 0 messages to a slow
    client are dropped (counted, not queued), so the publisher and every other subscriber go on.

    Here a raw subscriber with a tiny receive buffer never reads after its SUBACK. The publisher
    sends 20,000 x 1 KiB QoS 0 messages in chunks of 100, each chunk once the healthy paho
    subscriber has the previous one (so the healthy one, a Python client, never itself falls
    256 KiB behind: a client that cannot keep up with an unpaced flood gets QoS 0 drops too, by
    design), then a QoS 1 sentinel. The healthy subscriber gets all of them in order plus the
    sentinel; for the stalled one no more than the socket buffers (a few MiB on loopback) plus
    256 KiB was kept, the rest was dropped."""
    server = started("--flush", "async", config=SLOW_CONFIG)
    topic, count, chunk = "slow/t", 20_000, 100
    stalled = RawClient(server.mqtt, MQTT_311, rcvbuf=4096)
    assert stalled.connect(client_id="stalled-qos0").reason_code == 0
    stalled.send(Subscribe(1, (Subscription(topic, 0),)))
    assert stalled.expect(SubAck).reason_codes == (0,)

    healthy = PahoClient(server.mqtt, "healthy-qos0")
    assert [r.value for r in healthy.subscribe(topic, qos=1)] == [1]
    publisher = PahoClient(server.mqtt, "publisher-qos0")
    body = b"x" * 1024
    began = time.monotonic()
    seqs: list[int] = []
    for first in range(0, count, chunk):
        for i in range(first, first + chunk):
            publisher.publish(topic, struct.pack("!I", i) + body[4:], qos=0, wait=False)
        while not seqs or seqs[-1] < first + chunk - 1:
            message = healthy.next_message(10)
            seqs.append(struct.unpack("!I", message.payload[:4])[0])
    publisher.publish(topic, b"sentinel", qos=1)
    assert healthy.next_message(10).payload == b"sentinel"
    print(f"\nhealthy subscriber: {len(seqs)}/{count} QoS 0 messages + sentinel in "
          f"{time.monotonic() - began:.1f} s")
    assert seqs == list(range(count)), "the healthy subscriber missed messages or got them out of order"

    stalled_got = _drain_count(stalled)
    print(f"stalled subscriber: {stalled_got} messages were buffered for it")
    # at most what fits in the broker's socket send buffer, its own 256 KiB and our receive buffer
    kept_at_most = min(count // 2, (_kernel_send_buffer_max() + 2 * 262144) // 1024)
    assert stalled_got <= kept_at_most, \
        f"{stalled_got} messages were kept for the stalled client (bound {kept_at_most})"
    assert_round_trip(publisher, healthy, topic)
    stalled.close()
    publisher.stop()
    healthy.stop()


def test_a_stalled_qos1_subscriber_does_not_stall_others(started):
    """A non-persistent QoS 1 subscriber that never reads (and never acks) fills its Receive
    Maximum window (10 here); what comes after waits in an in-memory queue of
    ``max_queued_messages`` (100 here), and beyond that messages for it are dropped and a warning
    is logged. Persistent sessions do not drop: they read their stored queue at their own pace.
    A healthy QoS 1 subscriber on the same topic gets every message, in order."""
    server = started("--flush", "async", config=SLOW_CONFIG)
    topic, count = "slowq1/t", 2_000
    stalled = RawClient(server.mqtt, MQTT_5, rcvbuf=4096)
    assert stalled.connect(client_id="stalled-qos1",
                           properties=Properties(receive_maximum=10)).reason_code == 0
    stalled.send(Subscribe(1, (Subscription(topic, 1),)))
    assert stalled.expect(SubAck).reason_codes == (1,)

    healthy = PahoClient(server.mqtt, "healthy-qos1")
    assert [r.value for r in healthy.subscribe(topic, qos=1)] == [1]
    publisher = PahoClient(server.mqtt, "publisher-qos1")
    body = b"y" * 1024
    began = time.monotonic()
    seqs = []
    for start in range(0, count, HEALTHY_WINDOW):  # healthy is never more than a window behind
        infos = [publisher.publish(topic, struct.pack("!I", i) + body[4:], qos=1, wait=False)
                 for i in range(start, min(start + HEALTHY_WINDOW, count))]
        for info in infos:
            info.wait_for_publish(30)
            assert info.is_published()
        for _ in infos:
            message = healthy.next_message(30)
            seqs.append(struct.unpack("!I", message.payload[:4])[0])
    print(f"\nhealthy QoS 1 subscriber: {len(seqs)}/{count} in {time.monotonic() - began:.1f} s")
    assert seqs == list(range(count))

    stalled_got = _drain_count(stalled)
    assert stalled_got <= 10, f"stalled client got {stalled_got} > its Receive Maximum of 10"
    stalled.close()
    publisher.stop()
    healthy.stop()
    assert server.stop() == 0
    log = server.log()
    assert "stalled-qos1 is not keeping up" in log, log[-3000:]


# ============================================================================ 4. keep alive


@pytest.mark.parametrize("version", [MQTT_311, MQTT_5], ids=["v311", "v5"])
def test_keepalive_timeout_closes_a_silent_client(started, version):
    """A client with keep alive 1 s that sends nothing after CONNACK is closed after 1.5 s
    of silence (the broker sweeps once per second, so within ~2.5 s); an MQTT 5 client is told
    why first (DISCONNECT 0x8D Keep Alive timeout). One that sends PINGREQs stays connected."""
    server = started()
    silent = RawClient(server.mqtt, version)
    connected_at = time.monotonic()  # before CONNECT: the broker's silence clock starts later
    assert silent.connect(keep_alive=1).reason_code == 0

    pinging = RawClient(server.mqtt, version)
    assert pinging.connect(keep_alive=1).reason_code == 0
    stop = threading.Event()
    pongs: list[Packet] = []

    def ping() -> None:
        while not stop.wait(0.4):  # pacing of the protocol's own heartbeat, not a test wait
            pinging.send(PingReq())
            pongs.append(pinging.read(2))

    pinger = threading.Thread(target=ping, daemon=True)
    pinger.start()
    before_close = silent.read_until_closed(timeout=30)
    elapsed = time.monotonic() - connected_at
    silent.close()
    # never before one and a half keep-alives; a loaded machine can only make it later
    assert elapsed >= 1.4, f"closed after {elapsed:.2f} s"
    assert before_close == ([Disconnect(0x8D)] if version == MQTT_5 else [])
    stop.set()
    pinger.join(5)
    assert pongs and all(isinstance(p, PingResp) for p in pongs), pongs
    pinging.send(PingReq())
    assert isinstance(pinging.read(2), PingResp), "the pinging client was closed too"
    pinging.close()


# ============================================================================ 5. authentication


def _refused(server: Server, version: int, username: str | None, password: str | None) -> list:
    """CONNECT with these credentials and at once a SUBSCRIBE; return every packet that came
    back before the server closed the connection."""
    client = RawClient(server.mqtt, version)
    client.send(Connect(client_id="", keep_alive=60, username=username,
                        password=None if password is None else password.encode()))
    try:
        client.send(Subscribe(1, (Subscription("#", 0),)))
    except (BrokenPipeError, ConnectionResetError):
        pass
    try:
        return client.read_until_closed()
    finally:
        client.close()


@pytest.mark.parametrize("version", [MQTT_311, MQTT_5], ids=["v311", "v5"])
def test_bad_credentials_are_refused(started, version):
    """Wrong password or unknown user: 3.1.1 CONNACK return code 4 (bad user name or password),
    5.0 reason 0x86. No credentials (anonymous access is off): a failure CONNACK (3.1.1: 4 or 5;
    5.0: 0x86 or 0x87). Then the connection is closed: the SUBSCRIBE sent right behind the
    CONNECT gets no SUBACK. The right credentials still work."""
    server = started()
    bad_password = {MQTT_311: 4, MQTT_5: 0x86}[version]
    anonymous = {MQTT_311: (4, 5), MQTT_5: (0x86, 0x87)}[version]
    for username, password, expected in (("sluice", "wrong", (bad_password,)),
                                         ("nobody", "x", (bad_password,)),
                                         (None, None, anonymous)):
        got = _refused(server, version, username, password)
        assert len(got) == 1 and isinstance(got[0], ConnAck) and got[0].reason_code in expected, \
            f"{username}/{password}: expected only CONNACK {expected} then close, got {got}"
    client = RawClient(server.mqtt, version)
    assert client.connect().reason_code == 0
    client.close()


def sluice_cli(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "sluice.cli", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, env=clean_env())
    assert done.returncode == 0, f"sluice {' '.join(args)}: {done.stdout}{done.stderr}"
    return done.stdout


def test_authorization_limits_a_user_to_its_topics(started):
    """bob may publish and subscribe only on native topic ``devices`` (the first MQTT level):
    SUBSCRIBE to ``secret/#`` gets 0x87 (MQTT 5) / 0x80 (3.1.1), a QoS 1 PUBLISH to
    ``secret/x`` gets PUBACK 0x87 and is not delivered; ``devices/...`` works both ways."""
    server = started()
    admin = ["--admin", server.admin, "--user", USER, "--password", PASSWORD]
    sluice_cli("user", "create", "bob", "--new-password", "pw", *admin)
    sluice_cli("user", "grant", "bob", "topic", "devices", "publish", "subscribe", *admin)

    watcher = PahoClient(server.mqtt, "watcher")  # the admin sees everything bob gets through
    watcher.subscribe("#", qos=1)

    v5 = RawClient(server.mqtt, MQTT_5)
    assert v5.connect(username="bob", password="pw", client_id="bob-v5").reason_code == 0
    v5.send(Subscribe(1, (Subscription("secret/#", 1), Subscription("devices/#", 1))))
    assert v5.expect(SubAck).reason_codes == (0x87, 1)
    v5.send(Publish("secret/x", b"leak", 1, packet_id=7))
    assert v5.expect(PubAck) == PubAck(7, 0x87)
    v5.send(Publish("devices/d1/telemetry", b"ok", 1, packet_id=8))
    got = {}
    for _ in range(2):  # PUBACK 8 and bob's own message coming back, in either order
        packet = v5.read()
        got[type(packet)] = packet
    assert got[PubAck] == PubAck(8, 0)
    assert got[Publish].topic == "devices/d1/telemetry" and got[Publish].payload == b"ok"
    v5.send(PubAck(got[Publish].packet_id))

    message = watcher.next_message()
    assert (message.topic, message.payload) == ("devices/d1/telemetry", b"ok")

    v311 = RawClient(server.mqtt, MQTT_311)
    assert v311.connect(username="bob", password="pw", client_id="bob-v311").reason_code == 0
    v311.send(Subscribe(2, (Subscription("secret/#", 0), Subscription("devices/+/cmd", 0))))
    assert v311.expect(SubAck).reason_codes == (0x80, 0)
    watcher.publish("secret/y", b"hidden", qos=1)
    watcher.publish("devices/d2/cmd", b"reboot", qos=1)
    delivered = v311.expect(Publish)
    assert (delivered.topic, delivered.payload) == ("devices/d2/cmd", b"reboot")

    # the refused secret/x was never stored: the watcher's next message is its own secret/y
    seen = [watcher.next_message() for _ in range(2)]
    assert [(m.topic, m.payload) for m in seen] == [("secret/y", b"hidden"),
                                                     ("devices/d2/cmd", b"reboot")]
    v5.close()
    v311.close()
    watcher.stop()


def test_mqtt5_clients_are_told_the_server_shuts_down(started):
    """On SIGTERM an MQTT 5 client gets DISCONNECT 0x8B (Server shutting down) before the close;
    a 3.1.1 client is just closed."""
    server = started()
    v5 = RawClient(server.mqtt, MQTT_5)
    assert v5.connect().reason_code == 0
    v311 = RawClient(server.mqtt, MQTT_311)
    assert v311.connect().reason_code == 0
    server.process.terminate()
    assert v5.read_until_closed(timeout=30) == [Disconnect(0x8B)]
    assert v311.read_until_closed(timeout=30) == []
    v5.close()
    v311.close()
    assert server.process.wait(30) == 0


def test_protocol_errors_are_logged(started):
    """The broker's log names a connection it closed for a protocol error (read after stop)."""
    server = started(config=SMALL_PACKETS)
    client = RawClient(server.mqtt, MQTT_5)
    assert client.connect(client_id="logged-bad-client").reason_code == 0
    client.send(encode(Publish("a/+/b", b"x"), MQTT_5))
    assert client.read_until_closed() == [Disconnect(0x90)]
    client.close()
    assert server.stop() == 0
    log = server.log()
    assert "logged-bad-client" in log, \
        f"no log line about the protocol error of logged-bad-client:\n{log[-3000:]}"


def test_a_stalled_v311_qos1_subscriber_does_not_grow_broker_memory(started):
    """A non-persistent MQTT 3.1.1 QoS 1 subscriber that never reads (3.1.1 has no Receive
    Maximum): live QoS 1 messages stop at ``max_buffered_bytes`` of unsent data, then queue up
    to ``max_queued_messages``; the rest are dropped and logged, so the broker holds at most
    the kernel buffers + max_buffered_bytes + max_queued_messages for it."""
    server = started("--flush", "async", config=SLOW_CONFIG)
    topic, count = "slow311/t", 8_000
    stalled = RawClient(server.mqtt, MQTT_311, rcvbuf=4096)
    assert stalled.connect(client_id="stalled-v311-qos1").reason_code == 0
    stalled.send(Subscribe(1, (Subscription(topic, 1),)))
    assert stalled.expect(SubAck).reason_codes == (1,)
    publisher = PahoClient(server.mqtt, "publisher-v311-qos1")
    body = b"z" * 1024
    infos = [publisher.publish(topic, struct.pack("!I", i) + body[4:], qos=1, wait=False)
             for i in range(count)]
    for info in infos:
        info.wait_for_publish(30)
    got = _drain_count(stalled, quiet=2.0)
    bound = (_kernel_send_buffer_max() + 2 * 262144) // 1024 + 100
    stalled.close()
    publisher.stop()
    assert got <= bound, f"broker kept {got} of {count} messages for a stalled client (bound {bound})"
