"""Sluice's side of the native benchmark: the native SDK's producer and consumers, each in its
own process, on uvloop.

Durable sends: ``job.window`` tasks each ``await Producer.send(...)`` in a loop against a broker
with sync flush, so a send returns once its record is fsynced; its latency is that await.
Consumer: ``job.prefetch // RECEIVE_BATCH`` tasks each ``receive`` up to ``RECEIVE_BATCH``
messages from a ``SimpleConsumer`` and ack every one (the acks of one batch concurrently).

Packed stream: ``job.window`` tasks each ``await Producer.send_packed(topic, bodies)`` with
``job.pack`` bodies; a ``PullConsumer`` pulls the topic's queues whole records at a time
(``unpack=False``) and splits each with ``unpack_bodies``, as a stream processor would.
"""
from __future__ import annotations

import asyncio
import time
from typing import Any

import uvloop

from sluice.client import (ClientConfig, Message, Producer, PullConsumer, SimpleConsumer,
                                  unpack_bodies)

from .native_workloads import READY, Consumed, Job, Published, make_body, percentiles

RECEIVE_BATCH = 128
REQUEST_TIMEOUT = 30.0
"""Seconds a send or ack may take before it fails the run (the SDK default is 3): RabbitMQ's
confirms have no deadline either, and a slow moment shows in p99 rather than ending the run."""


def _config(job: Job) -> ClientConfig:
    access_key, secret_key = job.credentials
    return ClientConfig(endpoint=job.target, access_key=access_key, secret_key=secret_key,
                        request_timeout=REQUEST_TIMEOUT)


async def _send_all(job: Job, send: Any, per_call: int) -> Published:
    """``job.window`` tasks calling ``send()`` until ``job.messages`` went out, ``per_call`` a call."""
    calls = job.messages // per_call
    remaining = calls
    latencies: list[float] = []
    clock = time.perf_counter

    async def sender() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            started = clock()
            await send()
            latencies.append(clock() - started)

    started = time.monotonic()
    await asyncio.gather(*(sender() for _ in range(min(job.window, calls))))
    finished = time.monotonic()
    p50, p99 = percentiles(latencies)
    return Published(started, finished, calls * per_call, calls, p50, p99)


async def _publish(job: Job) -> Published:
    async with Producer(_config(job), topics=[job.destination]) as producer:
        message = Message(job.destination, make_body(job.size))
        return await _send_all(job, lambda: producer.send(message), 1)


async def _publish_packed(job: Job) -> Published:
    body = make_body(job.size)
    bodies = [body] * job.pack
    async with Producer(_config(job), topics=[job.destination]) as producer:
        return await _send_all(job, lambda: producer.send_packed(job.destination, bodies), job.pack)


async def _consume(job: Job, results: Any) -> Consumed:
    consumer = SimpleConsumer(_config(job), f"{job.destination}-group", {job.destination: "*"},
                              await_duration=1.0)
    async with consumer:
        results.put(READY)
        received = 0
        done = asyncio.get_running_loop().create_future()

        async def receiver() -> None:
            nonlocal received
            while not done.done():
                messages = await consumer.receive(RECEIVE_BATCH)
                await asyncio.gather(*(consumer.ack(message) for message in messages))
                received += len(messages)
                if received >= job.messages and not done.done():
                    done.set_result(time.monotonic())

        tasks = [asyncio.create_task(receiver()) for _ in range(max(1, job.prefetch // RECEIVE_BATCH))]
        finished = await _first(done, tasks)
        return Consumed(finished, received)


async def _consume_packed(job: Job, results: Any) -> Consumed:
    consumer = PullConsumer(_config(job), f"{job.destination}-group", [job.destination],
                            start_from="earliest", auto_commit_interval=None, await_duration=1.0,
                            unpack=False)
    async with consumer:
        results.put(READY)
        received = 0
        while received < job.messages:
            for record in await consumer.pull(16):
                received += len(unpack_bodies(record.body))
        return Consumed(time.monotonic(), received)


async def _first(done: asyncio.Future, tasks: list[asyncio.Task]) -> float:
    """``done``'s result once set; re-raises a task's failure; cancels the tasks either way."""
    try:
        waiting = {done, *tasks}
        while not done.done():
            finished, waiting = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            for task in finished:
                if task is not done and task.exception() is not None:
                    raise task.exception()
        return done.result()
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def publish(job: Job, _results: Any) -> Published:
    """Child process: ``job.messages`` durable sends, ``job.window`` at a time."""
    return uvloop.run(_publish(job))


def consume(job: Job, results: Any) -> Consumed:
    """Child process: subscribe (then put READY on ``results``), receive and ack ``job.messages``."""
    return uvloop.run(_consume(job, results))


def publish_packed(job: Job, _results: Any) -> Published:
    """Child process: ``job.messages`` bodies in ``send_packed`` calls of ``job.pack``."""
    return uvloop.run(_publish_packed(job))


def consume_packed(job: Job, results: Any) -> Consumed:
    """Child process: pull until ``job.messages`` bodies arrived, unpacked."""
    return uvloop.run(_consume_packed(job, results))
