"""RabbitMQ's side of the native benchmark: a pika publisher and consumer, each in its own process.

pika's asynchronous ``SelectConnection`` is used rather than aio-pika: on the 2-core development
machine it drove the same broker about 2.5 times faster (aio-pika's per-message Python work was
the limit), so RabbitMQ is measured at its best from Python.

Publisher: persistent messages (``delivery_mode=2``) to the default exchange, routed to one
durable classic queue, publisher confirms on, at most ``job.window`` unconfirmed publishes; each
message's latency runs from ``basic_publish`` until its confirm (single or ``multiple``) arrives.
Consumer: ``basic_qos(prefetch_count=job.prefetch)``, manual ``basic_ack`` of every message.
Each callback runs on pika's I/O loop in the child process.
"""
from __future__ import annotations

import time
from itertools import takewhile
from typing import Any

import pika
from pika.adapters.select_connection import SelectConnection
from pika.channel import Channel
from pika.frame import Method

from .native_workloads import READY, Consumed, Job, Published, make_body, percentiles


class _Client:
    """A connection that runs its I/O loop until ``finish`` closes it; failures are re-raised."""

    def __init__(self, job: Job) -> None:
        self.job = job
        self.error: BaseException | None = None
        self.connection = SelectConnection(pika.URLParameters(job.target), on_open_callback=self._opened,
                                           on_open_error_callback=self._open_failed,
                                           on_close_callback=self._closed)

    def run(self) -> None:
        self.connection.ioloop.start()
        if self.error is not None:
            raise self.error

    def _opened(self, connection: SelectConnection) -> None:
        connection.channel(on_open_callback=self._channel_open)

    def _channel_open(self, channel: Channel) -> None:
        channel.add_on_close_callback(self._channel_closed)
        self.channel = channel
        self.started(channel)

    def started(self, channel: Channel) -> None:
        raise NotImplementedError

    def fail(self, error: BaseException) -> None:
        self.error = self.error or error
        if self.connection.is_open:
            self.connection.close()

    def finish(self) -> None:
        if self.connection.is_open:
            self.connection.close()

    def _open_failed(self, _connection: SelectConnection, error: BaseException) -> None:
        self.error = error
        self.connection.ioloop.stop()

    def _channel_closed(self, _channel: Channel, reason: BaseException) -> None:
        if not self.connection.is_closing and not self.connection.is_closed:
            self.fail(RuntimeError(f"channel closed by the broker: {reason}"))

    def _closed(self, _connection: SelectConnection, _reason: BaseException) -> None:
        self.connection.ioloop.stop()


class _Publisher(_Client):
    """Keeps ``job.window`` persistent publishes unconfirmed until ``job.messages`` are confirmed."""

    def __init__(self, job: Job) -> None:
        super().__init__(job)
        self.body = make_body(job.size)
        self.properties = pika.BasicProperties(delivery_mode=pika.DeliveryMode.Persistent)
        self.sent_at: dict[int, float] = {}
        self.next_tag = 1
        self.confirmed = 0
        self.latencies: list[float] = []
        self.started_at = self.finished_at = 0.0

    def started(self, channel: Channel) -> None:
        channel.queue_declare(self.job.destination, durable=True,
                              callback=lambda _: channel.confirm_delivery(self._confirmed, self._go))

    def _go(self, _frame: Method) -> None:
        self.started_at = time.monotonic()
        self._fill()

    def _fill(self) -> None:
        """Publish until the window is full or every message is out."""
        publish, queue_name, body, properties = (self.channel.basic_publish, self.job.destination,
                                                 self.body, self.properties)
        sent_at, clock = self.sent_at, time.perf_counter
        while self.next_tag <= self.job.messages and len(sent_at) < self.job.window:
            sent_at[self.next_tag] = clock()
            publish("", queue_name, body, properties)
            self.next_tag += 1

    def _confirmed(self, frame: Method) -> None:
        method = frame.method
        if isinstance(method, pika.spec.Basic.Nack):
            self.fail(RuntimeError(f"broker nacked publish {method.delivery_tag}"))
            return
        now, sent_at, tag = time.perf_counter(), self.sent_at, method.delivery_tag
        tags = list(takewhile(tag.__ge__, sent_at)) if method.multiple else [tag]
        for confirmed in tags:
            self.latencies.append(now - sent_at.pop(confirmed))
        self.confirmed += len(tags)
        if self.confirmed >= self.job.messages:
            self.finished_at = time.monotonic()
            self.finish()
        else:
            self._fill()

    def report(self) -> Published:
        p50, p99 = percentiles(self.latencies)
        return Published(self.started_at, self.finished_at, self.confirmed, self.confirmed, p50, p99)


class _Consumer(_Client):
    """Acknowledges every delivery one by one; deletes the queue after the last."""

    def __init__(self, job: Job, results: Any) -> None:
        super().__init__(job)
        self.results = results
        self.received = 0
        self.finished_at = 0.0

    def started(self, channel: Channel) -> None:
        def subscribe(_frame: Method) -> None:
            channel.basic_consume(self.job.destination, self._delivered,
                                  callback=lambda _: self.results.put(READY))
        channel.basic_qos(prefetch_count=self.job.prefetch, callback=lambda _: channel.queue_declare(
            self.job.destination, durable=True, callback=subscribe))

    def _delivered(self, channel: Channel, method: Any, _properties: Any, _body: bytes) -> None:
        channel.basic_ack(method.delivery_tag)
        self.received += 1
        if self.received == self.job.messages:
            self.finished_at = time.monotonic()
            channel.queue_delete(self.job.destination, callback=lambda _: self.finish())


def publish(job: Job, _results: Any) -> Published:
    """Child process: publish ``job.messages`` persistent messages with confirms."""
    publisher = _Publisher(job)
    publisher.run()
    return publisher.report()


def consume(job: Job, results: Any) -> Consumed:
    """Child process: subscribe (then put READY on ``results``), ack ``job.messages`` deliveries."""
    consumer = _Consumer(job, results)
    consumer.run()
    return Consumed(consumer.finished_at, consumer.received)
