"""The MQTT benchmark's load generator: raw-socket MQTT 3.1.1 publishers and subscribers, each in
its own spawned process, the same code for every broker (and for the discard server that
measures the generator's own ceiling).

Flow control is what a user's own clients would do: each publisher keeps at most ``window``
messages in flight that its slowest subscriber has not yet received, and a QoS 1 publisher also
at most ``window`` unacknowledged publishes. Every message carries its publisher's index, its
sequence number and its send time (the payload header in ``mqtt_wire``). After each batch of
reads, a subscriber process writes, for each publisher, the sequence number reached on all of its
connections (the lowest) as 8 bytes to a pipe to that publisher, once that has moved by a
quarter of the window since the last report (every move once the measured window is over), the
way credit-based flow control returns credit in batches. A publisher selects on those pipes and
its socket, and sends as many messages as its window allows in one write. Nothing sleeps or
polls: every process blocks in ``select`` (with a timeout only until a point of the schedule:
a paced publisher's next message, the end of the measured window).

A run has a fixed length (``Schedule``): ``warmup`` seconds left out of the statistics, then
``measured`` seconds. Throughput is the messages the subscribers received inside the measured
window divided by its length; one-way latencies (receive time minus the send time in the
payload, every ``sample_every``-th message) come from that window only. Then the publishers
stop, wait until their last message has arrived (at most ``DRAIN`` seconds), and every message
a subscriber connection never got is counted as lost. ``time.monotonic_ns()`` is one system-wide
clock on Linux, so send and receive times compare across processes.

Per-message work stays in C where it can, so that the generator is not what a run measures: a
publisher copies a slice of its pre-encoded ``mqtt_wire.Ring`` and stamps it column by column;
a subscriber checks whether a read holds whole PUBLISH packets that all share one header shape
(the usual case) and then takes publisher indices, packet ids and send times out as strided
slices. Anything else goes through a packet-by-packet scan.
"""
from __future__ import annotations

import multiprocessing
import os
import queue
import selectors
import socket
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from . import mqtt_wire as wire

LOOPBACK = "127.0.0.1"
READY = "ready"
_SPAWN = multiprocessing.get_context("spawn")
START_TIMEOUT = 60.0
"""Time for a load process to start, connect and subscribe."""
DRAIN = 2.0
"""Seconds a publisher waits, after the run, for its last messages to arrive (QoS 0 ones a broker
dropped never do)."""
BATCH = 256
"""Messages per write at most, when no window bounds them (publishers without subscribers)."""
RECV_SIZE = 1 << 16
"""Bytes per socket read: under glibc's 128 KiB mmap threshold, so a read does not map and unmap its
buffer (which cost about 25 us a read at 256 KiB)."""
FEEDBACK_READ = 8 * 512
"""Bytes a publisher reads from a feedback pipe at once: a multiple of the 8-byte reports, which
pipes write atomically, so a read holds whole reports."""
UNBOUNDED = 1 << 62


@dataclass(frozen=True)
class PubSpec:
    """One publisher process: one connection publishing to ``topics`` round-robin (all of the same
    encoded length)."""

    client_id: str
    topics: tuple[str, ...]
    qos: int
    size: int = 100
    window: int = 64
    """Messages in flight at most: not yet received by the slowest subscriber, and at QoS 1 not
    yet acknowledged."""
    rate: float = 0.0
    """Messages per second; 0 sends as fast as the window allows."""


@dataclass(frozen=True)
class SubSpec:
    """One subscriber process holding a connection per (client id, topic filter, QoS). Every
    connection is expected to receive every publisher's messages."""

    connections: tuple[tuple[str, str, int], ...]
    sample_every: int = 8
    """Take the latency of every this-many-th message received (0: none)."""
    clean: bool = True
    """Clean sessions; False connects with clean session 0 (a persistent session, whose
    subscriptions and undelivered QoS 1 messages the broker keeps), and after the run connects
    each client id once more with clean session 1 and disconnects, so that the broker drops it."""


@dataclass(frozen=True)
class Schedule:
    """A run's length: ``warmup`` seconds, then ``measured`` ones."""

    warmup: float = 2.0
    measured: float = 6.0


@dataclass(frozen=True)
class Published:
    sent: int
    in_window: int
    """Messages written during the measured window."""
    cpu: float = 0.0


@dataclass(frozen=True)
class Received:
    received: int
    """Deliveries to all of the process's connections, the whole run."""
    in_window: int
    connections: int
    latencies_ns: list[int] = field(default_factory=list)
    cpu: float = 0.0


@dataclass(frozen=True)
class LoadRun:
    """One run's figures, publisher and subscriber sides."""

    published: int
    received: int
    expected: int
    """Deliveries the run should have made: every message to every subscriber connection."""
    window_published: int
    window_received: int
    seconds: float
    """The measured window's length."""
    latencies_ns: list[int]
    client_cpu: float
    probed: float | None = None
    """How much the run's probe moved over the measured window."""

    @property
    def msg_per_s(self) -> float:
        return self.window_received / self.seconds if self.seconds > 0 else 0.0

    @property
    def publish_msg_per_s(self) -> float:
        return self.window_published / self.seconds if self.seconds > 0 else 0.0

    @property
    def lost(self) -> int:
        return max(0, self.expected - self.received)


def run_load(port: int | tuple[str, int], publishers: list[PubSpec], subscribers: list[SubSpec], timeout: float,
             schedule: Schedule = Schedule(), probe: Callable[[], float | None] | None = None) -> LoadRun:
    """Run ``subscribers`` then ``publishers`` against the MQTT server on loopback ``port``;
    ``probe`` (e.g. a broker's CPU seconds) is read as the measured window opens and closes.
    Publishers without subscribers are bounded by nothing but their PUBACKs."""
    results = _SPAWN.Queue()
    credit = max(1, min((spec.window for spec in publishers), default=1) // 4)
    pipes = [[_SPAWN.Pipe(duplex=False) for _ in publishers] for _ in subscribers]
    """``pipes[s][p]``: (reader, writer) from subscriber process ``s`` to publisher ``p``."""
    controls: list[Any] = []
    children: list[multiprocessing.process.BaseProcess] = []
    received: list[Received] = []

    def start(work: Any, name: str, *args: Any) -> None:
        control, controls_end = _SPAWN.Pipe(duplex=False)
        child = _SPAWN.Process(target=_child, args=(work, results, control, *args), name=name)
        child.start()
        control.close()
        controls.append(controls_end)
        children.append(child)

    def collect(kind: Any, deadline: float) -> Any:
        """The next report of ``kind``; subscribers' reports arriving first are kept."""
        while True:
            report = _expect(results, (kind, Received), deadline, children)
            if isinstance(report, Received) and kind is not Received:
                received.append(report)
                continue
            return report

    try:
        deadline = time.monotonic() + START_TIMEOUT
        for index, spec in enumerate(subscribers):
            start(_subscribe, f"mqtt-subscriber-{index}", port, spec, max(1, len(publishers)),
                  [writer for _, writer in pipes[index]], credit, schedule)
        for _ in subscribers:
            collect(str, deadline)
        for index, spec in enumerate(publishers):
            start(_publish, f"mqtt-publisher-{index}", port, spec, index,
                  [to_publishers[index][0] for to_publishers in pipes], schedule)
        for _ in publishers:
            collect(str, deadline)
        for to_publishers in pipes:  # the children hold their own ends now; a dead one shows as EOF
            for reader, writer in to_publishers:
                reader.close()
                writer.close()
        started_ns = time.monotonic_ns()
        for control in controls:
            os.write(control.fileno(), started_ns.to_bytes(8, "little"))
        window_start, window_end = _window(schedule, started_ns)
        probed = None
        if probe is not None:
            _sleep_until(window_start)
            before = probe()
            _sleep_until(window_end)
            after = probe()
            probed = None if before is None or after is None else after - before
        deadline = time.monotonic() + schedule.warmup + schedule.measured + DRAIN + timeout
        published = [collect(Published, deadline) for _ in publishers]
        if not publishers:
            _sleep_until(window_end)
        for control in controls[:len(subscribers)]:
            os.write(control.fileno(), b"stop....")
        while len(received) < len(subscribers):
            received.append(collect(Received, deadline))
        for child in children:
            child.join(START_TIMEOUT)
    finally:
        for child in children:
            if child.is_alive():
                child.terminate()
                child.join()
        for control in controls:
            control.close()
        results.close()
    return _sum_up(schedule, published, received, probed)


def _sum_up(schedule: Schedule, published: list[Published], received: list[Received],
            probed: float | None) -> LoadRun:
    sent = sum(p.sent for p in published)
    return LoadRun(
        published=sent,
        received=sum(r.received for r in received),
        expected=sent * sum(r.connections for r in received),
        window_published=sum(p.in_window for p in published),
        window_received=sum(r.in_window for r in received),
        seconds=schedule.measured,
        latencies_ns=[value for r in received for value in r.latencies_ns],
        client_cpu=sum(p.cpu for p in published) + sum(r.cpu for r in received),
        probed=probed)


def _window(schedule: Schedule, started_ns: int) -> tuple[int, int]:
    """The measured window's start and end, in ``time.monotonic_ns()`` time."""
    start = started_ns + int(schedule.warmup * 1e9)
    return start, start + int(schedule.measured * 1e9)


def _sleep_until(when_ns: int) -> None:
    """Wait for a point of the run's schedule (the parent only: it has nothing else to do)."""
    time.sleep(max(0.0, (when_ns - time.monotonic_ns()) / 1e9))


# -- children ---------------------------------------------------------------------------------

def _child(work: Any, results: Any, control: Any, *args: Any) -> None:
    """Entry point of a spawned load process: run ``work``, put its report (with the CPU time the
    process used) on ``results``; a failure goes there as its traceback."""
    try:
        started = time.process_time()
        report = work(results, control, *args)
        results.put(replace(report, cpu=time.process_time() - started))
    except BaseException:
        results.put(("error", work.__name__, traceback.format_exc()))
        raise SystemExit(1) from None


def _read_start(control: Any) -> int:
    """Block until the parent writes the run's start time."""
    data = os.read(control.fileno(), 8)
    if len(data) != 8:
        raise RuntimeError("the benchmark process went away before the run started")
    return int.from_bytes(data, "little")


def _connect(port: int | tuple[str, int], client_id: str, clean: bool = True) -> socket.socket:
    """``port`` on loopback, or a (host, port) of its own (a cluster node on 127.0.0.x). Every
    client id is a new one, so the session-present flag of a persistent session's CONNACK is 0."""
    sock = socket.create_connection(port if isinstance(port, tuple) else (LOOPBACK, port), timeout=START_TIMEOUT)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(wire.connect(client_id, clean=clean))
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


def _publish(results: Any, control: Any, port: int | tuple[str, int], spec: PubSpec, index: int, feedback: list[Any],
             schedule: Schedule) -> Published:
    sock = _connect(port, spec.client_id)
    sock.settimeout(None)
    ring = wire.Ring(index, spec.topics, spec.qos, spec.size)
    results.put(READY)
    return _Publisher(sock, ring, spec, feedback).run(_read_start(control), schedule)


class _Publisher:
    """One publishing connection and what bounds it: the subscribers' feedback and its PUBACKs.

    PUBACKs usually arrive before the feedback (a broker acknowledges before it delivers), so the
    publisher reads them only when they are what holds it back, or without waiting when the
    window needs them: waking for each one would double the generator's cost per message."""

    def __init__(self, sock: socket.socket, ring: wire.Ring, spec: PubSpec, feedback: list[Any]) -> None:
        self.sock, self.ring, self.spec = sock, ring, spec
        self.feedback_only = selectors.DefaultSelector()
        self.with_acks = selectors.DefaultSelector()
        self.with_acks.register(sock, selectors.EVENT_READ, -1)
        for position, reader in enumerate(feedback):
            for selector in (self.feedback_only, self.with_acks):
                selector.register(reader.fileno(), selectors.EVENT_READ, position)
        self.reached = [0] * len(feedback)
        self.slowest = 0 if feedback else UNBOUNDED
        """Messages the slowest subscriber process has received (by sequence number)."""
        self.sent = self.acked = 0
        self.pending = b""

    def run(self, started_ns: int, schedule: Schedule) -> Published:
        """Publish until the end of the measured window, then wait for the last deliveries."""
        window_start, window_end = _window(schedule, started_ns)
        interval = int(1e9 / self.spec.rate) if self.spec.rate else 0
        at_window_start = None
        while True:
            now = time.monotonic_ns()
            if at_window_start is None and now >= window_start:
                at_window_start = self.sent
            if now >= window_end:
                break
            due = started_ns + self.sent * interval
            if now < due:
                self._wait((due - now) / 1e9, acks=False)
                continue
            room = min(self._room(), 1 if interval else BATCH)
            if room > 0:
                self.sock.sendall(self.ring.take(self.sent, room, now))
                self.sent += room
            else:
                self._wait((window_end - now) / 1e9, acks=self.spec.qos and self.sent - self.acked >= self.spec.window)
        at_window_end = self.sent
        self._drain()
        self.sock.sendall(wire.DISCONNECT_PACKET)
        self.sock.close()
        return Published(self.sent, at_window_end - (at_window_start or 0))

    def _room(self) -> int:
        """Messages the window lets go now."""
        room = self.spec.window - (self.sent - self.slowest)
        if self.spec.qos and room > 0:
            if self.spec.window - (self.sent - self.acked) < room:
                self._read_acks(wait=False)
            room = min(room, self.spec.window - (self.sent - self.acked))
        return room

    def _drain(self) -> None:
        """Wait, at most ``DRAIN`` seconds, until every subscriber has the last message and every
        QoS 1 publish is acknowledged."""
        deadline = time.monotonic() + DRAIN
        while self.slowest < self.sent or (self.spec.qos and self.acked < self.sent):
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self._wait(left, acks=bool(self.spec.qos))

    def _wait(self, timeout: float | None, acks: bool) -> None:
        """Block until feedback (or, with ``acks``, PUBACKs) arrive or ``timeout``; take them in."""
        for key, _ in (self.with_acks if acks else self.feedback_only).select(timeout):
            if key.data < 0:
                self._read_acks(wait=True)
            else:
                self._read_feedback(key.data, key.fd)

    def _read_feedback(self, position: int, fd: int) -> None:
        data = os.read(fd, FEEDBACK_READ)
        if not data:
            raise RuntimeError(f"{self.spec.client_id}: a subscriber process ended during the run")
        self.reached[position] = int.from_bytes(data[-8:], "little")
        self.slowest = min(self.reached)

    def _read_acks(self, wait: bool) -> None:
        try:
            data = self.sock.recv(RECV_SIZE, 0 if wait else socket.MSG_DONTWAIT)
        except BlockingIOError:
            return
        if not data:
            raise RuntimeError(f"{self.spec.client_id}: the server closed the connection after "
                               f"{self.acked} PUBACKs")
        pending = self.pending + data if self.pending else data
        n = len(pending) // 4
        if pending[0:4 * n:4] != b"\x40" * n:
            raise RuntimeError(f"{self.spec.client_id}: expected only PUBACKs, got {pending[:16].hex()}")
        self.pending = pending[4 * n:]
        self.acked += n


class _Connection:
    """One subscriber connection: its unparsed bytes, and per publisher the messages it got and
    the sequence number it has reached."""

    __slots__ = ("sock", "pending", "received", "reached")

    def __init__(self, sock: socket.socket, publishers: int) -> None:
        self.sock = sock
        self.pending = b""
        self.received = [0] * publishers
        self.reached = [0] * publishers

    def saw(self, publisher: int, count: int, buffer: bytes, payload_at: int) -> None:
        """``count`` messages of ``publisher`` arrived, the last of them at ``payload_at``."""
        self.received[publisher] += count
        seq = (buffer[payload_at + wire.SLOT_AT] << 8 | buffer[payload_at + wire.SLOT_AT + 1]) + \
            int.from_bytes(buffer[payload_at + wire.BASE_AT:payload_at + wire.SENT_AT], "big")
        if seq >= self.reached[publisher]:
            self.reached[publisher] = seq + 1


class _Tally:
    """A subscriber process's figures for the measured window."""

    def __init__(self, window: tuple[int, int], sample_every: int) -> None:
        self.start, self.end = window
        self.sample_every = sample_every
        self.next_sample = 0
        """Index, in the next batch of messages, of the next one whose latency is taken."""
        self.in_window = 0
        self.latencies: list[int] = []

    def count(self, messages: int, now: int) -> bool:
        """Count ``messages`` received at ``now``; whether they are inside the window."""
        if not self.start <= now < self.end:
            return False
        self.in_window += messages
        return True

    def sample(self, buffer: bytes, payload_ats: range | list[int], now: int) -> None:
        """Take the latencies of every ``sample_every``-th of the messages at ``payload_ats``."""
        every = self.sample_every
        if not every:
            return
        for payload_at in payload_ats[self.next_sample::every]:
            at = payload_at + wire.SENT_AT
            self.latencies.append(now - int.from_bytes(buffer[at:at + 8], "big"))
        self.next_sample = (self.next_sample - len(payload_ats)) % every


def _subscribe(results: Any, control: Any, port: int | tuple[str, int], spec: SubSpec, publishers: int, feedback: list[Any],
               credit: int, schedule: Schedule) -> Received:
    connections = []
    for client_id, topic_filter, qos in spec.connections:
        sock = _connect(port, client_id, spec.clean)
        sock.sendall(wire.subscribe(1, [(topic_filter, qos)]))
        reply = _read_exactly(sock, 5)
        if reply[0] != 0x90 or reply[4] > 2:
            raise RuntimeError(f"{client_id}: SUBACK {reply.hex()} refuses {topic_filter!r}")
        connections.append(_Connection(sock, publishers))
    selector = selectors.DefaultSelector()
    for connection in connections:
        selector.register(connection.sock, selectors.EVENT_READ, connection)
    selector.register(control.fileno(), selectors.EVENT_READ, None)
    results.put(READY)
    tally = _Tally(_window(schedule, _read_start(control)), spec.sample_every)
    writers: list[int | None] = [writer.fileno() for writer in feedback]
    reported = [0] * len(writers)
    while True:
        left = tally.end - time.monotonic_ns()
        if left <= 0:
            credit = 1  # the publishers are draining: each needs to hear about its last message
        for key, _ in selector.select(left / 1e9 if left > 0 else None):
            connection = key.data
            if connection is None:  # the parent: every publisher is done
                received = _finish(connections, tally)
                if not spec.clean:
                    _end_sessions(port, spec)
                return received
            data = connection.sock.recv(RECV_SIZE)
            if not data:
                raise RuntimeError("the server closed a subscriber connection")
            _absorb(connection.pending + data if connection.pending else data, connection, tally,
                    time.monotonic_ns())
        _report(connections, writers, reported, credit)


def _report(connections: list[_Connection], writers: list[int | None], reported: list[int], credit: int) -> None:
    """Tell each publisher the sequence number all of this process's connections have reached,
    when it moved by ``credit`` or more. A pipe holds 8,192 reports, and a publisher with
    ``window`` messages in flight causes at most ``window`` before it reads them, so the write does
    not block. A publisher held back by the window has ``window`` > ``credit`` messages
    unreported, so it always hears of them."""
    for publisher, writer in enumerate(writers):
        if writer is None:
            continue
        reached = min(connection.reached[publisher] for connection in connections)
        if reached - reported[publisher] < credit:
            continue
        reported[publisher] = reached
        try:
            os.write(writer, reached.to_bytes(8, "little"))
        except BrokenPipeError:  # that publisher is done
            writers[publisher] = None


def _finish(connections: list[_Connection], tally: _Tally) -> Received:
    for connection in connections:
        try:
            connection.sock.sendall(wire.DISCONNECT_PACKET)
            connection.sock.close()
        except OSError:
            pass
    return Received(sum(sum(connection.received) for connection in connections), tally.in_window,
                    len(connections), tally.latencies)


def _end_sessions(port: int | tuple[str, int], spec: SubSpec) -> None:
    """Have the broker drop the persistent sessions of ``spec``: connect each client id with clean
    session 1 (which discards the stored session) and disconnect."""
    for client_id, _, _ in spec.connections:
        sock = _connect(port, client_id, clean=True)
        sock.sendall(wire.DISCONNECT_PACKET)
        sock.close()


def _absorb(buffer: bytes, connection: _Connection, tally: _Tally, now: int) -> None:
    """Take in the whole packets at the start of ``buffer``, received at ``now``: count them,
    answer QoS 1 ones with PUBACKs (one write), keep the rest for the next read."""
    shape = _uniform(buffer)
    if shape is None:
        payload_ats, acks, used = _scan(buffer)
        last: dict[int, int] = {}
        counts = [0] * len(connection.received)
        for payload_at in payload_ats:
            publisher = buffer[payload_at]
            counts[publisher] += 1
            last[publisher] = payload_at
        for publisher, payload_at in last.items():
            connection.saw(publisher, counts[publisher], buffer, payload_at)
    else:
        size, count, topic_end = shape
        used = size * count
        payload_at = topic_end + (2 if buffer[0] & 0x06 else 0)
        payload_ats = range(payload_at, used, size)
        publishers = buffer[payload_at:used:size]
        for publisher in range(len(connection.received)):
            seen = publishers.count(publisher)
            if seen:
                connection.saw(publisher, seen, buffer, publishers.rindex(publisher) * size + payload_at)
        acks = b""
        if buffer[0] & 0x06:
            ack_array = bytearray(b"\x40\x02\x00\x00" * count)
            ack_array[2::4] = buffer[topic_end:used:size]
            ack_array[3::4] = buffer[topic_end + 1:used:size]
            acks = bytes(ack_array)
    connection.pending = buffer[used:]
    if acks:
        connection.sock.sendall(acks)
    if payload_ats and tally.count(len(payload_ats), now):
        tally.sample(buffer, payload_ats, now)


def _uniform(buffer: bytes) -> tuple[int, int, int] | None:
    """(packet size, packets, end of the topic name) when ``buffer`` starts with whole PUBLISH
    packets whose fixed headers and topic lengths are all alike, hence one size each and back to
    back; None otherwise."""
    if len(buffer) < 2 or buffer[0] >> 4 != wire.PUBLISH:
        return None
    length, shift, header = 0, 0, 1
    while True:
        if header >= len(buffer):
            return None
        byte = buffer[header]
        header += 1
        length |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            break
    size = header + length
    count = len(buffer) // size
    if not count or header + 2 > size:
        return None
    used = size * count
    for at in range(header + 2):
        if buffer[at:used:size] != buffer[at:at + 1] * count:
            return None
    return size, count, header + 2 + (buffer[header] << 8 | buffer[header + 1])


def _scan(buffer: bytes) -> tuple[list[int], bytes, int]:
    """Walk the whole packets in ``buffer``: where each PUBLISH's payload starts, the PUBACKs the
    QoS 1 ones call for, and the bytes used."""
    pos, size, payload_ats, acks = 0, len(buffer), [], []
    while pos + 2 <= size:
        first_byte = buffer[pos]
        length = buffer[pos + 1]
        header = pos + 2
        if length >= 0x80:
            length &= 0x7F
            shift = 7
            while True:
                if header >= size:
                    return payload_ats, b"".join(acks), pos
                byte = buffer[header]
                header += 1
                length += (byte & 0x7F) << shift
                shift += 7
                if byte < 0x80:
                    break
        end = header + length
        if end > size:
            break
        if first_byte >> 4 == wire.PUBLISH:
            body = header + 2 + (buffer[header] << 8 | buffer[header + 1])
            if first_byte & 0x06:
                acks.append(b"\x40\x02" + buffer[body:body + 2])
                body += 2
            payload_ats.append(body)
        pos = end
    return payload_ats, b"".join(acks), pos


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
