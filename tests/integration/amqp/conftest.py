"""A `sluice serve` process for a module's AMQP tests, and pika connection helpers."""
from __future__ import annotations

from collections.abc import Iterator

import pika
import pytest

from tests.conftest import Server

SLUICE_USER, SLUICE_PASSWORD = "sluice", "sluice"


@pytest.fixture(scope="module")
def amqp_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One broker for the module, AMQP on a free port (guest from loopback on)."""
    server = Server(tmp_path_factory.mktemp("amqp") / "data")
    try:
        server.wait_ready()
        yield server
    finally:
        server.kill()


def parameters(server: Server, user: str = "guest", password: str = "guest", vhost: str = "/",
               **more: object) -> pika.ConnectionParameters:
    """pika parameters for ``server``'s AMQP listener."""
    host, port = server.amqp.rsplit(":", 1)
    return pika.ConnectionParameters(host, int(port), vhost,
                                     pika.PlainCredentials(user, password),
                                     connection_attempts=1, socket_timeout=10,
                                     blocked_connection_timeout=30, **more)


def connect(server: Server, **options: object) -> pika.BlockingConnection:
    return pika.BlockingConnection(parameters(server, **options))
