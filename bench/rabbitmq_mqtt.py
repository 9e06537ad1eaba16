"""RabbitMQ's MQTT plugin for the MQTT benchmark: a throwaway node (``bench/rabbitmq.py``) with
``rabbitmq_mqtt`` enabled.

The plugin is enabled through the node's private enabled-plugins file, never a system one. Its
``rabbitmq.conf`` lines, one choice each:

- ``mqtt.listeners.tcp.1 = 127.0.0.1:PORT``: loopback only, on a free port of its own.
- ``default_user``/``default_pass``: the node's first boot creates the user the load generator
  logs in as (``mqtt_wire.USERNAME``/``PASSWORD``), with every permission on vhost ``/``;
  ``mqtt.allow_anonymous = false`` so the credentials are checked as a user's would be.
- ``mqtt.prefetch = 1000`` (default 10): QoS 1 deliveries a subscriber may have unacknowledged,
  as Mosquitto's ``max_inflight_messages 1000`` in ``bench/mosquitto.py``; at 10 the QoS 1
  scenarios would measure the plugin's window rather than its speed.

The plugin's defaults keep TCP_NODELAY on. Messages go through the ``amq.topic`` exchange into a
queue per subscription (classic queues in RabbitMQ 3.10; clean sessions make them exclusive).

``throwaway_mqtt_cluster`` is the cluster section's: ``rabbitmq.throwaway_cluster`` with the plugin
on every node and, besides ``mqtt.allow_anonymous = false`` and ``mqtt.prefetch``:

- ``mqtt.durable_queue_type = quorum`` (in the plugin's schema since 3.10): the queue of a QoS 1
  subscription in a persistent session (clean session 0) is a quorum queue, replicated to the
  three nodes, where it would otherwise be a durable classic queue on one node. Clean sessions
  keep their non-replicated classic queues, so the cluster section subscribes with clean session 0.
- No ``default_user``: the AMQP side of that section logs in as ``guest``, which a default user
  would replace; the MQTT user is added with ``rabbitmqctl add_user`` once the nodes are joined.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from . import mqtt_wire as wire
from . import rabbitmq
from .processes import LOOPBACK, free_ports

Log = Callable[[str], None]

PREFETCH = 1000


@dataclass(frozen=True)
class RabbitMqtt:
    port: int
    version: str
    pid: int
    """Leader of the node's process group."""
    output: Path


def config_lines(port: int) -> tuple[str, ...]:
    """The node's MQTT configuration (the module docstring says why each line)."""
    return (f"mqtt.listeners.tcp.1 = {LOOPBACK}:{port}",
            f"default_user = {wire.USERNAME}",
            f"default_pass = {wire.PASSWORD}",
            "mqtt.allow_anonymous = false",
            f"mqtt.prefetch = {PREFETCH}")


@contextmanager
def throwaway_mqtt_node(parent: Path, log: Log) -> Iterator[RabbitMqtt]:
    """Start a private RabbitMQ node with the MQTT plugin under ``parent``; stop it and delete its
    files on exit. Raises ``ServerUnavailable`` when RabbitMQ is not installed or does not start."""
    (port,) = free_ports(1)
    with rabbitmq.throwaway_node(parent, log, prefix="bench-mqtt", plugins=("rabbitmq_mqtt",),
                                 config=config_lines(port), listeners=(port,)) as node:
        log(f"RabbitMQ {node.version} MQTT plugin on {LOOPBACK}:{port}")
        yield RabbitMqtt(port, node.version, node.pid, node.directory / "server-output.log")


CLUSTER_CONFIG = ("mqtt.allow_anonymous = false", f"mqtt.prefetch = {PREFETCH}", "mqtt.durable_queue_type = quorum")
"""Every cluster node's MQTT configuration, besides its listener (the module docstring says why)."""


@contextmanager
def throwaway_mqtt_cluster(parent: Path, log: Log) -> Iterator[list[rabbitmq.RabbitNode]]:
    """Three private RabbitMQ nodes in one cluster with the MQTT plugin on each (``mqtt_port``),
    persistent sessions' QoS 1 queues made quorum queues, and the load generator's user; stopped
    and deleted on exit. Raises ``ServerUnavailable`` when RabbitMQ is not installed or does not
    start."""
    with rabbitmq.throwaway_cluster(parent, log, plugins=("rabbitmq_mqtt",), config=CLUSTER_CONFIG) as nodes:
        nodes[0].ctl("add_user", wire.USERNAME, wire.PASSWORD)
        nodes[0].ctl("set_permissions", "-p", "/", wire.USERNAME, ".*", ".*", ".*")
        log(f"RabbitMQ {nodes[0].version} MQTT plugin on "
            + ", ".join(f"{LOOPBACK}:{node.mqtt_port}" for node in nodes))
        yield nodes
