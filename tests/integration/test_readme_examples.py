"""The examples of README.md and of every docs/ page, run as written against one real
`sluice serve`, page by page in reading order (``tests/readme.pages``).

A reader goes through the pages top to bottom in one terminal, in one directory: the quick
start creates topics that later pages use, a background ``mosquitto_sub`` of the MQTT page is
still connected when the admin page lists clients. The test does the same: each block marked
``<!-- test: run NAME -->`` (see ``tests/readme.py``) runs in one working directory, against
one broker, in order; background jobs a block starts run until the end of the module. What
differs from a reader's terminal, and only so that the test never needs the default ports:

- the broker listens on free ports, and the pages' default ports in a block's text are
  replaced with them (``readme.on_ports``); the `sluice` commands find it through
  SLUICE_SERVER and SLUICE_ADMIN_URL, and ``mosquitto_pub``/``mosquitto_sub`` get its ``-p``;
- ``.venv/bin/sluice``, ``.venv/bin/python`` and ``.venv/bin/celery`` in the working directory
  run this interpreter's;
- the broker runs with message trace on, as the quick start says to start it for
  `sluice message trace`, and lets push subscriptions call loopback endpoints, as `make run`
  does.

Each block must exit 0, print no traceback and, for those in ``EXPECTED``, print what it says.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Server
from tests.readme import RUNNABLE_LANGUAGES, Block, every_block, make_run_env, on_ports

TIMEOUT_S = 240
"""An upper bound for one block (a loaded machine may start Python slowly), not a target."""
EXPECTED = {
    "tour-mqtt": ["rooms/kitchen/temperature 21.5"],
    "tour-pika": ["received b'hello from pika'"],
    "tour-sdk": ["sent ", "received rooms/kitchen/temperature b'21.5'"],
    "tour-push": ["com.example.reading from /sensors/t1: {'temp': 21.5}"],
    "tour-ingress": ['"subject": "shop/orders/created"'],
    "tour-ingress-pika": ["com.example.order.created order-7 b'{\"order\": 7}'"],
    "tour-tier": ["100,000 readings from 200 devices", "local retention deleted"],
    "quick-start": ["created topic orders (4 queues, normal)", "sent 1000 messages",
                    "received 1000 messages from orders", "group billing: clustering",
                    "body: order 7", "delivered  billing", "acked"],
    "official-client": ["received b'{\"id\": 1}'"],
    "sdk-script": ["received b'{\"id\": 1}'"],
    "sdk-tour": ["pushed b'{\"id\": 2}'", "pulled [b'r1', b'r2', b'r3']"],
    "sql92-official": ["received b'eu 150'"],
    "sql92-sdk": ["received b'eu 150'"],
    "delayed-sdk": ["recall handle", "recalled 0"],
    "fifo-official": ["order-17 b'packed'", "order-17 b'shipped'", "order-17 b'delivered'"],
    "fifo-sdk": ["order-18 b'packed'"],
    "priority-official": ["9 b'outage'"],
    "priority-sdk": ["9 b'outage'"],
    "lite-official": ["session-42 b'hello'", "session-42 b'bye'"],
    "lite-sdk": ["session-9 b'hello'"],
    "mqtt-tour": ["subject=devices/d1/telemetry", '{"t": 21.5}'],
    "paho": ["received devices/d2/telemetry b'{\"t\": 19.0}'"],
    "pika": ["received order.created b'{\"id\": 1}'"],
    "http-ingress-curl": ['"subject": "evt2/orders/created"', '"topic": "evt2"'],
    "http-ingress-pika": ["received evt2.orders.created b'{\"id\": 7}'"],
    "pika-delayed": ["received b'try again' after"],
    "celery": ["5"],
    "amqp-operations": ["billing", "amq.topic", "purged"],
    "cloudevents-pika": ["'ce-tenant': 'acme'", "event reading-1 com.example.reading acme {'t': 21.5}"],
    "trace": ["stored", "delivered  billing"],
    "operations-health": ['"status": "ok"'],
    "tier-layout-make": ["files tiered"],
    "tier-layout-pyarrow": ["rows of queue 0;", "'topic': 'devices'", "'data': {'device': 'd0'"],
    "tier-layout-duckdb": ["devices", "d4", "readings"],
}


def runnable() -> list[Block]:
    return [block for block in every_block() if block.action in ("run", "file")]


@pytest.fixture(scope="module")
def tour(tmp_path_factory: pytest.TempPathFactory) -> Iterator["Tour"]:
    work = tmp_path_factory.mktemp("readme")
    server = Server(work / "data", env={"SLUICE_CORE_MESSAGE_TRACE": "true", **make_run_env(work)})
    tour = Tour(work, server)
    try:
        server.wait_ready()
        tour.prepare()
        yield tour
    finally:
        tour.stop_background_jobs()
        server.kill()


class Tour:
    """The reader's working directory and terminal, against ``server``."""

    def __init__(self, work: Path, server: Server) -> None:
        self.work, self.server = work, server
        self.sessions: list[int] = []
        """Process groups of the blocks run so far, with their background jobs."""

    def prepare(self) -> None:
        """The working directory's ``.venv/bin`` commands, and the broker's ports."""
        server = self.server
        port = lambda address: int(address.rsplit(":", 1)[1])  # noqa: E731
        self.ports = {"1883": port(server.mqtt), "5672": port(server.amqp),
                      "8080": port(server.admin), "8081": port(server.native),
                      "8083": port(server.mqtt_ws.split("/")[2])}
        venv = self.work / ".venv" / "bin"
        venv.mkdir(parents=True)
        tools = self.work / "tools"
        tools.mkdir()
        commands = {venv / "python": f'exec {sys.executable} "$@"',
                    venv / "sluice": f'exec {sys.executable} -m sluice.cli "$@"',
                    venv / "celery": f'exec {sys.executable} -m celery "$@"'}
        for name in ("mosquitto_pub", "mosquitto_sub"):
            real = shutil.which(name)
            if real is not None:
                commands[tools / name] = f'exec {real} -p {self.ports["1883"]} "$@"'
        for path, line in commands.items():
            path.write_text(f"#!/bin/sh\n{line}\n")
            path.chmod(0o755)
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
        self.env.update(PATH=f"{tools}:{self.env['PATH']}", SLUICE_SERVER=server.native,
                        SLUICE_ADMIN_URL=server.admin, PYTHONUNBUFFERED="1")

    def run(self, block: Block) -> str:
        """Run ``block`` as a reader would; its output (stdout and stderr)."""
        name = block.argument
        code = on_ports(block.code, self.ports)
        if block.language == "python":
            script = self.work / f"readme_{name}.py"  # pika.py would shadow pika
            command = [str(self.work / ".venv" / "bin" / "python"), script.name]
        else:
            script = self.work / f"readme_{name}.sh"
            command = ["bash", "-e", script.name]
        script.write_text(code)
        output = self.work / f"{name}.out"
        with output.open("w") as out:
            process = subprocess.Popen(command, cwd=self.work, env=self.env, stdout=out,
                                       stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                       start_new_session=True)
            self.sessions.append(process.pid)
            try:
                code = process.wait(timeout=TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                raise AssertionError(f"block {name} ({block.where}) did not end in "
                                     f"{TIMEOUT_S} s:\n{output.read_text()}") from None
        text = output.read_text()
        assert code == 0 and "Traceback" not in text, \
            f"block {name} ({block.where}) failed with {code}:\n{text}"
        return text

    def stop_background_jobs(self) -> None:
        for group in self.sessions:
            try:
                os.killpg(group, signal.SIGTERM)
            except ProcessLookupError:
                pass


def test_every_runnable_looking_block_is_run_or_says_why_not():
    unmarked = [block.where for block in every_block()
                if block.language in RUNNABLE_LANGUAGES and block.action is None]
    assert not unmarked, f"blocks without a <!-- test: ... --> marker: {unmarked}"
    names = [block.argument for block in every_block() if block.action in ("run", "spark")]
    assert len(names) == len(set(names)), "each runnable block has its own name"
    assert set(EXPECTED) <= set(names), "every expectation names a block"


@pytest.mark.parametrize("block", runnable(), ids=lambda block: f"{block.page}::{block.argument}")
def test_the_readme_example_runs_as_written(tour, block):
    if block.action == "file":
        (tour.work / block.argument).write_text(on_ports(block.code, tour.ports))
        return
    if "mosquitto_" in block.code and shutil.which("mosquitto_pub") is None:
        if os.environ.get("CI"):
            pytest.fail("mosquitto-clients is not installed (CI installs it: .ci/run)")
        pytest.skip("needs mosquitto_pub/mosquitto_sub (apt-get install -y mosquitto-clients)")
    output = tour.run(block)
    for expected in EXPECTED.get(block.argument, ()):
        assert expected in output, f"block {block.argument} ({block.where}): no {expected!r} in\n{output}"
