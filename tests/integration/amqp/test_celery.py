"""Celery end to end against `sluice serve`: a real worker process (``celery -A ... worker
--pool solo``) configured with ``amqp://guest:guest@localhost:PORT//`` runs tasks sent by this
process, results come back over AMQP (``rpc://``: reply_to, correlation_id and an auto-delete
reply queue per client), failures and retries travel as they do on RabbitMQ, the worker answers
broadcast control commands, and the reply queue is gone once its client disconnects.

The broker is the module's `sluice serve` (``amqp_server``) on a free port rather than 5672,
so tests can run beside a broker already on 5672; the URL is otherwise the one `make run`
serves."""
from __future__ import annotations

import sys
from collections.abc import Iterator

import pika.exceptions
import pytest
from celery import group

from tests.integration.amqp.celery_worker import APP, WAIT_S, Worker
from tests.integration.amqp.conftest import connect


def broker_url(server) -> str:
    return f"amqp://guest:guest@localhost:{server.amqp.rpartition(':')[2]}//"


@pytest.fixture(scope="module")
def celery_app(amqp_server):
    from tests.integration.amqp.celery_tasks import app
    app.conf.broker_url = broker_url(amqp_server)
    yield app
    app.pool.force_close_all()


@pytest.fixture(scope="module")
def worker(amqp_server) -> Iterator[Worker]:
    started = Worker(broker_url(amqp_server))
    try:
        started.wait_for("ready.")
        yield started
    finally:
        assert started.stop() == 0, "".join(started.output)


def test_tasks_run_and_results_come_back_over_rpc(celery_app, worker):
    from tests.integration.amqp.celery_tasks import add
    assert add.delay(2, 3).get(timeout=WAIT_S) == 5
    results = [add.delay(n, n) for n in range(30)]
    assert [result.get(timeout=WAIT_S) for result in results] == [2 * n for n in range(30)]
    assert group(add.s(n, 1) for n in range(5))().get(timeout=WAIT_S) == [1, 2, 3, 4, 5]


def test_a_failure_and_retries_reach_the_caller(celery_app, worker):
    from tests.integration.amqp.celery_tasks import fail, flaky
    failed = fail.delay("no such order")
    with pytest.raises(ValueError, match="no such order"):
        failed.get(timeout=WAIT_S)
    assert failed.state == "FAILURE"
    assert flaky.delay(3).get(timeout=WAIT_S) == 2  # two retries, each a new message


def test_countdown_tasks_do_not_hold_back_others(celery_app, worker):
    """The worker holds countdown tasks unacked and raises its prefetch (basic.qos) to go on
    taking others: an immediate task is done long before the countdowns end."""
    from tests.integration.amqp.celery_tasks import add
    later = [add.apply_async((n, 0), countdown=6) for n in range(3)]  # more than prefetch 1
    assert add.delay(1, 1).get(timeout=3) == 2
    assert [result.get(timeout=WAIT_S) for result in later] == list(range(3))


def test_the_worker_answers_broadcast_control_commands(celery_app, worker):
    replies = celery_app.control.inspect(timeout=WAIT_S, limit=1).ping()
    assert replies and all(reply == {"ok": "pong"} for reply in replies.values())
    [name] = replies
    assert name.startswith("sluice-test@")
    registered = celery_app.control.inspect(destination=[name], timeout=WAIT_S,
                                            limit=1).registered()
    assert f"{sys.modules['tests.integration.amqp.celery_tasks'].__name__}.add" in registered[name]


def test_a_clients_rpc_reply_queue_goes_when_it_disconnects(amqp_server, worker):
    from celery import Celery
    client = Celery("reply-queue-check", broker=broker_url(amqp_server), backend="rpc://")
    client.conf.update(task_serializer="json", result_serializer="json", accept_content=["json"])
    result = client.send_task(f"{APP}.add", (20, 22))
    assert result.get(timeout=WAIT_S) == 42
    reply_queue = client.backend.binding.name  # the client's oid: its own auto-delete queue
    assert reply_queue == client.backend.oid
    checker = connect(amqp_server)
    checker.channel().queue_declare(reply_queue, passive=True)  # there while the client is
    client.backend.result_consumer.stop()
    client.pool.force_close_all()
    client.close()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as gone:
        checker.channel().queue_declare(reply_queue, passive=True)
    assert gone.value.reply_code == 404
    checker.close()


def test_a_worker_reconnects_when_the_broker_restarts(sluice_server, tmp_path):
    """The broker stops (SIGTERM: 320 to every connection) and starts again on the same port
    and data: the worker reconnects by itself, its durable task queue is still there, and a
    task sent afterwards runs."""
    from bench.processes import free_ports
    [port] = free_ports(1)
    server = sluice_server(tmp_path / "data", "--amqp-port", str(port))
    server.wait_ready()
    url = broker_url(server)
    worker = Worker(url)
    try:
        worker.wait_for("ready.")
        assert run_once(url, (1, 2)) == 3
        assert server.stop() == 0
        worker.wait_for("Connection to broker lost")
        again = sluice_server(tmp_path / "data", "--amqp-port", str(port))
        again.wait_ready()
        worker.wait_for(f"Connected to amqp://guest:**@127.0.0.1:{port}//")
        assert run_once(url, (20, 22)) == 42
    finally:
        assert worker.stop() == 0, "".join(worker.output)


def run_once(url: str, args: tuple[int, int]) -> int:
    """Send ``add(*args)`` from a client of its own and wait for the result."""
    from celery import Celery
    client = Celery("once", broker=url, backend="rpc://")
    client.conf.update(task_serializer="json", result_serializer="json", accept_content=["json"])
    try:
        return client.send_task(f"{APP}.add", args).get(timeout=WAIT_S)
    finally:
        client.close()
