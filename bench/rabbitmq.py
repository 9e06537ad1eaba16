"""A throwaway RabbitMQ node for the benchmarks: Debian's ``rabbitmq-server`` on loopback.

The node gets its own directory (Mnesia, logs, Erlang cookie, config), its own node name
``<prefix>-<pid>@localhost`` (the interop tests and each benchmark use their own prefix), and free
loopback ports for AMQP, Erlang distribution and a private epmd, so it neither touches nor
clashes with a system RabbitMQ. Only the plugins the caller names are enabled, through the
node's own enabled-plugins file (none by default: no management UI), and the caller's
``rabbitmq.conf`` lines are added to the node's own file. ``throwaway_node`` starts it, waits
until the AMQP port and any ``listeners`` ports accept a connection, and on exit stops the node,
ends the epmd it started and deletes the directory.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from .processes import LOOPBACK, ServerUnavailable, free_ports, stop_process_group, tail, wait_for_port

Log = Callable[[str], None]

START_TIMEOUT = 90.0
STOP_TIMEOUT = 30.0
INSTALL_HINT = "install it with `apt-get install -y rabbitmq-server` (Debian/Ubuntu) to compare against RabbitMQ"

# Debian's /usr/sbin/rabbitmq-server is a wrapper that switches to the rabbitmq user and sends
# output to /var/log; the scripts it wraps take our environment as it is.
_SCRIPT_DIRS = (Path("/usr/lib/rabbitmq/bin"), Path("/usr/lib/rabbitmq/sbin"))


@dataclass(frozen=True)
class RabbitNode:
    """A running node: where to connect and what it is."""

    amqp_port: int
    node_name: str
    version: str
    directory: Path
    pid: int
    """Leader of the node's process group (a shell that runs beam.smp)."""
    env: dict[str, str] = field(default_factory=dict, repr=False, compare=False)
    """The node's environment, for ``ctl``."""
    mqtt_port: int | None = None
    """The MQTT plugin's loopback listener, on a cluster node with ``rabbitmq_mqtt`` enabled."""

    def ctl(self, *args: str, timeout: float = 60.0) -> str:
        """Run ``rabbitmqctl ARGS`` against this node; its output (CalledProcessError if it
        fails)."""
        script = find_server()
        assert script is not None
        done = subprocess.run([str(script.parent / "rabbitmqctl"), *args], env=self.env,
                              cwd=self.directory, capture_output=True, text=True,
                              timeout=timeout, check=True)
        return done.stdout

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@{LOOPBACK}:{self.amqp_port}/%2F"


def find_server() -> Path | None:
    """The ``rabbitmq-server`` start script, or None when RabbitMQ is not installed."""
    for directory in _SCRIPT_DIRS:
        script = directory / "rabbitmq-server"
        if script.is_file() and os.access(script, os.X_OK):
            return script
    found = shutil.which("rabbitmq-server")
    if found and Path(found).resolve().name != "rabbitmq-script-wrapper":
        return Path(found)
    return None


@contextmanager
def throwaway_node(parent: Path, log: Log, timeout: float = START_TIMEOUT, prefix: str = "bench",
                   plugins: tuple[str, ...] = (), config: tuple[str, ...] = (),
                   listeners: tuple[int, ...] = ()) -> Iterator[RabbitNode]:
    """Start a private RabbitMQ node ``<prefix>-<pid>@localhost`` under ``parent`` with
    ``plugins`` enabled and ``config`` lines in its rabbitmq.conf; return once its AMQP port and
    the ``listeners`` ports (the plugins' own, as configured) accept connections. Stop it and
    delete its files on exit."""
    script = find_server()
    if script is None:
        raise ServerUnavailable(f"rabbitmq-server is not installed; {INSTALL_HINT}")
    parent.mkdir(parents=True, exist_ok=True)
    directory = Path(tempfile.mkdtemp(prefix="rabbitmq-", dir=parent))
    with ExitStack() as cleanup:
        cleanup.callback(shutil.rmtree, directory, True)
        amqp_port, dist_port, epmd_port = free_ports(3)
        node_name = f"{prefix}-{os.getpid()}@localhost"
        env = _node_environment(directory, node_name, amqp_port, dist_port, epmd_port, plugins, config)
        output = open(directory / "server-output.log", "wb")
        cleanup.callback(output.close)
        started = time.monotonic()
        process = subprocess.Popen([str(script)], env=env, cwd=directory, stdin=subprocess.DEVNULL,
                                   stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
        cleanup.callback(_end_epmd, epmd_port, env)
        cleanup.callback(stop_process_group, process, STOP_TIMEOUT)
        try:
            for port in (amqp_port, *listeners):
                wait_for_port(port, started + timeout, process, "rabbitmq-server")
        except ServerUnavailable as error:
            raise ServerUnavailable(f"RabbitMQ node did not start: {error}\n{_tail(directory)}") from None
        node = RabbitNode(amqp_port, node_name, _version(script), directory, process.pid, env)
        log(f"RabbitMQ {node.version} node {node_name} up on {LOOPBACK}:{amqp_port} "
            f"after {time.monotonic() - started:.1f}s")
        yield node


@contextmanager
def throwaway_cluster(parent: Path, log: Log, size: int = 3, prefix: str = "bench-cluster",
                      timeout: float = START_TIMEOUT, plugins: tuple[str, ...] = (),
                      config: tuple[str, ...] = ()) -> Iterator[list[RabbitNode]]:
    """Start ``size`` private RabbitMQ nodes sharing one Erlang cookie and one private epmd, each
    with ``plugins`` enabled and ``config`` lines in its rabbitmq.conf, and join them into one
    cluster (``rabbitmqctl join_cluster``); stop them and delete their files on exit. The first
    node is the one the others joined. With ``rabbitmq_mqtt`` among the plugins every node also
    gets an MQTT listener on a free loopback port of its own (``RabbitNode.mqtt_port``), which
    accepts connections before this returns."""
    script = find_server()
    if script is None:
        raise ServerUnavailable(f"rabbitmq-server is not installed; {INSTALL_HINT}")
    parent.mkdir(parents=True, exist_ok=True)
    cookie = os.urandom(16).hex().upper()
    epmd_port = free_ports(1)[0]
    with ExitStack() as cleanup:
        nodes, processes = [], []
        started = time.monotonic()
        for index in range(size):
            directory = Path(tempfile.mkdtemp(prefix=f"rabbitmq-{index}-", dir=parent))
            cleanup.callback(shutil.rmtree, directory, True)
            (directory / ".erlang.cookie").write_text(cookie)
            (directory / ".erlang.cookie").chmod(0o400)
            amqp_port, dist_port, mqtt_port = free_ports(3)
            if "rabbitmq_mqtt" not in plugins:
                mqtt_port = None
            listener = (f"mqtt.listeners.tcp.1 = {LOOPBACK}:{mqtt_port}",) if mqtt_port else ()
            node_name = f"{prefix}-{os.getpid()}-{index}@localhost"
            env = _node_environment(directory, node_name, amqp_port, dist_port, epmd_port, plugins,
                                    (*listener, *config))
            output = open(directory / "server-output.log", "wb")
            cleanup.callback(output.close)
            process = subprocess.Popen([str(script)], env=env, cwd=directory, stdin=subprocess.DEVNULL,
                                       stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
            if index == 0:
                cleanup.callback(_end_epmd, epmd_port, env)
            cleanup.callback(stop_process_group, process, STOP_TIMEOUT)
            processes.append(process)
            nodes.append(RabbitNode(amqp_port, node_name, _version(script), directory, process.pid, env, mqtt_port))
        for node, process in zip(nodes, processes):
            try:
                wait_for_port(node.amqp_port, started + timeout, process, "rabbitmq-server")
            except ServerUnavailable as error:
                raise ServerUnavailable(f"RabbitMQ node did not start: {error}\n{_tail(node.directory)}") from None
        for node in nodes[1:]:
            node.ctl("stop_app")
            node.ctl("join_cluster", nodes[0].node_name)
            node.ctl("start_app")
        for node, process in zip(nodes, processes):
            if node.mqtt_port is not None:  # start_app restarted the plugins of the joined nodes
                try:
                    wait_for_port(node.mqtt_port, time.monotonic() + timeout, process, "rabbitmq-server")
                except ServerUnavailable as error:
                    raise ServerUnavailable(f"RabbitMQ MQTT listener did not start: {error}\n"
                                            f"{_tail(node.directory)}") from None
        log(f"RabbitMQ {nodes[0].version} cluster of {size} nodes up after {time.monotonic() - started:.1f}s")
        yield nodes


def _node_environment(directory: Path, node_name: str, amqp_port: int, dist_port: int, epmd_port: int,
                      plugins: tuple[str, ...], config: tuple[str, ...]) -> dict[str, str]:
    """Environment for a node whose every file and port is its own."""
    (directory / "enabled_plugins").write_text(f"[{','.join(plugins)}].\n")
    (directory / "rabbitmq-env.conf").write_text("# empty: this node ignores /etc/rabbitmq\n")
    (directory / "rabbitmq.conf").write_text("\n".join([
        "# throwaway benchmark node; the AMQP listener comes from RABBITMQ_NODE_IP_ADDRESS/PORT", *config, ""]))
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("RABBITMQ_", "ERL_"))}
    env.update({
        "HOME": str(directory),  # the Erlang cookie is created here
        "RABBITMQ_NODENAME": node_name,
        "RABBITMQ_NODE_IP_ADDRESS": LOOPBACK,
        "RABBITMQ_NODE_PORT": str(amqp_port),
        "RABBITMQ_DIST_PORT": str(dist_port),
        "RABBITMQ_MNESIA_BASE": str(directory / "mnesia"),
        "RABBITMQ_LOG_BASE": str(directory / "log"),
        "RABBITMQ_ENABLED_PLUGINS_FILE": str(directory / "enabled_plugins"),
        "RABBITMQ_CONF_ENV_FILE": str(directory / "rabbitmq-env.conf"),
        "RABBITMQ_CONFIG_FILE": str(directory / "rabbitmq.conf"),
        # Erlang distribution listens on loopback only, like AMQP and epmd.
        "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
        "ERL_EPMD_ADDRESS": LOOPBACK,
        "ERL_EPMD_PORT": str(epmd_port),
    })
    return env


def _end_epmd(port: int, env: dict[str, str]) -> None:
    """Stop the private epmd the node started on ``port`` (it daemonises, outliving the node)."""
    epmd = shutil.which("epmd") or "/usr/lib/erlang/bin/epmd"
    try:
        subprocess.run([epmd, "-port", str(port), "-kill"], env=env, capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        pass


def _version(script: Path) -> str:
    """The RabbitMQ version from the install path (``.../rabbitmq_server-3.10.8/sbin``), or '?'."""
    for part in script.resolve().parts:
        if part.startswith("rabbitmq_server-"):
            return part.removeprefix("rabbitmq_server-")
    return "?"


def _tail(directory: Path) -> str:
    """The end of the node's console output and main log, for error messages."""
    return tail([directory / "server-output.log", *sorted((directory / "log").glob("*.log"))])
