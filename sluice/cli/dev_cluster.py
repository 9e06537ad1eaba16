"""`sluice dev-cluster`: a one-member etcd and three nodes on this machine, to try failover.

Node ``nK`` listens on 127.0.0.K+1 (n1 on 127.0.0.2, ...) on the standard ports, with its data
in ``DIR/nK`` and its log in ``DIR/nK.log``; etcd serves 127.0.0.1:2379. A node that dies (kill
-9 it to see a failover) is started again after a pause, so it rejoins: it cuts its log back to
the leader's history and catches up. Ctrl+C stops everything. ``DevCluster`` is also what the
cluster tests start.
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from sluice.cluster.local_etcd import EtcdNotStarted, LocalEtcd, dying_with_parent

READY = "Sluice is ready."
LEADS = "leads the group in epoch"
DEV_SECRET = "dev-cluster-secret"


@dataclass
class Ports:
    """The ports every node uses (on its own address)."""

    native: int = 8081
    admin: int = 8080
    mqtt: int = 1883
    mqtt_ws: int = 8083
    amqp: int = 5672
    replication: int = 5679


@dataclass
class NodeProcess:
    """One `sluice serve` of the group."""

    name: str
    host: str
    data_dir: Path
    command: list[str]
    env: dict[str, str]
    etcd_host: str | None = None
    """The address this node reaches etcd at, when it has one of its own."""
    process: subprocess.Popen | None = None
    ready: threading.Event = field(default_factory=threading.Event)
    leading: threading.Event = field(default_factory=threading.Event)
    exited: threading.Event = field(default_factory=threading.Event)

    @property
    def log_path(self) -> Path:
        return self.data_dir.parent / f"{self.name}.log"

    def start(self) -> None:
        self.ready, self.leading, self.exited = threading.Event(), threading.Event(), threading.Event()
        log = open(self.log_path, "ab")
        self.process = subprocess.Popen(dying_with_parent(self.command), stdout=subprocess.PIPE, stderr=log,
                                        env=self.env, stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        threading.Thread(target=self._watch, args=(self.process,), daemon=True).start()

    def _watch(self, process: subprocess.Popen) -> None:
        with open(self.log_path, "ab") as log:
            for line in process.stdout:
                log.write(line)
                log.flush()
                text = line.decode(errors="replace")
                if text.startswith(READY):
                    self.ready.set()
                if LEADS in text:
                    self.leading.set()
        process.wait()
        self.exited.set()

    def wait_ready(self, timeout_s: float = 120) -> None:
        if not self.ready.wait(timeout_s):
            raise RuntimeError(f"{self.name} did not start within {timeout_s:.0f} s; see {self.log_path}")

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def signal(self, signum: int) -> None:
        if self.alive:
            os.kill(self.process.pid, signum)

    def kill(self) -> None:
        """SIGKILL, and wait until it is gone."""
        if self.alive:
            self.process.kill()
        if self.process is not None:
            self.process.wait()
            self.exited.wait(30)

    def stop(self, timeout_s: float = 60) -> int | None:
        """SIGTERM and wait (SIGKILL after ``timeout_s``); the exit status."""
        if self.process is None:
            return None
        if self.alive:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.exited.wait(30)
        return self.process.returncode


class DevCluster:
    """etcd and ``count`` nodes under ``directory``."""

    def __init__(self, directory: Path, count: int = 3, ports: Ports | None = None, etcd_ports: tuple[int, int] = (2379, 2380),
                 secret: str = DEV_SECRET, first_host: int = 2, extra_env: dict[str, str] | None = None,
                 etcd_host_per_node: int | None = None) -> None:
        """``etcd_host_per_node`` N: node k reaches etcd at 127.0.0.(N+k), an address of its own
        (for tests that cut one node off from etcd); None: every node uses 127.0.0.1."""
        self.directory = Path(directory)
        self.ports = ports or Ports()
        self._etcd_hosts = [f"127.0.0.{etcd_host_per_node + k}" for k in range(count)] if etcd_host_per_node else []
        self.etcd = LocalEtcd(self.directory / "etcd", *etcd_ports, more_hosts=tuple(self._etcd_hosts))
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
        env.update({"SLUICE_CLUSTER_SECRET": secret, **(extra_env or {})})
        self.nodes = [self._node(index, f"127.0.0.{first_host + index}", env) for index in range(count)]

    def _node(self, index: int, host: str, env: dict[str, str]) -> NodeProcess:
        p = self.ports
        name = f"n{index + 1}"
        data_dir = self.directory / name
        etcd = f"http://{self._etcd_hosts[index]}:{self.etcd.client_port}" if self._etcd_hosts else self.etcd.url
        command = [sys.executable, "-m", "sluice.cli", "serve", "--host", host, "--data-dir", str(data_dir),
                   "--cluster-etcd", etcd, "--node-id", name, "--replication-port", str(p.replication),
                   "--native-port", str(p.native), "--admin-port", str(p.admin), "--mqtt-port", str(p.mqtt),
                   "--mqtt-ws-port", str(p.mqtt_ws), "--amqp-port", str(p.amqp)]
        return NodeProcess(name, host, data_dir, command, env, etcd_host=self._etcd_hosts[index] if self._etcd_hosts else None)

    def node(self, name: str) -> NodeProcess:
        return next(node for node in self.nodes if node.name == name)

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.etcd.start()
        for node in self.nodes:
            node.start()
        for node in self.nodes:
            node.wait_ready()

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
        self.etcd.stop()

    def kill_all(self) -> None:
        for node in self.nodes:
            node.kill()
        self.etcd.stop()


def _dev_cluster(args: argparse.Namespace) -> int:
    cluster = DevCluster(Path(args.dir), args.nodes)
    p = cluster.ports
    stopping = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stopping.set())
    try:
        print(f"starting etcd on {cluster.etcd.url} and {args.nodes} nodes (logs in {args.dir}/nK.log) ...", flush=True)
        cluster.start()
    except (EtcdNotStarted, RuntimeError) as error:
        print(f"error: {error}", file=sys.stderr)
        cluster.kill_all()
        return 1
    for node in cluster.nodes:
        print(f"  {node.name}: pid {node.process.pid:<7} MQTT {node.host}:{p.mqtt}  AMQP {node.host}:{p.amqp}  "
              f"native {node.host}:{p.native}  admin http://{node.host}:{p.admin}", flush=True)
    first = cluster.nodes[0].host
    print(f"Any node serves every client (user sluice, password sluice). Try:\n"
          f"  sluice cluster status --admin http://{first}:{p.admin}\n"
          f"  kill -9 <the leader's pid>   (it is started again {args.restart_after:g} s after it dies)\n"
          f"Ctrl+C stops the cluster.", flush=True)
    while not stopping.wait(0.5):
        for node in cluster.nodes:
            if node.exited.is_set() and not stopping.is_set():
                print(f"{node.name} exited (status {node.process.returncode}); starting it again in "
                      f"{args.restart_after:g} s", flush=True)
                if stopping.wait(args.restart_after):
                    break
                node.start()
                print(f"{node.name} started again: pid {node.process.pid}", flush=True)
    print("stopping the cluster ...", flush=True)
    cluster.stop()
    print("cluster stopped.", flush=True)
    return 0


def add_dev_cluster_command(commands: argparse._SubParsersAction) -> None:
    text = ("Start a one-member etcd and three nodes on this machine (n1 on 127.0.0.2, n2 on 127.0.0.3, "
            "n3 on 127.0.0.4, standard ports), to try failover; a node that dies is started again.")
    dev = commands.add_parser("dev-cluster", help=text, description=text)
    dev.add_argument("--dir", default="./cluster-data", help="where the nodes and etcd keep their data "
                     "and logs (default: %(default)s)")
    dev.add_argument("--nodes", type=int, default=3, help="how many nodes (default: %(default)s)")
    dev.add_argument("--restart-after", type=float, default=3.0, metavar="S",
                     help="seconds before a node that died is started again (default: %(default)s)")
    dev.set_defaults(handler=_dev_cluster)
