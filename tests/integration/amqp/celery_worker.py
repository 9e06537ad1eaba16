"""A real `celery worker` process (``--pool solo``) of ``celery_tasks``' application, for the
Celery test and the Celery interop scenario: started against a broker URL, read until it is
ready, stopped the way a service manager stops it."""
from __future__ import annotations

import queue
import signal
import subprocess
import sys
import threading

import pytest

from tests.conftest import ROOT, clean_env

WAIT_S = 30
APP = "tests.integration.amqp.celery_tasks"


class Worker:
    """A `celery worker` child process; its log lines are read on a thread."""

    def __init__(self, url: str) -> None:
        env = {**clean_env(), "CELERY_BROKER_URL": url, "C_FORCE_ROOT": "1",
               "PYTHONPATH": str(ROOT)}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", APP, "worker", "--pool", "solo",
             "--without-gossip", "--without-mingle", "--loglevel", "INFO",
             "--hostname", "sluice-test@%h"],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.output: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.process.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def wait_for(self, text: str) -> None:
        """Read the worker's output until a line holds ``text``."""
        while True:
            try:
                line = self.lines.get(timeout=WAIT_S)
            except queue.Empty:
                pytest.fail(f"no {text!r} from the worker:\n{''.join(self.output)}")
            if line is None:
                pytest.fail(f"the worker exited ({self.process.wait()}):\n{''.join(self.output)}")
            self.output.append(line)
            if text in line:
                return

    def stop(self) -> int:
        """Warm shutdown (SIGTERM), as a service manager stops it."""
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=WAIT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()
