"""Brokers for the AMQP interop suite: a throwaway RabbitMQ node and a `sluice serve`.

Every scenario in ``scenarios.py`` takes one ``AmqpBroker`` (host, port, kind) and returns what
its clients observed; ``amqp_broker`` is parametrized over both kinds so each scenario runs once
against RabbitMQ and once against Sluice.

- ``rabbitmq`` (module-scoped): Debian's ``rabbitmq-server`` started by the benchmark's
  ``bench.rabbitmq.throwaway_node`` as node ``interop-<pid>@localhost``, with its own directory,
  loopback ports and epmd; about 8 s to start and stop, so one per module. Missing RabbitMQ
  skips the module, and fails it when CI is set (as the Mosquitto and PostgreSQL tests do). Its
  ``max_message_size`` is RabbitMQ 4's default (16 MiB), which Sluice follows; Debian's 3.10
  would allow 128 MiB.
- ``sluice_amqp`` (module-scoped): ``sluice serve`` through ``tests.conftest.Server``, AMQP on a
  free port, its store segments large enough for a 16 MiB message (a body may take half a
  segment); clients log in as ``guest``/``guest`` from loopback on both brokers.

Scenarios use fresh uuid names for exchanges and queues, so tests sharing a broker do not see
each other's entities.
"""
from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from bench import rabbitmq as rabbitmq_starter
from bench.processes import LOOPBACK, ServerUnavailable
from tests.conftest import CONFIG, Server

AMQP_BROKERS = ["rabbitmq", "sluice"]
RABBITMQ_4_MAX_MESSAGE = 16 << 20
"""RabbitMQ 4's default ``max_message_size``, Sluice's too."""
SLUICE_CONFIG = CONFIG.replace("segment_size = 4_194_304", "segment_size = 67_108_864")
"""The tests' broker configuration with segments a 16 MiB message fits in."""


@dataclass(frozen=True)
class AmqpBroker:
    """Where a scenario's clients connect, and which broker that is."""

    host: str
    port: int
    kind: str
    version: str = ""
    user: str = "guest"
    password: str = "guest"

    @property
    def url(self) -> str:
        return f"amqp://{self.user}:{self.password}@{self.host}:{self.port}/%2F"


@pytest.fixture(scope="module")
def rabbitmq(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AmqpBroker]:
    if rabbitmq_starter.find_server() is None:
        reason = f"rabbitmq-server is not installed; {rabbitmq_starter.INSTALL_HINT}"
        (pytest.fail if os.environ.get("CI") else pytest.skip)(reason)
    try:
        with rabbitmq_starter.throwaway_node(tmp_path_factory.mktemp("rabbitmq"), lambda line: None,
                                             prefix="interop",
                                             config=(f"max_message_size = {RABBITMQ_4_MAX_MESSAGE}",)
                                             ) as node:
            yield AmqpBroker(LOOPBACK, node.amqp_port, "rabbitmq", node.version)
    except ServerUnavailable as error:
        pytest.fail(str(error))


@pytest.fixture(scope="module")
def sluice_amqp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AmqpBroker]:
    server = Server(tmp_path_factory.mktemp("sluice-amqp") / "data", config=SLUICE_CONFIG)
    try:
        server.wait_ready()
        host, _, port = server.amqp.rpartition(":")
        yield AmqpBroker(host, int(port), "sluice")
    finally:
        server.kill()


@pytest.fixture(params=AMQP_BROKERS)
def amqp_broker(request: pytest.FixtureRequest) -> AmqpBroker:
    return request.getfixturevalue("rabbitmq" if request.param == "rabbitmq" else "sluice_amqp")
