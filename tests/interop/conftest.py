"""Brokers for the interop suite: a throwaway Mosquitto and a `sluice serve` with MQTT on.

Every scenario in ``scenarios.py`` takes one ``Broker`` (host, port, kind, username,
password) and returns what its clients observed; ``broker`` is parametrized over both kinds so
each scenario runs once against Mosquitto and once against Sluice.

- ``mosquitto`` (session-scoped): Debian's ``mosquitto`` started by the benchmark's
  ``bench.mosquitto.throwaway_broker`` on a free loopback port (``allow_anonymous true``,
  ``persistence false``; the module docstring there lists every other line). It ignores the
  username and password the clients send.
- ``sluice_mqtt`` (module-scoped): ``sluice serve`` through the ``Server`` class of
  tests/conftest.py, with ``--mqtt-port 0 --mqtt-ws-port 0``. It is module- rather than
  function-scoped (so it cannot use the function-scoped ``sluice_server`` fixture itself, only
  the same ``Server`` it wraps): a start costs about a second, and one broker per test would
  spend most of the suite's 60 s budget starting brokers. Scenarios use a fresh uuid topic
  prefix and client ids, so tests sharing one broker do not see each other's messages.
  Sluice refuses anonymous clients; the default user is ``sluice``/``sluice``.
"""
from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from bench import mosquitto as mosquitto_starter
from tests.conftest import Server

BROKERS = ["mosquitto", "sluice"]
"""What ``broker`` runs each scenario against. "sluice" joins once `sluice serve` has its MQTT
listener (``--mqtt-port``) and the suite passes against it."""
USERNAME = "sluice"
PASSWORD = "sluice"


@dataclass(frozen=True)
class Broker:
    """Where a scenario's clients connect, and which broker that is."""

    host: str
    port: int
    kind: str
    username: str = USERNAME
    password: str = PASSWORD


@pytest.fixture(scope="session")
def mosquitto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    reason = mosquitto_starter.unavailable_reason()
    if reason:  # like the PostgreSQL tests: CI fails rather than skips
        (pytest.fail if os.environ.get("CI") else pytest.skip)(reason)
    with mosquitto_starter.throwaway_broker(tmp_path_factory.mktemp("mosquitto"), lambda line: None) as started:
        yield Broker(mosquitto_starter.LOOPBACK, started.port, "mosquitto")


@pytest.fixture(scope="module")
def module_sluice_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """``start(data_dir, *flags)`` like tests/conftest.py's ``sluice_server``, for a module."""
    started: list[Server] = []

    def start(data_dir: Path, *extra: str) -> Server:
        server = Server(data_dir, *extra)
        started.append(server)
        return server
    yield start
    for server in started:
        server.kill()


@pytest.fixture(scope="module")
def sluice_mqtt(module_sluice_server, tmp_path_factory: pytest.TempPathFactory) -> Broker:
    server = module_sluice_server(tmp_path_factory.mktemp("sluice") / "data",
                                  "--mqtt-port", "0", "--mqtt-ws-port", "0")
    server.wait_ready()
    address = getattr(server, "mqtt", None)
    if address is None:  # until Server parses `.mqtt` itself: "MQTT  HOST:PORT" or "MQTT TCP  HOST:PORT"
        found = re.search(r"^\s*MQTT(?:\s+TCP)?\s+([\w.\-]+:\d+)", "".join(server.output), re.MULTILINE)
        assert found, "sluice serve printed no `MQTT  HOST:PORT` line:\n" + "".join(server.output)
        address = found.group(1)
    host, _, port = address.rpartition(":")
    return Broker(host, int(port), "sluice")


@pytest.fixture(params=BROKERS)
def broker(request: pytest.FixtureRequest) -> Broker:
    return request.getfixturevalue("mosquitto" if request.param == "mosquitto" else "sluice_mqtt")
