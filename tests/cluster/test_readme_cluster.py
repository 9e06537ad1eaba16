"""The cluster walkthrough of docs/clustering.md as a new user follows it: the group `make cluster` starts
(three nodes on 127.0.0.2-4), every client failover example started together, the leader killed
with SIGKILL while they publish, each example finishing all its messages, and `sluice cluster
status` naming the new leader; a `mosquitto_sub` on a follower carries on receiving."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading

import pytest

from bench.cluster_load import cluster_view, leader_of, wait_for
from bench.processes import free_ports
from sluice.cli.dev_cluster import DevCluster, Ports
from tests.readme import every_block, on_ports

WAIT_S = 180


def cluster_blocks():
    return [block for block in every_block() if block.action == "cluster"]


class Example:
    """One example block running as a script; ``sent`` is set as it reports progress."""

    def __init__(self, name: str, script, env: dict[str, str]) -> None:
        self.name = name
        self.lines: list[str] = []
        self.progress = threading.Condition()
        self.process = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            with self.progress:
                self.lines.append(line)
                self.progress.notify_all()

    def wait_sent(self, count: int) -> None:
        with self.progress:
            assert self.progress.wait_for(lambda: f"sent {count}\n" in self.lines or self.process.poll() is not None,
                                          WAIT_S), f"{self.name}: not {count} sent in time:\n{''.join(self.lines)}"
        assert f"sent {count}\n" in self.lines, f"{self.name} ended early:\n{''.join(self.lines)}"

    def finish(self) -> None:
        try:
            code = self.process.wait(WAIT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise AssertionError(f"{self.name} did not finish:\n{''.join(self.lines)}") from None
        assert code == 0 and "sent 40\n" in self.lines, f"{self.name} failed ({code}):\n{''.join(self.lines)}"


def test_every_client_example_publishes_through_a_leader_failover(tmp_path, etcd_installed):
    examples = cluster_blocks()
    assert {block.argument for block in examples} >= {"paho", "pika", "aio-pika", "kombu", "sdk", "rocketmq"}
    native, admin, mqtt, ws, amqp, replication, etcd_client, etcd_peer = free_ports(8)
    ports = {"1883": mqtt, "5672": amqp, "8080": admin, "8081": native, "8083": ws}
    group = DevCluster(tmp_path / "cluster-data", ports=Ports(native, admin, mqtt, ws, amqp, replication),
                       etcd_ports=(etcd_client, etcd_peer))
    group.start()
    running: list[Example] = []
    subscriber = None
    try:
        leader = leader_of(group)
        follower = next(node for node in group.nodes if node is not leader)
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")} | {"PYTHONUNBUFFERED": "1"}
        if shutil.which("mosquitto_sub"):
            subscriber = subprocess.Popen(["mosquitto_sub", "-h", follower.host, "-p", str(mqtt), "-u", "sluice",
                                           "-P", "sluice", "-t", "sensors/#", "-v"],
                                          stdout=(tmp_path / "sub.out").open("w"), stderr=subprocess.STDOUT)
        elif os.environ.get("CI"):
            pytest.fail("mosquitto-clients is not installed (CI installs it: .ci/run)")
        for block in examples:
            script = tmp_path / f"readme_cluster_{block.argument}.py"
            script.write_text(on_ports(block.code, ports))
            running.append(Example(block.argument, script, env))
        for example in running:
            example.wait_sent(10)
        leader.kill()
        new = leader_of(group, skip=(leader,))
        for example in running:
            example.finish()
        done = subprocess.run([sys.executable, "-m", "sluice.cli", "cluster", "status", "--admin",
                               f"http://{follower.host}:{admin}", "--user", "sluice", "--password", "sluice"],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0 and done.stdout.startswith(f"leader {new.name}, epoch "), done.stdout + done.stderr
        assert cluster_view(group)["leader"] == new.name
        if subscriber is not None:  # it reconnected to its follower and saw readings from after the failover
            wait_for("mosquitto_sub to see the last reading",
                     lambda: "sensors/paho reading 39" in (tmp_path / "sub.out").read_text())
    finally:
        for example in running:
            if example.process.poll() is None:
                example.process.kill()
        if subscriber is not None:
            subscriber.kill()
        group.kill_all()
