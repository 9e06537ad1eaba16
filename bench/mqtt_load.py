"""The MQTT benchmark's load generator: raw-socket MQTT 3.1.1 publishers and subscribers, each in
its own spawned process, the same code for every broker (and for the discard server that
measures the generator's own ceiling).

Publishers write pre-encoded PUBLISH packets in batches with ``sendall`` on a blocking socket:
QoS 0 ones as fast as the socket takes them, QoS 1 ones keeping ``window`` publishes
unacknowledged (each PUBACK read lets one more go, all sent in one write per read), and paced ones
(``rate``) stamp ``time.monotonic_ns()`` into the first 8 payload bytes just before the write.
A subscriber process holds one or more connections (``selectors``), walks each read with an
inlined packet scanner that only looks at PUBLISH headers, and answers QoS 1 deliveries with one
write of PUBACKs per read. ``time.monotonic()`` is one system-wide clock on Linux, so send and
receive times compare across the processes.

A run: subscribers connect and subscribe (SUBACK) first, publishers connect (CONNACK), then all
publishers start together. Throughput is what the subscribers received, from the first message
received to the last; a subscriber stops when it has all it expects, or once every publisher is
done and nothing has arrived for ``grace`` seconds (QoS 0 messages a broker dropped; they are
reported as lost).
"""
from __future__ import annotations

import multiprocessing
import queue
import selectors
import socket
import struct
import threading
import time
import traceback
from dataclasses import dataclass, field, replace
from typing import Any

from . import mqtt_wire as wire

LOOPBACK = "127.0.0.1"
READY = "ready"
_SPAWN = multiprocessing.get_context("spawn")
START_TIMEOUT = 60.0
"""Time for a load process to start, connect and subscribe."""
BATCH = 256
"""QoS 0 publishes per write."""
RECV_SIZE = 1 << 18


@dataclass(frozen=True)
class PubSpec:
    """One publisher process: one connection publishing ``messages`` to ``topics`` round-robin."""

    client_id: str
    topics: tuple[str, ...]
    qos: int
    messages: int
    size: int
    window: int = 64
    """QoS 1: publishes unacknowledged at most."""
    rate: float = 0.0
    """Messages per second, each stamped with its send time; 0 sends as fast as possible."""


@dataclass(frozen=True)
class SubSpec:
    """One subscriber process holding a connection per (client id, topic filter, QoS)."""

    connections: tuple[tuple[str, str, int], ...]
    expected: int
    """Messages the connections together should receive."""
    timestamps: bool = False
    """Read the send time from each payload and report one-way latencies."""


@dataclass(frozen=True)
class Published:
    started: float
    finished: float
    messages: int
    cpu: float = 0.0


@dataclass(frozen=True)
class Received:
    first: float
    last: float
    messages: int
    latencies_ns: list[int] = field(default_factory=list)
    cpu: float = 0.0


@dataclass(frozen=True)
class LoadRun:
    """One run's figures, publisher and subscriber sides."""

    published: int
    publish_seconds: float
    received: int
    expected: int
    receive_seconds: float
    """From the first message any subscriber received to the last."""
    latencies_ns: list[int]
    client_cpu: float

    @property
    def publish_msg_per_s(self) -> float:
        return self.published / self.publish_seconds if self.publish_seconds > 0 else 0.0

    @property
    def msg_per_s(self) -> float:
        return self.received / self.receive_seconds if self.receive_seconds > 0 else 0.0

    @property
    def lost(self) -> int:
        return max(0, self.expected - self.received)


def run_load(port: int, publishers: list[PubSpec], subscribers: list[SubSpec], timeout: float,
             grace: float = 2.0) -> LoadRun:
    """Run ``subscribers`` then ``publishers`` against the MQTT server on loopback ``port``."""
    results = _SPAWN.Queue()
    go, publishers_done = _SPAWN.Event(), _SPAWN.Event()
    children: list[multiprocessing.process.BaseProcess] = []
    try:
        for index, spec in enumerate(subscribers):
            child = _SPAWN.Process(target=_child, args=(_subscribe, port, spec, results, publishers_done, grace),
                                   name=f"mqtt-subscriber-{index}")
            child.start()
            children.append(child)
        published: list[Published] = []
        received: list[Received] = []

        def collect(kind: Any, deadline: float) -> Any:
            """The next report of ``kind``; reports of a subscriber already done (one flooded by the
            discard server finishes without publishers) are kept on the way."""
            while True:
                report = _expect(results, (kind, Received), deadline, children)
                if isinstance(report, Received):
                    received.append(report)
                if kind == Received or not isinstance(report, Received):
                    return report

        deadline = time.monotonic() + START_TIMEOUT
        for _ in subscribers:
            collect(str, deadline)
        for index, spec in enumerate(publishers):
            child = _SPAWN.Process(target=_child, args=(_publish, port, spec, results, go, 0.0),
                                   name=f"mqtt-publisher-{index}")
            child.start()
            children.append(child)
        for _ in publishers:
            collect(str, deadline)
        go.set()
        deadline = time.monotonic() + timeout
        for _ in publishers:
            published.append(collect(Published, deadline))
        publishers_done.set()
        deadline = max(deadline, time.monotonic() + grace + 10)
        while len(received) < len(subscribers):
            collect(Received, deadline)
        for child in children:
            child.join(START_TIMEOUT)
    finally:
        for child in children:
            if child.is_alive():
                child.terminate()
                child.join()
        results.close()
    got = [r for r in received if r.messages]
    latencies = [value for r in received for value in r.latencies_ns]
    return LoadRun(
        published=sum(p.messages for p in published),
        publish_seconds=(max(p.finished for p in published) - min(p.started for p in published)) if published else 0.0,
        received=sum(r.messages for r in received),
        expected=sum(s.expected for s in subscribers),
        receive_seconds=(max(r.last for r in got) - min(r.first for r in got)) if got else 0.0,
        latencies_ns=latencies,
        client_cpu=sum(p.cpu for p in published) + sum(r.cpu for r in received))


# -- children ---------------------------------------------------------------------------------

def _child(work: Any, port: int, spec: Any, results: Any, event: Any, grace: float) -> None:
    """Entry point of a spawned load process: run ``work``, put its report (with the CPU time the
    process used) on ``results``; a failure goes there as its traceback."""
    try:
        started = time.process_time()
        report = work(port, spec, results, event, grace)
        results.put(replace(report, cpu=time.process_time() - started))
    except BaseException:
        results.put(("error", work.__name__, traceback.format_exc()))
        raise SystemExit(1) from None


def _connect(port: int, client_id: str) -> socket.socket:
    sock = socket.create_connection((LOOPBACK, port), timeout=START_TIMEOUT)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(wire.connect(client_id))
    reply = _read_exactly(sock, 4)
    if reply != wire.CONNACK_ACCEPTED:
        raise RuntimeError(f"{client_id}: CONNACK {reply.hex()} is not 'accepted'")
    return sock


def _read_exactly(sock: socket.socket, count: int) -> bytes:
    data = b""
    while len(data) < count:
        chunk = sock.recv(count - len(data))
        if not chunk:
            raise RuntimeError("the server closed the connection")
        data += chunk
    return data


def _publish(port: int, spec: PubSpec, results: Any, go: Any, _grace: float) -> Published:
    sock = _connect(port, spec.client_id)
    sock.settimeout(None)
    results.put(READY)
    if not go.wait(START_TIMEOUT * 2):
        raise RuntimeError("never told to start")
    if spec.rate:
        return _publish_paced(sock, spec)
    if spec.qos == 0:
        return _publish_qos0(sock, spec)
    return _publish_qos1(sock, spec)


def _payload(size: int) -> bytes:
    return bytes(i % 251 for i in range(size))


def _publish_qos0(sock: socket.socket, spec: PubSpec) -> Published:
    payload = _payload(spec.size)
    packets = [wire.publish_head(topic, 0, spec.size) + payload for topic in spec.topics]
    count = len(packets)
    ring = [packets[i % count] for i in range(count + BATCH)]
    same = b"".join(ring[:BATCH]) if count == 1 else None
    sent, start = 0, 0
    started = time.monotonic()
    while sent < spec.messages:
        n = min(BATCH, spec.messages - sent)
        if same is not None and n == BATCH:
            sock.sendall(same)
        else:
            sock.sendall(b"".join(ring[start:start + n]))
            start = (start + n) % count
        sent += n
    finished = time.monotonic()
    sock.sendall(wire.DISCONNECT_PACKET)
    sock.close()
    return Published(started, finished, sent)


def _publish_qos1(sock: socket.socket, spec: PubSpec) -> Published:
    """Keep ``window`` publishes unacknowledged; each read of PUBACKs releases as many more."""
    payload = _payload(spec.size)
    heads = [wire.publish_head(topic, 1, spec.size) for topic in spec.topics]
    ids, topic_count = wire.PACKET_IDS, len(heads)
    state = {"id": 0, "topic": 0}

    def packets(n: int) -> bytes:
        parts, packet_id, topic = [], state["id"], state["topic"]
        for _ in range(n):
            packet_id = packet_id % 65535 + 1
            parts += (heads[topic], ids[packet_id], payload)
            topic = topic + 1 if topic + 1 < topic_count else 0
        state["id"], state["topic"] = packet_id, topic
        return b"".join(parts)

    started = time.monotonic()
    sent = min(spec.window, spec.messages)
    sock.sendall(packets(sent))
    acked, pending = 0, b""
    while acked < spec.messages:
        data = sock.recv(RECV_SIZE)
        if not data:
            raise RuntimeError(f"{spec.client_id}: the server closed the connection after {acked} PUBACKs")
        pending += data
        n = len(pending) // 4
        if pending[0:4 * n:4] != b"\x40" * n:
            raise RuntimeError(f"{spec.client_id}: expected only PUBACKs, got {pending[:16].hex()}")
        pending = pending[4 * n:]
        acked += n
        more = min(n, spec.messages - sent)
        if more:
            sock.sendall(packets(more))
            sent += more
    finished = time.monotonic()
    sock.sendall(wire.DISCONNECT_PACKET)
    sock.close()
    return Published(started, finished, acked)


def _publish_paced(sock: socket.socket, spec: PubSpec) -> Published:
    """``spec.rate`` messages a second, each stamped with ``time.monotonic_ns()`` as it is written;
    a thread drains the PUBACKs of QoS 1 publishes."""
    heads = [wire.publish_head(topic, spec.qos, spec.size) for topic in spec.topics]
    padding = _payload(max(0, spec.size - 8))
    acks = {"count": 0}
    if spec.qos:
        def drain() -> None:
            pending = 0
            while True:
                data = sock.recv(RECV_SIZE)
                if not data:
                    return
                pending += len(data)
                acks["count"] = pending // 4
        reader = threading.Thread(target=drain, daemon=True)
        reader.start()
    interval = 1.0 / spec.rate
    started = time.monotonic()
    for index in range(spec.messages):
        due = started + index * interval
        delay = due - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        packet_id = wire.PACKET_IDS[index % 65535 + 1] if spec.qos else b""
        sock.sendall(heads[index % len(heads)] + packet_id + struct.pack(">Q", time.monotonic_ns()) + padding)
    finished = time.monotonic()
    if spec.qos:
        deadline = time.monotonic() + 10
        while acks["count"] < spec.messages and time.monotonic() < deadline:
            time.sleep(0.01)
    sock.sendall(wire.DISCONNECT_PACKET)
    sock.shutdown(socket.SHUT_WR)
    return Published(started, finished, spec.messages)


class _Connection:
    """One subscriber connection's unparsed bytes."""

    __slots__ = ("sock", "pending")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.pending = b""


def _subscribe(port: int, spec: SubSpec, results: Any, publishers_done: Any, grace: float) -> Received:
    connections = []
    for client_id, topic_filter, qos in spec.connections:
        sock = _connect(port, client_id)
        sock.sendall(wire.subscribe(1, [(topic_filter, qos)]))
        reply = _read_exactly(sock, 5)
        if reply[0] != 0x90 or reply[4] > 2:
            raise RuntimeError(f"{client_id}: SUBACK {reply.hex()} refuses {topic_filter!r}")
        connections.append(_Connection(sock))
    selector = selectors.DefaultSelector()
    for connection in connections:
        selector.register(connection.sock, selectors.EVENT_READ, connection)
    results.put(READY)

    received, first, last = 0, 0.0, 0.0
    latencies: list[int] = []
    stamps = spec.timestamps
    idle_since = time.monotonic()
    while received < spec.expected:
        events = selector.select(0.1)
        if not events:
            now = time.monotonic()
            if publishers_done.is_set() and now - max(idle_since, last) >= grace:
                break
            continue
        for key, _ in events:
            connection = key.data
            data = connection.sock.recv(RECV_SIZE)
            now_ns = time.monotonic_ns()
            now = now_ns / 1e9
            if not data:
                raise RuntimeError("the server closed a subscriber connection")
            if not received:
                first = now
            buffer = connection.pending + data if connection.pending else data
            count, acks, stamp_list, used = _scan(buffer, stamps)
            connection.pending = buffer[used:]
            if count:
                received += count
                last = now
                if stamp_list:
                    latencies += [now_ns - stamp for stamp in stamp_list]
            if acks:
                connection.sock.sendall(acks)
    for connection in connections:
        try:
            connection.sock.sendall(wire.DISCONNECT_PACKET)
            connection.sock.close()
        except OSError:
            pass
    return Received(first, last, received, latencies)


def _scan(buffer: bytes, stamps: bool) -> tuple[int, bytes, list[int], int]:
    """Walk the whole packets in ``buffer``: how many PUBLISH, the PUBACKs their QoS 1 ones call
    for, their send stamps (when ``stamps``), and the bytes used."""
    pos, size, count, acks, stamp_list = 0, len(buffer), 0, [], []
    while pos + 2 <= size:
        first_byte = buffer[pos]
        length = buffer[pos + 1]
        header = pos + 2
        if length >= 0x80:
            length &= 0x7F
            shift = 7
            while True:
                if header >= size:
                    return count, b"".join(acks), stamp_list, pos
                byte = buffer[header]
                header += 1
                length += (byte & 0x7F) << shift
                shift += 7
                if byte < 0x80:
                    break
        end = header + length
        if end > size:
            break
        if first_byte >> 4 == 3:
            count += 1
            if first_byte & 0x06 or stamps:
                body = header + 2 + (buffer[header] << 8 | buffer[header + 1])
                if first_byte & 0x06:
                    acks.append(b"\x40\x02" + buffer[body:body + 2])
                    body += 2
                if stamps:
                    stamp_list.append(int.from_bytes(buffer[body:body + 8], "big"))
        pos = end
    return count, b"".join(acks), stamp_list, pos


# -- the parent's side ------------------------------------------------------------------------

def _expect(results: Any, kind: Any, deadline: float,
            children: list[multiprocessing.process.BaseProcess]) -> Any:
    """The next report from the load processes, which must be a ``kind`` (a class or a tuple of
    them; ``str`` stands for READY); raises on error or timeout."""
    while True:
        try:
            report = results.get(timeout=max(0.0, min(1.0, deadline - time.monotonic())))
        except queue.Empty:
            dead = [child for child in children if not child.is_alive() and child.exitcode != 0]
            if dead:
                raise RuntimeError(f"{dead[0].name} died with exit code {dead[0].exitcode}") from None
            if time.monotonic() >= deadline:
                name = "/".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
                raise RuntimeError(f"no report from the MQTT load processes in time (waiting for {name})") from None
            continue
        if isinstance(report, tuple) and report and report[0] == "error":
            raise RuntimeError(f"{report[1]} failed:\n{report[2]}")
        if isinstance(report, kind):
            return report
        raise RuntimeError(f"unexpected report {report!r} (waiting for {kind!r})")
