"""The cluster section of ``make bench``: replicated Sluice beside single-node Sluice and a
three-node RabbitMQ cluster with quorum queues, side by side in one run on this machine.

AMQP 0-9-1 through pika in separate processes (the AMQP section's load generator): 1 KiB
persistent messages, publisher confirms with a bounded window, manual acks. MQTT QoS 1 fan-in
(the MQTT section's raw-socket generator, in separate processes; its default settings: 4
publishers with 64 messages in flight each, 100-byte payloads, 2 s warm-up then 4 s measured)
into one subscriber with a persistent session (clean session 0), the same against all three.
Each round runs the brokers one after the other, MQTT then AMQP; figures are medians over
rounds. Sluice's group is three `sluice serve` nodes on 127.0.0.2-4 with ``min_insync`` 2 (a
confirm or PUBACK means the leader and a follower have the message on disk), clients connected
to the leader.

RabbitMQ's cluster runs the ``rabbitmq_mqtt`` plugin on every node with
``mqtt.durable_queue_type = quorum`` (``bench/rabbitmq_mqtt.py``), so the persistent
subscriber's queue (``mqtt-subscription-<client id>qos1``, bound to ``amq.topic``) is a quorum
queue with a member on each node, and the plugin PUBACKs a QoS 1 publish once that queue has
confirmed it (a majority of its members wrote it): RabbitMQ's MQTT figure is for replicated
storage, as Sluice's is. The AMQP quorum queue and the MQTT subscriber's queue are both declared
through the node the others joined, which the clients use, so that node leads them.
"""
from __future__ import annotations

import os
import platform
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from sluice.cli.dev_cluster import DevCluster, Ports

from . import mqtt_bench, mqtt_wire, rabbitmq_mqtt
from .amqp_bench import Broker, Load, Topology, measure
from .amqp_load import PubSpec, SubSpec
from .cluster_load import leader_of
from .processes import LOOPBACK, ServerUnavailable, free_ports
from .report import Target
from .sluice_server import serve_process

Log = Callable[[str], None]
QUORUM = "RabbitMQ 3-node quorum queue"
SINGLE = "Sluice single node"
GROUP = "Sluice 3-node group"
MQTT = "MQTT QoS 1, "
REPLICATED_GOAL = 0.6
"""Replicated throughput against single-node Sluice."""


@dataclass(frozen=True)
class Settings:
    rounds: int = 3
    messages: int = 20_000
    size: int = 1024
    window: int = 256
    prefetch: int = 100
    warmup: float = 0.2
    timeout: float = 300.0
    quick: bool = False

    @classmethod
    def smoke(cls) -> Settings:
        return cls(rounds=1, messages=2_000, timeout=120.0, quick=True)


@dataclass
class ClusterReport:
    title: str
    results: dict[str, list[float]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def median(self, name: str) -> float | None:
        found = self.results.get(name)
        return statistics.median(found) if found else None

    def targets(self) -> list[Target]:
        group, quorum, single = (self.median(name) for name in (GROUP, QUORUM, SINGLE))
        mqtt_group, mqtt_quorum, mqtt_single = (self.median(MQTT + name) for name in (GROUP, QUORUM, SINGLE))
        found = []
        if mqtt_group and mqtt_single:
            found.append(Target("MQTT QoS 1: Sluice group / single node", f"{mqtt_group / mqtt_single:.2f}x",
                                f">= {REPLICATED_GOAL:.2f}x", mqtt_group / mqtt_single >= REPLICATED_GOAL))
        if mqtt_group and mqtt_quorum:
            found.append(Target("MQTT QoS 1: Sluice group / RabbitMQ quorum", f"{mqtt_group / mqtt_quorum:.2f}x",
                                ">= 1.00x", mqtt_group / mqtt_quorum >= 1.0))
        if group and quorum:
            found.append(Target("Sluice group / RabbitMQ quorum queue", f"{group / quorum:.2f}x", ">= 1.00x",
                                group / quorum >= 1.0))
        if group and single:
            found.append(Target("Sluice group / Sluice single node", f"{group / single:.2f}x",
                                f">= {REPLICATED_GOAL:.2f}x", group / single >= REPLICATED_GOAL))
        return found

    def render(self) -> str:
        lines = [self.title, ""]
        width = max((len(name) for name in self.results), default=0)
        for name, values in self.results.items():
            runs = ", ".join(f"{value:,.0f}" for value in values)
            lines.append(f"  {name:<{width}} {statistics.median(values):>9,.0f} msg/s   (runs: {runs})")
        lines.append("")
        targets = self.targets()
        width = max((len(target.name) for target in targets), default=0)
        for target in targets:
            lines.append(f"  {target.name:<{width}} {target.value:>7}  goal {target.goal:<8} "
                         f"{'PASS' if target.passed else 'MISS'}")
        lines += [f"  note: {note}" for note in self.notes]
        return "\n".join(lines)


def one_queue(settings: Settings, tag: str, quorum: bool) -> Load:
    name = f"cluster-bench-{tag}"
    arguments = {"x-queue-type": "quorum"} if quorum else {}
    return Load(Topology("", "direct", {}, (name,), arguments),
                [PubSpec("", (name,), settings.messages, settings.size, settings.window)],
                [SubSpec((name,), settings.messages, settings.prefetch, settings.warmup)])


def run_section(settings: Settings, workdir: Path, log: Log) -> ClusterReport:
    mqtt_settings = _mqtt_settings(settings)
    report = ClusterReport(
        f"cluster benchmark: {os.cpu_count()} CPUs, Python {platform.python_version()}; AMQP 0-9-1 through "
        f"pika, {settings.size}-byte persistent messages, confirms (window {settings.window}), manual acks "
        f"(prefetch {settings.prefetch}), {settings.messages:,} messages per run; MQTT 3.1.1 QoS 1 fan-in, "
        f"{mqtt_settings.publishers} publishers (window {mqtt_settings.window}) -> 1 subscriber with a persistent "
        f"session (clean session 0), {mqtt_settings.size}-byte payloads, {mqtt_settings.warmup:g} s warm-up then "
        f"{mqtt_settings.measured:g} s measured; {settings.rounds} round(s); msg/s delivered to the consumer "
        "after warm-up, medians")
    with ExitStack() as stack:
        single, single_mqtt = _single(stack, workdir, log, report)
        group, group_mqtt = _group(stack, workdir, log, report)
        rabbit, rabbit_mqtt = _rabbit_cluster(stack, workdir, log, report)
        brokers = [broker for broker in (rabbit, single, group) if broker is not None]
        every_mqtt = [(MQTT + QUORUM, "rq", rabbit_mqtt), (MQTT + SINGLE, "s1", single_mqtt),
                      (MQTT + GROUP, "g3", group_mqtt)]
        mqtt = [(name, key, address) for name, key, address in every_mqtt if address is not None]
        for index in range(settings.rounds):
            for name, key, address in mqtt:
                _measure_mqtt(report, settings, mqtt_settings, name, key, address, index, log)
            for broker in brokers:
                tag = f"r{index}-{os.getpid()}-{broker.group}"
                try:
                    result = measure(broker, one_queue(settings, tag, broker.name == QUORUM), settings.timeout)
                except Exception as error:  # noqa: BLE001 - one failed run is reported, the rest go on
                    log(f"[cluster] {broker.name} round {index + 1} failed: {error!r}")
                    report.notes.append(f"{broker.name} round {index + 1} failed: {str(error).splitlines()[0]}")
                    continue
                report.results.setdefault(broker.name, []).append(result.msg_per_s)
                log(f"[cluster] round {index + 1}/{settings.rounds} {broker.name}: {result.msg_per_s:,.0f} msg/s "
                    f"(publishers {result.publish_msg_per_s:,.0f} confirmed/s)")
    if settings.quick:
        report.notes.append("--quick is a smoke run: its counts are too small for the figures to mean anything")
    return report


def _rabbit_cluster(stack: ExitStack, workdir: Path, log: Log,
                    report: ClusterReport) -> tuple[Broker | None, tuple[str, int] | None]:
    try:
        nodes = stack.enter_context(rabbitmq_mqtt.throwaway_mqtt_cluster(workdir / "rabbitmq", log))
    except (ServerUnavailable, OSError, subprocess.SubprocessError) as error:
        log(f"[cluster] RabbitMQ skipped: {error}")
        report.notes.append(f"RabbitMQ skipped: {str(error).splitlines()[0]}")
        return None, None
    report.notes.append(f"RabbitMQ {nodes[0].version}: three nodes clustered on this machine, a quorum queue "
                        "(x-queue-type quorum) led by the node the clients use")
    report.notes.append(
        "RabbitMQ MQTT: the rabbitmq_mqtt plugin on the same three nodes, mqtt.durable_queue_type = quorum, "
        f"mqtt.prefetch {rabbitmq_mqtt.PREFETCH}; the persistent subscriber's queue is a quorum queue (a member "
        "on each node, led by the node the clients use) bound to amq.topic, and a PUBACK waits for that queue's "
        "confirm (a majority of its members wrote the message)")
    return (Broker(QUORUM, nodes[0].url, nodes[0].pid, nodes[0].directory / "server-output.log"),
            (LOOPBACK, nodes[0].mqtt_port))


def _mqtt_settings(settings: Settings) -> mqtt_bench.Settings:
    return mqtt_bench.Settings.smoke() if settings.quick else mqtt_bench.Settings()


def _measure_mqtt(report: ClusterReport, settings: Settings, mqtt_settings: mqtt_bench.Settings, name: str,
                  key: str, address: tuple[str, int], index: int, log: Log) -> None:
    """One MQTT QoS 1 fan-in run; the subscriber keeps a persistent session, dropped afterwards."""
    load = mqtt_bench.fan_in(mqtt_settings, f"cluster-r{index}-{os.getpid()}-{key}", 1, clean=False)
    try:
        result = mqtt_bench.measure(mqtt_bench.Server(name, address, None), load, mqtt_settings)
    except Exception as error:  # noqa: BLE001 - one failed run is reported, the rest go on
        log(f"[cluster] {name} round {index + 1} failed: {error!r}")
        report.notes.append(f"{name} round {index + 1} failed: {str(error).splitlines()[0]}")
        return
    report.results.setdefault(name, []).append(result.msg_per_s)
    if result.lost:
        report.notes.append(f"{name} lost {result.lost:,} QoS 1 messages in round {index + 1}")
    log(f"[cluster] round {index + 1}/{settings.rounds} {name}: {result.msg_per_s:,.0f} msg/s "
        f"({result.lost:,} lost)")


def _single(stack: ExitStack, workdir: Path, log: Log, report: ClusterReport) -> tuple[Broker | None, tuple | None]:
    try:
        running = stack.enter_context(serve_process(workdir, wait_for=("--amqp-port", "--mqtt-port"),
                                                    prefix="sluice-single-", password=mqtt_wire.PASSWORD))
    except (ServerUnavailable, KeyError) as error:
        report.notes.append(f"single-node Sluice skipped: {str(error).splitlines()[0]}")
        return None, None
    port = running.ports["--amqp-port"]
    return (Broker(SINGLE, f"amqp://guest:guest@{LOOPBACK}:{port}/%2F", running.pid,
                   running.directory / "server-output.log"), (LOOPBACK, running.ports["--mqtt-port"]))


def _group(stack: ExitStack, workdir: Path, log: Log, report: ClusterReport) -> tuple[Broker | None, tuple | None]:
    native, admin, mqtt, ws, amqp, replication, etcd_client, etcd_peer = free_ports(8)
    group = DevCluster(Path(tempfile.mkdtemp(prefix="sluice-group-", dir=workdir)),
                       ports=Ports(native, admin, mqtt, ws, amqp, replication), etcd_ports=(etcd_client, etcd_peer),
                       extra_env={"SLUICE_STORE_PREALLOCATE": "eager", "SLUICE_AUTH_DEFAULT_USER": mqtt_wire.USERNAME,
                                  "SLUICE_AUTH_DEFAULT_PASSWORD": mqtt_wire.PASSWORD})
    try:
        started = time.monotonic()
        group.start()
        stack.callback(group.stop)
        leader = leader_of(group)
    except Exception as error:  # noqa: BLE001 - etcd missing or a node that did not start
        group.kill_all()
        log(f"[cluster] Sluice group skipped: {error}")
        report.notes.append(f"Sluice group skipped: {str(error).splitlines()[0]}")
        return None, None
    log(f"[cluster] Sluice group up after {time.monotonic() - started:.1f}s, leader {leader.name} on {leader.host}")
    report.notes.append("Sluice group: three nodes, min_insync 2, --flush sync on each; clients on the leader")
    return (Broker(GROUP, f"amqp://guest:guest@{leader.host}:{amqp}/%2F", leader.process.pid, leader.log_path),
            (leader.host, mqtt))
