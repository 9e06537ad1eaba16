"""The Celery application the Celery test runs a worker of: broker and result backend over
AMQP (``rpc://``: results come back on the caller's auto-delete reply queue, matched by
correlation_id). The broker URL comes from CELERY_BROKER_URL."""
from __future__ import annotations

import os

from celery import Celery

app = Celery("sluice_test", broker=os.environ.get("CELERY_BROKER_URL", "amqp://guest:guest@localhost//"),
             backend="rpc://")
app.conf.update(broker_connection_retry_on_startup=False, broker_heartbeat=10,
                task_acks_late=True, worker_prefetch_multiplier=1, task_serializer="json",
                result_serializer="json", accept_content=["json"])


@app.task
def add(x: int, y: int) -> int:
    return x + y


@app.task
def fail(text: str) -> None:
    raise ValueError(text)


@app.task(bind=True, max_retries=2, default_retry_delay=0)
def flaky(self, succeed_on: int) -> int:
    """Fails until its ``succeed_on``-th try (each retry is a new message through the broker)."""
    if self.request.retries + 1 < succeed_on:
        raise self.retry()
    return self.request.retries
