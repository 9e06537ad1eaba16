"""The AMQP benchmark's load generator: pika publishers and consumers, each in its own spawned
process, the same code for every broker.

pika's asynchronous ``SelectConnection`` is used, as in the native section (``rabbit_clients``):
on the 2-core development machine it drove RabbitMQ about 2.5 times faster than aio-pika.

Publisher (one connection, one channel, ``confirm.select``): persistent messages
(``delivery_mode=2``) to one exchange, round-robin over its routing keys, keeping at most
``window`` publishes unconfirmed; each confirm (single or ``multiple``) lets as many more go.
Every payload starts with ``time.monotonic_ns()`` taken just before the publish, so consumers
can compute one-way latency (one system-wide clock on Linux). A paced publisher (``rate``)
publishes on a timer instead, still bounded by the window.
Consumer (one connection, one channel, ``basic.qos(prefetch)`` per consumer, one
``basic.consume`` per queue): acknowledges every delivery as it arrives (``basic.ack``, not
``multiple``).

A run: consumers subscribe (consume-ok) first, publishers open and select confirms, then all
publishers start together. Statistics leave out a warm-up: a consumer notes the time at which it
has received ``warmup`` of what it expects, and the rate is what all consumers received after
that, over the time from the earliest such mark to the last delivery; latencies of warm-up
messages are dropped.
"""
from __future__ import annotations

import multiprocessing
import queue
import time
import traceback
from dataclasses import dataclass, field, replace
from itertools import takewhile
from typing import Any

import pika
from pika.adapters.select_connection import SelectConnection
from pika.channel import Channel

READY = "ready"
_SPAWN = multiprocessing.get_context("spawn")
START_TIMEOUT = 60.0
"""Time for a load process to start, connect and subscribe."""
POLL = 0.005
"""Seconds between looks at the shared start flag, on a publisher's I/O loop."""


@dataclass(frozen=True)
class PubSpec:
    """One publisher process: ``messages`` persistent publishes to ``exchange``, routing keys
    taken round-robin, at most ``window`` unconfirmed."""

    exchange: str
    routing_keys: tuple[str, ...]
    messages: int
    size: int
    window: int
    rate: float = 0.0
    """Publishes per second; 0 publishes as fast as the window allows."""


@dataclass(frozen=True)
class SubSpec:
    """One consumer process: one channel consuming every queue in ``queues``."""

    queues: tuple[str, ...]
    expected: int
    """Deliveries the consumers of this process should receive in all."""
    prefetch: int
    warmup: float
    """Share of ``expected`` received before statistics start."""


@dataclass(frozen=True)
class Published:
    started: float
    finished: float
    confirmed: int
    cpu: float = 0.0


@dataclass(frozen=True)
class Received:
    warm: float
    """When this process had received its warm-up share (``time.monotonic()``)."""
    last: float
    messages: int
    counted: int
    """Messages received after the warm-up mark."""
    latencies_ns: list[int] = field(default_factory=list)
    """One-way latency of each message after the warm-up."""
    cpu: float = 0.0


@dataclass(frozen=True)
class LoadRun:
    """One run's figures, publisher and consumer sides."""

    published: int
    publish_seconds: float
    received: int
    expected: int
    counted: int
    measured_seconds: float
    """From the earliest warm-up mark of a consumer process to the last delivery."""
    latencies_ns: list[int]
    client_cpu: float

    @property
    def msg_per_s(self) -> float:
        return self.counted / self.measured_seconds if self.measured_seconds > 0 else 0.0

    @property
    def publish_msg_per_s(self) -> float:
        return self.published / self.publish_seconds if self.publish_seconds > 0 else 0.0


def run_load(url: str, publishers: list[PubSpec], consumers: list[SubSpec], timeout: float) -> LoadRun:
    """Run ``consumers`` then ``publishers`` against the AMQP broker at ``url``."""
    results = _SPAWN.Queue()
    go = _SPAWN.Event()
    children: list[multiprocessing.process.BaseProcess] = []
    try:
        for index, spec in enumerate(consumers):
            children.append(_start(_consume, url, spec, results, go, f"amqp-consumer-{index}"))
        deadline = time.monotonic() + START_TIMEOUT
        for _ in consumers:
            _expect(results, str, deadline, children)
        for index, spec in enumerate(publishers):
            children.append(_start(_publish, url, spec, results, go, f"amqp-publisher-{index}"))
        for _ in publishers:
            _expect(results, str, deadline, children)
        go.set()
        deadline = time.monotonic() + timeout
        reports = [_expect(results, (Published, Received), deadline, children) for _ in children]
        for child in children:
            child.join(START_TIMEOUT)
    finally:
        for child in children:
            if child.is_alive():
                child.terminate()
                child.join()
        results.close()
    published = [r for r in reports if isinstance(r, Published)]
    received = [r for r in reports if isinstance(r, Received)]
    return LoadRun(
        published=sum(p.confirmed for p in published),
        publish_seconds=max(p.finished for p in published) - min(p.started for p in published),
        received=sum(r.messages for r in received),
        expected=sum(s.expected for s in consumers),
        counted=sum(r.counted for r in received),
        measured_seconds=max(r.last for r in received) - min(r.warm for r in received),
        latencies_ns=[value for r in received for value in r.latencies_ns],
        client_cpu=sum(r.cpu for r in reports))


def _start(work: Any, url: str, spec: Any, results: Any, go: Any, name: str) -> multiprocessing.process.BaseProcess:
    child = _SPAWN.Process(target=_child, args=(work, url, spec, results, go), name=name)
    child.start()
    return child


# -- children ---------------------------------------------------------------------------------

def _child(work: Any, url: str, spec: Any, results: Any, go: Any) -> None:
    """Entry point of a spawned load process: run ``work``, put its report (with the CPU time the
    process used) on ``results``; a failure goes there as its traceback."""
    try:
        started = time.process_time()
        report = work(url, spec, results, go)
        results.put(replace(report, cpu=time.process_time() - started))
    except BaseException:
        results.put(("error", work.__name__, traceback.format_exc()))
        raise SystemExit(1) from None


class _Client:
    """A connection and one channel; the I/O loop runs until ``finish`` closes the connection."""

    def __init__(self, url: str, results: Any) -> None:
        self.results = results
        self.error: BaseException | None = None
        self.channel: Channel | None = None
        self.connection = SelectConnection(pika.URLParameters(url), on_open_callback=self._opened,
                                           on_open_error_callback=self._open_failed,
                                           on_close_callback=self._closed)

    def run(self) -> None:
        self.connection.ioloop.start()
        if self.error is not None:
            raise self.error

    def started(self, channel: Channel) -> None:
        raise NotImplementedError

    def fail(self, error: BaseException) -> None:
        self.error = self.error or error
        self.finish()

    def finish(self) -> None:
        if self.connection.is_open:
            self.connection.close()

    def _opened(self, connection: SelectConnection) -> None:
        connection.channel(on_open_callback=self._channel_open)

    def _channel_open(self, channel: Channel) -> None:
        channel.add_on_close_callback(self._channel_closed)
        self.channel = channel
        self.started(channel)

    def _open_failed(self, _connection: SelectConnection, error: BaseException) -> None:
        self.error = RuntimeError(f"could not connect: {error!r}")
        self.connection.ioloop.stop()

    def _channel_closed(self, _channel: Channel, reason: BaseException) -> None:
        if not self.connection.is_closing and not self.connection.is_closed:
            self.fail(RuntimeError(f"channel closed by the broker: {reason}"))

    def _closed(self, _connection: SelectConnection, reason: BaseException) -> None:
        if self.error is None and not getattr(self, "done", False):
            self.error = RuntimeError(f"connection closed: {reason!r}")
        self.connection.ioloop.stop()


class _Publisher(_Client):
    def __init__(self, url: str, spec: PubSpec, results: Any, go: Any) -> None:
        super().__init__(url, results)
        self.spec, self.go = spec, go
        self.padding = bytes(i % 251 for i in range(max(0, spec.size - 8)))
        self.properties = pika.BasicProperties(delivery_mode=pika.DeliveryMode.Persistent)
        self.sent = self.confirmed = 0
        self.unconfirmed: dict[int, None] = {}
        """Delivery tags not confirmed yet, in publish order (confirms may come out of order)."""
        self.started_at = self.finished_at = 0.0
        self.done = False

    def started(self, channel: Channel) -> None:
        channel.confirm_delivery(self._confirmed, callback=lambda _: self._ready())

    def _ready(self) -> None:
        self.results.put(READY)
        self._wait_for_go()

    def _wait_for_go(self) -> None:
        if not self.go.is_set():
            self.connection.ioloop.call_later(POLL, self._wait_for_go)
            return
        self.started_at = time.monotonic()
        if self.spec.rate:
            self._tick()
        else:
            self._fill(self.spec.messages)

    def _fill(self, limit: int) -> None:
        """Publish up to message ``limit`` while the window has room."""
        spec, publish, properties, padding = self.spec, self.channel.basic_publish, self.properties, self.padding
        keys, count, clock = spec.routing_keys, len(spec.routing_keys), time.monotonic_ns
        sent, bound, unconfirmed = self.sent, min(limit, self.confirmed + spec.window), self.unconfirmed
        while sent < bound:
            publish(spec.exchange, keys[sent % count], clock().to_bytes(8, "big") + padding, properties)
            sent += 1
            unconfirmed[sent] = None
        self.sent = sent

    def _tick(self) -> None:
        """Paced: publish what is due by now, then sleep until the next one is."""
        elapsed = time.monotonic() - self.started_at
        due = min(self.spec.messages, int(elapsed * self.spec.rate) + 1)
        self._fill(due)
        if self.sent < self.spec.messages:
            delay = self.sent / self.spec.rate - (time.monotonic() - self.started_at)
            self.connection.ioloop.call_later(max(0.0, delay), self._tick)

    def _confirmed(self, frame: Any) -> None:
        method = frame.method
        if isinstance(method, pika.spec.Basic.Nack):
            self.fail(RuntimeError(f"broker nacked publish {method.delivery_tag}"))
            return
        unconfirmed, tag = self.unconfirmed, method.delivery_tag
        if method.multiple:
            for confirmed in list(takewhile(tag.__ge__, unconfirmed)):
                del unconfirmed[confirmed]
        else:
            unconfirmed.pop(tag, None)
        self.confirmed = self.sent - len(unconfirmed)
        if self.confirmed >= self.spec.messages:
            self.finished_at = time.monotonic()
            self.done = True
            self.finish()
        elif not self.spec.rate:
            self._fill(self.spec.messages)

    def report(self) -> Published:
        return Published(self.started_at, self.finished_at, self.confirmed)


class _Consumer(_Client):
    def __init__(self, url: str, spec: SubSpec, results: Any) -> None:
        super().__init__(url, results)
        self.spec = spec
        self.received = 0
        self.warm_count = max(1, int(spec.expected * spec.warmup))
        self.warm = self.last = 0.0
        self.latencies: list[int] = []
        self.subscribed = 0
        self.done = False

    def started(self, channel: Channel) -> None:
        channel.basic_qos(prefetch_count=self.spec.prefetch, callback=lambda _: self._subscribe())

    def _subscribe(self) -> None:
        for name in self.spec.queues:
            self.channel.basic_consume(name, self._delivered, callback=self._consuming)

    def _consuming(self, _frame: Any) -> None:
        self.subscribed += 1
        if self.subscribed == len(self.spec.queues):
            self.results.put(READY)

    def _delivered(self, channel: Channel, method: Any, _properties: Any, body: bytes) -> None:
        channel.basic_ack(method.delivery_tag)
        self.received += 1
        now = time.monotonic_ns()
        if self.received > self.warm_count:
            self.latencies.append(now - int.from_bytes(body[:8], "big"))
        elif self.received == self.warm_count:
            self.warm = now / 1e9
        if self.received >= self.spec.expected:
            self.last = now / 1e9
            self.done = True
            self.finish()

    def report(self) -> Received:
        return Received(self.warm, self.last, self.received, len(self.latencies), self.latencies)


def _publish(url: str, spec: PubSpec, results: Any, go: Any) -> Published:
    publisher = _Publisher(url, spec, results, go)
    publisher.run()
    return publisher.report()


def _consume(url: str, spec: SubSpec, results: Any, _go: Any) -> Received:
    consumer = _Consumer(url, spec, results)
    consumer.run()
    return consumer.report()


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
                raise RuntimeError("no report from the AMQP load processes in time") from None
            continue
        if isinstance(report, tuple) and report and report[0] == "error":
            raise RuntimeError(f"{report[1]} failed:\n{report[2]}")
        if isinstance(report, kind):
            return report
        raise RuntimeError(f"unexpected report {report!r} (waiting for {kind!r})")
